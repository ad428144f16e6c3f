# The verbs of the project. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: help build demo-check test test-env-up test-env-down test-unit lint fmt crds crds-check chart-check images-check demo demo-down bench

help:
	@echo "make demo        a local region: three new nodes onboarded to Active (make demo-down stops it)"
	@echo "make demo-check  the demo, non-interactive: exits (and tears down) once the nodes are Active"
	@echo "make test        run the whole test suite (brings the test ground up and down; HV_TEST_ORDER=random|reverse|cargo, HV_TEST_SEED)"
	@echo "make test-env-up / test-env-down   the real peers on loopback, by themselves"
	@echo "make test-unit   only the tests that need no peer"
	@echo "make lint        rustfmt check and clippy -D warnings"
	@echo "make crds        regenerate deploy/crds/ from coordinator/src/api"
	@echo "make crds-check  fail if deploy/crds/ (or the chart's copy in files/crds/) differs from the Rust types"
	@echo "make chart-check lint and render deploy/helm/hv with real Helm, check every object against the API types"
	@echo "make images-check the Containerfiles' runtime packages against the libraries the binaries link"
	@echo "make bench       print the benchmark figures"
	@echo "make build       build every crate and target"

build:
	$(CARGO) build --workspace --all-targets

test:
	bash tests/env/run-tests.sh

test-env-up:
	bash tests/env/up.sh

test-env-down:
	bash tests/env/down.sh

test-unit:
	$(CARGO) test --workspace --all-targets -- --skip ground::

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# The chart's copy is templated (templates/crds.yaml), so that upgrades upgrade
# the CRDs: it lives in files/crds/, not in crds/ (which Helm never upgrades).
CHART_CRDS := deploy/helm/hv/files/crds

crds:
	$(CARGO) run -q -p hv-coordinator --bin crdgen -- deploy/crds
	rm -f $(CHART_CRDS)/*.yaml
	cp deploy/crds/*.yaml $(CHART_CRDS)/

crds-check:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(CARGO) run -q -p hv-coordinator --bin crdgen -- "$$tmp" >/dev/null; \
	if ! diff -ru deploy/crds "$$tmp" || ! diff -ru deploy/crds $(CHART_CRDS); then \
	  echo "deploy/crds/ or the chart's $(CHART_CRDS)/ drifted from coordinator/src/api: run 'make crds' and commit the result" >&2; exit 1; \
	fi; echo "deploy/crds/ and the chart's $(CHART_CRDS)/ match the Rust types"

chart-check:
	bash deploy/helm/check.sh

images-check: build
	bash deploy/images/check.sh

demo:
	bash tests/env/demo.sh

demo-check:
	HV_DEMO_ONESHOT=1 bash tests/env/demo.sh

demo-down:
	HV_ENV_DIR=$(CURDIR)/.hv-demo bash tests/env/down.sh

# Fencing is timed with the kubelet's Lease of the tests (8 s: a dead host's
# kubelet vetoes for half of it); the rest on 600 s Leases, which 5,000
# simulated Nodes can renew.
bench:
	$(CARGO) run -q --release -p hv-coordinator --example bench_decide
	@echo
	$(CARGO) build -q --release -p hv-ceph-probe
	$(CARGO) build -q --workspace --bins --examples
	$(CARGO) build -q --release -p hv-coordinator --bin hv-coordinator
	bash tests/env/up.sh
	$(CARGO) run -q -p hv-tests --example bench_fencing && $(CARGO) run -q -p hv-tests --example bench_rack && $(CARGO) run -q -p hv-tests --example bench_power; rc=$$?; bash tests/env/down.sh; [ $$rc = 0 ] || exit $$rc
	HV_NODE_LEASE_SECONDS=600 bash tests/env/up.sh
	$(CARGO) bench -q -p hv-agent --bench agent && $(CARGO) run -q -p hv-tests --example bench_eviction && $(CARGO) run -q -p hv-tests --example bench_health && HV_BIN_DIR=$(CURDIR)/target/release $(CARGO) run -q -p hv-tests --example bench_scale; rc=$$?; bash tests/env/down.sh; exit $$rc
