# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

MODEL_REPOSITORY ?= model_repository
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
PYTEST_ARGS ?=

.PHONY: install build demo serve test check clean loadtest loadtest-distributed benchmark soak

# Every extra of pyproject.toml (client, serve, build, loadtest, test), each version
# pinned in constraints.txt.
$(INSTALLED): constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet pip==25.3 setuptools==84.2.1
	$(PY) -m pip install --quiet --no-build-isolation -c constraints.txt -e ".[all]"
	# The client extra's wheels, kept for tests that install it into a fresh venv offline.
	$(PY) -m pip wheel --quiet -c constraints.txt -w $(VENV)/wheelhouse ".[client]" setuptools==84.2.1
	rm -f $(VENV)/wheelhouse/tritonstack-*.whl
	touch $@

install: $(INSTALLED)

# Rewrites only what changed; the ONNX export is skipped while its inputs are unchanged.
build: $(INSTALLED)
	$(PY) build_pipelines.py build --out $(MODEL_REPOSITORY)

demo: build
	$(PY) clients/demo.py --model-repository $(MODEL_REPOSITORY)

# Loopback unless SERVE_HOST says otherwise (not HOST: shells set that to the hostname); admin APIs need $$TRITONSTACK_ADMIN_KEY in the
# header tritonstack-admin-key (SERVE_ARGS=--open-apis lifts that; see README, Security).
SERVE_HOST ?= 127.0.0.1
SERVE_ARGS ?=

serve: build
	$(PY) -m tritonstack.serve --model-repository $(MODEL_REPOSITORY) --host $(SERVE_HOST) \
		--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) $(SERVE_ARGS)

test: build
	$(PY) build_pipelines.py check $(MODEL_REPOSITORY)
	$(PY) -m pytest $(PYTEST_ARGS)

# Load tests: bounded (users, seconds, requests), loopback; start a server unless
# LOADTEST_ARGS names one (--url/--grpc-url/--metrics-url). Report in reports/.
LOADTEST_ARGS ?=
LOADTEST_WORKERS ?= 2
BENCHMARK_ARGS ?= --quick

loadtest: build
	$(PY) -m loadtests.run $(LOADTEST_ARGS)

loadtest-distributed: build
	$(PY) -m loadtests.run --workers $(LOADTEST_WORKERS) $(LOADTEST_ARGS)

benchmark: build
	$(PY) loadtests/benchmark.py $(BENCHMARK_ARGS) --out reports/benchmark.json

# Soak: mixed good/bad images over HTTP and gRPC for DURATION seconds on a server
# of its own (loopback); fails on a failed valid request or >2% RSS growth after the
# first quarter (least-squares line, judged over 600 s or more). A 30-minute run's
# figures: docs/memory.md (the DALI stub still above 2% with the soak's mix: open).
DURATION ?= 1800
SOAK_ARGS ?=

soak: build
	$(PY) -m loadtests.soak --duration $(DURATION) --model-repository $(MODEL_REPOSITORY) \
		--out reports/soak.json $(SOAK_ARGS)

clean:
	rm -rf $(VENV) reports build
	rm -f $(MODEL_REPOSITORY)/*/1/model.onnx $(MODEL_REPOSITORY)/*/1/.*.fingerprint
