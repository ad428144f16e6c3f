# The verbs of the project. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: help build test lint fmt crds crds-check demo bench

help:
	@echo "make demo        run the system locally (today: the lifecycle core on simulated nodes)"
	@echo "make test        run the whole test suite"
	@echo "make lint        rustfmt check and clippy -D warnings"
	@echo "make crds        regenerate deploy/crds/ from coordinator/src/api"
	@echo "make crds-check  fail if deploy/crds/ differs from the Rust types"
	@echo "make bench       print the benchmark figures"
	@echo "make build       build every crate and target"

build:
	$(CARGO) build --workspace --all-targets

test:
	$(CARGO) test --workspace --all-targets

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

crds:
	$(CARGO) run -q -p hv-coordinator --bin crdgen -- deploy/crds

crds-check:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(CARGO) run -q -p hv-coordinator --bin crdgen -- "$$tmp" >/dev/null; \
	if ! diff -ru deploy/crds "$$tmp"; then \
	  echo "deploy/crds/ drifted from coordinator/src/api: run 'make crds' and commit the result" >&2; exit 1; \
	fi; echo "deploy/crds/ matches the Rust types"

demo:
	$(CARGO) run -q -p hv-coordinator --example walkthrough

bench:
	$(CARGO) run -q --release -p hv-coordinator --example bench_decide
