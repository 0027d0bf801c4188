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
KEEP ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# --- environment -----------------------------------------------------------------

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

.PHONY: venv
venv: $(VENV)/.installed ## create .venv with the operator and its test tools

.PHONY: controlplane
controlplane: ## build etcd + kube-apiserver from Go modules (once)
	@scripts/build-go-tools.sh controlplane

.PHONY: vcsim
vcsim: ## build govmomi's vSphere simulator with our fault injection, and govc (once)
	@scripts/build-go-tools.sh vcsim

.PHONY: tools
tools: venv controlplane vcsim

# --- quality ---------------------------------------------------------------------

.PHONY: lint
lint: venv ## ruff, mypy --strict, import layers
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
test: tools lint manifests-check ## everything: lint, unit, control plane, vcsim and e2e suites
	$(PY) -m pytest $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

.PHONY: test-vcsim
test-vcsim: venv vcsim ## vSphere layer against the simulator
	$(PY) -m pytest tests/vcsim $(PYTEST_ARGS)

.PHONY: test-e2e
test-e2e: tools ## the real operator process against control plane + vcsim + actors
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

.PHONY: bench
bench: tools ## run benchmarks, write bench/results/latest.md
	$(PY) -m bench

# --- demo and operator habits --------------------------------------------------

.PHONY: demo
demo: tools ## control plane + vcsim + actors + operator; KEEP=1 leaves it running
	$(PY) -m sim.demo $(if $(KEEP),--keep,)

.PHONY: run
run: venv ## run the operator against the active kubeconfig
	$(PY) -m agentforge run

.PHONY: version
version: venv
	$(PY) -m agentforge version

# --- shipping: config/ manifests, image, cluster install (the Go operator's habits) ----
# install/uninstall/deploy/undeploy use scripts/deploy.py (the operator's own Kubernetes
# client, server-side apply): neither kubectl nor kustomize is needed, only a kubeconfig
# ($KUBECONFIG or ~/.kube/config; CONTEXT=name picks a context).

CONTEXT ?=
FORCE ?=
DEPLOY := $(PY) -m scripts.deploy
DEPLOY_FLAGS := $(if $(CONTEXT),--context $(CONTEXT),)

.PHONY: lint-shipping
lint-shipping: venv ## config/ valid offline, Containerfile (hadolint), scripts/, generated docs current
	$(PY) -m scripts.validate_manifests
	$(VENV)/bin/hadolint --config .hadolint.yaml Containerfile
	$(VENV)/bin/ruff check scripts
	$(VENV)/bin/ruff format --check scripts
	$(VENV)/bin/mypy --strict --ignore-missing-imports --follow-imports=silent scripts
	$(PY) -m scripts.settings_reference --check

lint: lint-shipping

.PHONY: fmt-shipping
fmt-shipping: venv
	$(VENV)/bin/ruff check --fix scripts
	$(VENV)/bin/ruff format scripts

fmt: fmt-shipping

.PHONY: docs
docs: venv ## regenerate the flag/env table in docs/configuration.md (API reference: make manifests)
	$(PY) -m scripts.settings_reference

.PHONY: install
install: venv ## apply the CRDs to the cluster of the active kubeconfig
	$(DEPLOY) install $(DEPLOY_FLAGS)

.PHONY: uninstall
uninstall: venv ## delete the CRDs (refused while pools exist; FORCE=1 overrides)
	$(DEPLOY) uninstall $(DEPLOY_FLAGS) $(if $(FORCE),--force,)

.PHONY: deploy
deploy: venv ## apply config/default (CRDs, RBAC, Deployment, Service, NetworkPolicy) with IMG
	$(DEPLOY) deploy --image $(IMG) $(DEPLOY_FLAGS)

.PHONY: undeploy
undeploy: venv ## delete what deploy applied, except the CRDs
	$(DEPLOY) undeploy $(DEPLOY_FLAGS)

.PHONY: deploy-monitoring
deploy-monitoring: venv ## apply config/prometheus (ServiceMonitor, alerts, Grafana dashboard)
	$(DEPLOY) deploy-monitoring $(DEPLOY_FLAGS)

.PHONY: undeploy-monitoring
undeploy-monitoring: venv
	$(DEPLOY) undeploy-monitoring $(DEPLOY_FLAGS)

.PHONY: render
render: venv ## print config/default as deploy would apply it (IMG=...), e.g. for kubectl apply -f -
	@$(PY) -m scripts.deploy render config/default --image $(IMG)

.PHONY: image
image: ## build the operator image IMG with podman, buildah or docker (fails plainly without one)
	@scripts/build-image.sh $(IMG)
