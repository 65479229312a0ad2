# kart's two entry points for a new user, both starting from a fresh machine:
#   make local   set up, build, and train a tiny search agent on this CPU (`kart local`)
#   make test    set up, build, and run every test
SHELL := /bin/bash
CARGO_FLAGS := --release --locked
ENV := source scripts/env.sh &&

.PHONY: setup build local test
setup:
	bash scripts/setup.sh

build: setup
	$(ENV) cargo build $(CARGO_FLAGS) --workspace --bins

local: build
	$(ENV) "$${CARGO_TARGET_DIR:-target}/release/kart" local $(ARGS)

test: build
	$(ENV) cargo test $(CARGO_FLAGS) --workspace
