# kart's two entry points for a new user, both starting from a fresh machine:
#   make local   set up, build, and train a tiny search agent on this CPU (`kart local`)
#   make test    set up, build, and run every test, then each fuzz target briefly (fuzz-smoke)
SHELL := /bin/bash
CARGO_FLAGS := --release --locked
ENV := source scripts/env.sh &&

.PHONY: setup build local test fuzz-smoke
setup:
	bash scripts/setup.sh

build: setup
	$(ENV) cargo build $(CARGO_FLAGS) --workspace --bins

local: build
	$(ENV) "$${CARGO_TARGET_DIR:-target}/release/kart" local $(ARGS)

test: build
	$(ENV) cargo test $(CARGO_FLAGS) --workspace
	$(MAKE) --no-print-directory fuzz-smoke

# Every cargo-fuzz target of fuzz/ for FUZZ_SECONDS, from its seeds and the corpus kept so far:
# on nightly with AddressSanitizer, else on stable without a sanitizer. Builds into the cargo
# target folder's fuzz/ (kept with the cache); a crash fails with its input in fuzz/artifacts/,
# and so does an input that runs past 60 s (a hang, not a loaded machine's slow run).
FUZZ_SECONDS ?= 15
fuzz-smoke: setup
	cd fuzz && if rustup run nightly rustc --version >/dev/null 2>&1; then fuzz="cargo +nightly fuzz"; sanitizer=address; \
	else echo "fuzz-smoke: no nightly toolchain: running without AddressSanitizer"; fuzz="cargo fuzz"; sanitizer=none; fi; \
	flags="--sanitizer $$sanitizer --target-dir $${CARGO_TARGET_DIR:-$(CURDIR)/target}/fuzz"; \
	$$fuzz build $$flags && for target in $$($$fuzz list); do \
	  mkdir -p corpus/$$target && $$fuzz run $$flags $$target corpus/$$target $$(ls -d seeds/$$target 2>/dev/null) \
	    -- -max_total_time=$(FUZZ_SECONDS) -timeout=60 -print_final_stats=1 || exit 1; \
	done
