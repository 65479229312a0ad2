# kart's two entry points for a new user, both starting from a fresh machine:
#   make local   set up, build, and train a tiny search agent on this CPU (`kart local`)
#   make test    set up, build, and run every test, then each fuzz target briefly (fuzz-smoke)
SHELL := /bin/bash
CARGO_FLAGS := --release --locked
ENV := source scripts/env.sh &&

.PHONY: setup setup-local build local test test-build test-run control-plane images vllm mdbook lint fuzz-build fuzz-smoke
setup:
	bash scripts/setup.sh

build: setup
	$(ENV) cargo build $(CARGO_FLAGS) --workspace --bins

# Only what `kart local` needs: the venv with PyTorch, and the `kart` binary alone. ARGS are kart
# local's flags (ARGS=--quick for a first look in about three minutes).
setup-local:
	bash scripts/setup.sh --local

local: setup-local
	$(ENV) cargo build $(CARGO_FLAGS) -p kart --bin kart
	$(ENV) "$${CARGO_TARGET_DIR:-target}/release/kart" local $(ARGS)

# Three steps, each with work at a lower priority beside it that takes the CPU the other leaves
# idle: set-up (downloads) and one cargo build of the binaries and the tests, with the control
# plane's and its node's Go build, the real vLLM's set-up and mdBook's install beside them (all
# four at once: none waits for another's slot); the tests (waiting on servers and clusters a good
# part of the time), with the fuzz targets' build and kart's images (the real node's test waits for
# them) beside them; then the fuzz targets (one core each, one after another) with clippy beside
# them (a check build of its own, which would hold the target folder's lock if it ran beside the
# tests).
test:
	$(MAKE) --no-print-directory -j4 test-build control-plane vllm mdbook
	$(MAKE) --no-print-directory -j3 test-run fuzz-build images
	$(MAKE) --no-print-directory -j2 fuzz-smoke lint

# One build of the binaries and the tests together: built apart, the tests' dev-dependencies
# change the features of shared dependencies (tokio, hyper, …) and every crate above them is
# compiled twice.
test-build: setup
	$(ENV) cargo build $(CARGO_FLAGS) --workspace --bins --tests

# The tests run kart and kart-operator from the target folder (and in images of them), the control
# plane and its node, and vLLM.
test-run: test-build control-plane vllm mdbook
	$(ENV) cargo test $(CARGO_FLAGS) --workspace --no-fail-fast

# The control plane of the operator tests, Kueue's manager and KWOK (cached outside the clone;
# `up` builds them too).
control-plane:
	nice -n 10 bash scripts/control-plane.sh build >/dev/null
	nice -n 10 bash scripts/control-plane.sh build-kueue >/dev/null
	nice -n 10 bash scripts/control-plane.sh build-kwok >/dev/null

# The real node's own binaries (containerd, runc, the storage provisioner) and kart's worker and
# operator images (and the node's) from deploy/Dockerfile.*, for the real node's test (cached
# outside the clone: scripts/control-plane.sh build-node, scripts/images.sh).
images: test-build control-plane
	nice -n 10 bash scripts/control-plane.sh build-node >/dev/null
	nice -n 10 bash scripts/images.sh all >/dev/null

# clippy over every target, warnings refused (CI's lint).
lint: test-build
	$(ENV) nice -n 10 cargo clippy $(CARGO_FLAGS) --workspace --all-targets -- -D warnings

# mdBook, which builds the book in docs/ for its test (tests/tests/book.rs), into ~/.cargo/bin once:
# without its server, watcher and search index, which the test needs none of (`mdbook build docs`
# writes docs/book/).
MDBOOK_VERSION := 0.5.4
mdbook: setup
	@mdbook --version 2>/dev/null | grep -q "v$(MDBOOK_VERSION)" || \
	  nice -n 10 env -u CARGO_TARGET_DIR cargo install --locked --quiet mdbook --version $(MDBOOK_VERSION) \
	    --no-default-features

# vLLM's CPU build in a venv of its own and the fixture models it serves (for the tests only).
vllm: setup
	nice -n 10 bash scripts/vllm/setup.sh

# Every cargo-fuzz target of fuzz/ for FUZZ_SECONDS, from its seeds and the corpus kept so far:
# on nightly with AddressSanitizer, else on stable without a sanitizer. Builds into the cargo
# target folder's fuzz/ (kept with the cache); a crash fails with its input in fuzz/artifacts/,
# and so does an input that runs past 60 s (a hang, not a loaded machine's slow run).
FUZZ_SECONDS ?= 10
NIGHTLY := $(shell rustup run nightly rustc --version >/dev/null 2>&1 && echo yes)
FUZZ := $(if $(NIGHTLY),cargo +nightly fuzz,cargo fuzz)
FUZZ_FLAGS = --sanitizer $(if $(NIGHTLY),address,none) --target-dir $${CARGO_TARGET_DIR:-$(CURDIR)/target}/fuzz
fuzz-build: setup
	@[ -n "$(NIGHTLY)" ] || echo "fuzz: no nightly toolchain: building without AddressSanitizer"
	cd fuzz && nice -n 10 $(FUZZ) build $(FUZZ_FLAGS)

fuzz-smoke: fuzz-build
	cd fuzz && for target in $$($(FUZZ) list); do \
	  mkdir -p corpus/$$target && $(FUZZ) run $(FUZZ_FLAGS) $$target corpus/$$target $$(ls -d seeds/$$target 2>/dev/null) \
	    -- -max_total_time=$(FUZZ_SECONDS) -timeout=60 -print_final_stats=1 || exit 1; \
	done
