# Every target creates the virtualenv and installs the project when needed, so a fresh
# clone needs nothing but python3.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

ADDRESS ?= 127.0.0.1:8443
EXAMPLE ?= examples/admission/incident-1-pinned-deployment.json

.PHONY: run check certs test docs lint bench lock clean deploy-certs deploy-render deploy-vap promtool monitoring-test

OVERLAY ?= self-signed
SELF_SIGNED := deploy/overlays/self-signed

# Its output goes to stderr, so that a target that prints (deploy-render) prints only that.
$(STAMP): pyproject.toml
	@echo "installing admit-guard into $(VENV)" >&2
	@python3 -m venv $(VENV) >&2
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' >&2
	@touch $(STAMP)

# The webhook over HTTPS against the bundled example cluster, with dev certificates.
run: $(STAMP) certs/tls.crt
	@echo "admit-guard on https://$(ADDRESS) (Ctrl-C stops it). In another shell, try:"
	@echo "  curl --cacert certs/ca.crt -H 'Content-Type: application/json' \\"
	@echo "    --data-binary @$(EXAMPLE) https://$(ADDRESS)/validate"
	$(BIN)/admit-guard serve --cluster examples/cluster --cert-dir certs --bind $(ADDRESS)

# The dry run on the bundled cluster; some examples are denied on purpose (exit 1).
check: $(STAMP)
	$(BIN)/admit-guard check -f examples/workloads --cluster examples/cluster || [ $$? -eq 1 ]

# A new serving certificate from the existing CA, or a CA and certificate when there is none.
certs: $(STAMP)
	$(BIN)/admit-guard certs --out certs $$([ -f certs/ca.key ] && echo --renew)

certs/tls.crt: | $(STAMP)
	$(BIN)/admit-guard certs --out certs > /dev/null

# mkdocs --strict: a broken link or anchor in docs/ fails the build (site/ is git-ignored).
# Not --quiet: it hides the warnings from --strict too, and the build passes.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --site-dir site
	$(BIN)/pytest

# docs/reference/: the pages generated from the registries (a test fails when they are stale).
docs: $(STAMP)
	$(BIN)/python -m webhook.docs

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP) bench-tools
	$(BIN)/python bench/engine_bench.py
	$(BIN)/python bench/http_bench.py
	$(BIN)/python bench/floor_bench.py
	$(BIN)/python bench/cpu_bench.py
	$(BIN)/python bench/informer_bench.py
	$(BIN)/python bench/audit_bench.py
	$(BIN)/python bench/snapshot_bench.py
	$(BIN)/python bench/quantity_bench.py
	$(BIN)/python bench/slow_clients_bench.py
	$(BIN)/python bench/idle_connections_bench.py
	$(BIN)/python bench/memory_bench.py
	$(BIN)/python bench/replica_memory_bench.py
	$(BIN)/python bench/check_bench.py
	$(BIN)/python bench/binding_bench.py
	$(BIN)/python bench/slow_lease_bench.py
	$(BIN)/python bench/dra_bench.py
	$(BIN)/python bench/dra_index_bench.py
	$(BIN)/python bench/workload_table_bench.py
	$(BIN)/python bench/incidents_bench.py
	$(BIN)/python bench/topology_bench.py

# requirements.lock, which the image installs: every runtime dependency pinned with its hashes,
# resolved from the default package index within pyproject.toml's bounds. Local pip settings
# (mirrors, find-links, constraints) are left out so that no local path or file reaches it.
lock: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,lock]'
	env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
	  $(BIN)/pip-compile --quiet --upgrade --generate-hashes --strip-extras --allow-unsafe \
	  --no-emit-index-url --no-emit-find-links --output-file requirements.lock pyproject.toml

# C load generators for the floor bench (Debian's wrk and nghttp2-client): a Python client
# would share the server's two cores.
bench-tools:
	@command -v wrk > /dev/null && command -v h2load > /dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get install -y --no-install-recommends wrk nghttp2-client \
	  || { $$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends wrk nghttp2-client; }; } \
	  || echo "wrk/h2load missing: floor_bench measures with its Python client" >&2

# promtool (Debian's prometheus package) for the alert rules' unit tests.
promtool:
	@command -v promtool > /dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get install -y --no-install-recommends prometheus \
	  || { $$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends prometheus; }; } \
	  || { echo "promtool missing: install Debian's 'prometheus' package" >&2; exit 1; }

# deploy/monitoring: promtool unit tests of the alerts; alert and dashboard metric names.
monitoring-test: $(STAMP) promtool
	$(BIN)/pytest tests/e2e/test_monitoring.py

# TLS for the self-signed overlay; its kustomization copies ca.crt into the caBundles.
deploy-certs: $(SELF_SIGNED)/certs/tls.crt

$(SELF_SIGNED)/certs/tls.crt: | $(STAMP)
	@$(BIN)/admit-guard certs --service admit-guard --namespace admit-guard --out $(SELF_SIGNED)/certs >&2

# Print the manifests of one overlay, and nothing else: make deploy-render OVERLAY=cert-manager > out.yaml
deploy-render: $(SELF_SIGNED)/certs/tls.crt
	@kubectl kustomize deploy/overlays/$(OVERLAY)

deploy-vap: $(STAMP)
	$(BIN)/admit-guard vap --config deploy/base/config.yaml > deploy/overlays/static-policies/policies.yaml

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build site *.egg-info
