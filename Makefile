# agent-forge: the two set-up commands on a fresh machine are `make demo` and `make test`.
# Everything else here is a building block of those two, or an operator habit kept from
# the Go operator (install/deploy/run/manifests).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := .build/bin
IMG ?= agent-forge:dev
PYTEST_ARGS ?=
# pytest-xdist workers: each starts its own control plane, vcsim and operators on its own
# ports and temp dirs; worksteal keeps both busy when a long e2e test lands late
PYTEST_JOBS ?= 2
PYTEST := $(PY) -m pytest -n $(PYTEST_JOBS) --dist worksteal
KEEP ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## list targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

# --- environment -----------------------------------------------------------------
# The virtualenv holds exactly the locked sets (requirements-dev.lock: runtime + test and
# lint tools; requirements-build.lock: the build backend), every file checked against its
# sha256 hash; the operator itself is installed editable on top, without dependencies.

$(VENV)/.installed: pyproject.toml requirements-dev.lock requirements-build.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements-build.lock -r requirements-dev.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	@touch $@

.PHONY: venv
venv: $(VENV)/.installed ## create .venv with the operator and its locked test tools

.PHONY: lock
lock: venv ## re-resolve requirements*.lock after a pyproject.toml change (keeps pins), and the SBOM
	$(PY) -m scripts.lock

.PHONY: lock-upgrade
lock-upgrade: venv ## move locked pins to the newest releases (PACKAGE=name: only that one)
	$(PY) -m scripts.lock $(if $(PACKAGE),--upgrade-package $(PACKAGE),--upgrade)

.PHONY: sbom
sbom: venv ## write requirements.cdx.json, the CycloneDX SBOM of requirements.lock
	$(PY) -m scripts.lock --sbom

.PHONY: floors
floors: venv ## unit + a few control-plane tests on the oldest releases pyproject allows (constraints-floors.txt)
	$(VENV)/bin/uv venv --quiet --allow-existing --python $(PYTHON) .venv-floors
	$(VENV)/bin/uv pip install --quiet --python .venv-floors -e '.[dev]' -c constraints-floors.txt
	.venv-floors/bin/python -m pytest tests/unit --ignore=tests/unit/test_lock.py \
	  tests/kube/test_informer.py tests/kube/test_client.py tests/kube/test_process.py \
	  tests/vcsim/test_datastore.py $(PYTEST_ARGS)

.PHONY: controlplane
controlplane: ## build etcd + kube-apiserver from Go modules (once)
	@scripts/build-go-tools.sh controlplane

.PHONY: vcsim
vcsim: ## build govmomi's vSphere simulator with our fault injection, and govc (once)
	@scripts/build-go-tools.sh vcsim

.PHONY: tools
tools: venv controlplane vcsim packaging-tools ## build every Go tool the tests use (control plane, vcsim, kustomize, helm, olm-validate)

# --- quality ---------------------------------------------------------------------

.PHONY: lint
lint: venv ## ruff, mypy --strict, import layers; then shipping checks (lint-shipping)
	$(VENV)/bin/ruff check agentforge sim tests bench
	$(VENV)/bin/ruff format --check agentforge sim tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

.PHONY: fmt
fmt: venv ## apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff check --fix agentforge sim tests bench
	$(VENV)/bin/ruff format agentforge sim tests bench

.PHONY: manifests
manifests: venv ## regenerate config/crd and config/rbac from the code
	$(PY) -m agentforge manifests --output config

.PHONY: manifests-check
manifests-check: venv ## fail when committed manifests differ from the code
	$(PY) -m agentforge manifests --output config --check

# --- tests -----------------------------------------------------------------------

.PHONY: test
test: tools lint manifests-check ## everything: lint, unit, packaging, control plane, vcsim and e2e suites
	$(PYTEST) $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv ## unit tests only: the virtualenv alone, no Go-built tool
	$(PYTEST) tests/unit $(PYTEST_ARGS)

.PHONY: test-packaging
test-packaging: venv controlplane packaging-tools ## config/ through kustomize and kubectl, the bundle, the chart
	$(PYTEST) tests/packaging $(PYTEST_ARGS)

.PHONY: test-vcsim
test-vcsim: venv vcsim ## vSphere layer against the simulator
	$(PYTEST) tests/vcsim $(PYTEST_ARGS)

.PHONY: test-e2e
test-e2e: tools ## the real operator process against control plane + vcsim + actors
	$(PYTEST) tests/e2e $(PYTEST_ARGS)

.PHONY: bench
bench: tools ## run benchmarks, write bench/results/latest.md
	$(PY) -m bench

# --- demo and operator habits --------------------------------------------------

.PHONY: demo
demo: venv controlplane vcsim ## control plane + vcsim + actors + operator; KEEP=1 leaves it running
	$(PY) -m sim.demo $(if $(KEEP),--keep,)

.PHONY: run
run: venv ## run the operator against the active kubeconfig
	$(PY) -m agentforge run

.PHONY: version
version: venv ## print the operator's version
	$(PY) -m agentforge version

# --- shipping: config/ manifests, image, bundle, chart, cluster install -----------------
# install/uninstall/deploy/undeploy use kubectl (KUBECTL=oc for OpenShift's client) with
# `apply -k --server-side`, as kubebuilder projects do; kubectl from PATH, else the one
# `make controlplane` builds. The image is set in a throw-away overlay
# (scripts/kustomize-overlay.sh), so the checkout stays clean and kustomize is not needed.
# CONTEXT=name picks a kubeconfig context.

CONTEXT ?=
CREDENTIAL_NAMESPACES ?=
FORCE ?=
PUSH ?=
PYTHON_IMAGE ?=
PLATFORMS ?= linux/amd64,linux/arm64
KUBECTL ?= $(or $(shell command -v kubectl 2>/dev/null),$(BIN)/kubectl)
KUBECTL_CMD = $(KUBECTL)$(if $(CONTEXT), --context=$(CONTEXT),)
APPLY = $(KUBECTL_CMD) apply --server-side --force-conflicts --field-manager=agent-forge-deploy
DELETE = $(KUBECTL_CMD) delete --ignore-not-found --wait=false
OVERLAY = scripts/kustomize-overlay.sh
# CREDENTIAL_NAMESPACES="a b": where the operator may read Secrets (docs/installation.md)
CREDENTIALS = $(foreach ns,$(CREDENTIAL_NAMESPACES), --credential-namespace $(ns))
GROUP := agent-forge.containeroo.ch

.PHONY: packaging-tools
packaging-tools: ## build kustomize, Helm and operator-framework's bundle validation from Go modules (once)
	@scripts/build-go-tools.sh kustomize helm olm-validate

.PHONY: lint-shipping
lint-shipping: venv packaging-tools ## config/, lock + SBOM + audit, Containerfile, bundle, chart, scripts/, docs
	$(PY) -m scripts.validate_manifests
	$(PY) -m scripts.lock --check
	$(PY) -m scripts.audit_lock
	$(VENV)/bin/hadolint --config .hadolint.yaml Containerfile
	$(PY) -m scripts.bundle --check
	$(BIN)/olm-validate -strict -k8s-version 1.27 bundle
	$(PY) -m scripts.chart --check
	$(BIN)/helm lint --strict charts/agent-forge
	$(BIN)/helm template agent-forge charts/agent-forge --namespace agent-forge-system > /dev/null
	$(VENV)/bin/ruff check scripts
	$(VENV)/bin/ruff format --check scripts
	$(VENV)/bin/mypy --strict --ignore-missing-imports --follow-imports=silent scripts
	$(PY) -m scripts.settings_reference --check

lint: lint-shipping

.PHONY: audit
audit: venv ## known vulnerabilities in requirements.lock (pip-audit; needs PyPI)
	$(PY) -m scripts.audit_lock --strict

.PHONY: fmt-shipping
fmt-shipping: venv ## apply ruff to scripts/
	$(VENV)/bin/ruff check --fix scripts
	$(VENV)/bin/ruff format scripts

fmt: fmt-shipping

.PHONY: docs
docs: venv ## regenerate the flag/env table in docs/configuration.md (API reference: make manifests)
	$(PY) -m scripts.settings_reference

.PHONY: bundle
bundle: venv ## regenerate the OLM bundle (bundle/) from config/ (IMG=... for the CSV's image)
	$(PY) -m scripts.bundle $(if $(filter command line,$(origin IMG)),--image $(IMG),)

.PHONY: bundle-check
bundle-check: venv packaging-tools ## bundle/ current with config/ and valid for operator-framework
	$(PY) -m scripts.bundle --check
	$(BIN)/olm-validate -strict -k8s-version 1.27 bundle

.PHONY: chart
chart: venv ## regenerate the Helm chart (charts/agent-forge) from config/
	$(PY) -m scripts.chart

.PHONY: install
install: ## apply the CRDs (config/crd) to the cluster of the active kubeconfig
	$(APPLY) -k config/crd

.PHONY: uninstall
uninstall: ## delete the CRDs (refused while pools or VsphereAgents exist; FORCE=1 overrides)
	@if [ -z "$(FORCE)" ]; then \
	  pools=$$($(KUBECTL_CMD) get vsphereagentpools.$(GROUP) -A -o name 2>/dev/null | wc -l); \
	  agents=$$($(KUBECTL_CMD) get vsphereagents.$(GROUP) -A -o name 2>/dev/null | wc -l); \
	  if [ "$$pools" -gt 0 ] || [ "$$agents" -gt 0 ]; then \
	    echo "error: $$pools VsphereAgentPool(s) and $$agents VsphereAgent(s) still exist. Deleting the CRDs deletes them too, and" >&2; \
	    echo "       without the operator their finalizers hold the deletion forever. Delete your VsphereAgentPools" >&2; \
	    echo "       while the operator runs (it removes their VMs per cleanupPolicy), or run" >&2; \
	    echo "       \`make uninstall FORCE=1\` to delete the CRDs anyway." >&2; \
	    exit 1; \
	  fi; \
	fi
	$(DELETE) -k config/crd

.PHONY: deploy
deploy: ## apply config/default (CRDs, RBAC, Deployment, Service, NetworkPolicy) with IMG and CREDENTIAL_NAMESPACES
	@overlay=$$($(OVERLAY) config/default --image $(IMG)$(CREDENTIALS)) && trap 'rm -rf "$$overlay"' EXIT && \
	  echo "$(APPLY) -k config/default  # image $(IMG)" && $(APPLY) -k "$$overlay"
	@$(if $(strip $(CREDENTIAL_NAMESPACES)),true,echo "note: no CREDENTIAL_NAMESPACES: the operator does not start until it may read credentials somewhere (docs/installation.md#credentials-namespaces)" >&2)

.PHONY: undeploy
undeploy: ## delete what deploy applied, except the CRDs (and with them your pools)
	@overlay=$$($(OVERLAY) config/default --without-crds$(CREDENTIALS)) && trap 'rm -rf "$$overlay"' EXIT && \
	  echo "$(DELETE) -k config/default  # without the CRDs" && $(DELETE) -k "$$overlay"
	@echo "CRDs kept (your pools with them); \`make uninstall\` removes them."

.PHONY: deploy-monitoring
deploy-monitoring: ## apply config/prometheus (ServiceMonitor, alerts, Grafana dashboard)
	$(APPLY) -k config/prometheus

.PHONY: undeploy-monitoring
undeploy-monitoring: ## delete what deploy-monitoring applied
	$(DELETE) -k config/prometheus

.PHONY: render
render: ## print config/default as deploy would apply it (IMG=..., CREDENTIAL_NAMESPACES=...)
	@overlay=$$($(OVERLAY) config/default --image $(IMG)$(CREDENTIALS)) && trap 'rm -rf "$$overlay"' EXIT && \
	  $(KUBECTL) kustomize "$$overlay"

.PHONY: image
image: ## build the operator image IMG with podman, buildah or docker (fails plainly without one)
	@PYTHON_IMAGE=$(PYTHON_IMAGE) scripts/build-image.sh $(if $(PUSH),--push,) $(IMG)

.PHONY: image-multiarch
image-multiarch: ## build IMG for linux/amd64 and linux/arm64 as one manifest list (PUSH=1 pushes)
	@PYTHON_IMAGE=$(PYTHON_IMAGE) scripts/build-image.sh --platforms $(PLATFORMS) $(if $(PUSH),--push,) $(IMG)
