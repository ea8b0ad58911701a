# DeployHub: `make run` starts the product, `make test` runs the whole suite.
#
# Two environments, built by one recipe (scripts/venv.sh): `.venv` is the product, what
# `make run` installs (the hub and a CPU device worker with every CPU backend auto mode
# uses); `.venv-test` adds the test tools (torch for export jobs, pytest, Playwright).
# `make test` builds both, so tests/test_default_install.py proves builds in `.venv` itself.
# `make lint` needs neither: `.venv-lint` holds the hub's web extra (the type checker's Django
# plugin imports the settings and the apps) and the lint extra: ruff, import-linter, mypy with
# django-stubs, djLint. `.ci/run` runs `make test`, whose first step is `make lint`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
export PYTHON
VENV := .venv
TEST_VENV := .venv-test
LINT_VENV := .venv-lint
PY := $(VENV)/bin/python
TEST_PY := $(TEST_VENV)/bin/python
EXTRAS_run := web,worker,openvino
EXTRAS_test := web,worker,openvino,torch,dev

.PHONY: run test test-fast bench bench-gpu conformance soak lint format demo-assets api-reference clean

$(VENV)/.installed-run: pyproject.toml scripts/venv.sh
	scripts/venv.sh $(VENV) $(EXTRAS_run) $@

$(TEST_VENV)/.installed-test: pyproject.toml scripts/venv.sh
	scripts/venv.sh $(TEST_VENV) $(EXTRAS_test) $@

# The lint tools at the versions the lint extra pins (spelt once, in pyproject.toml), beside the
# web extra: mypy's Django plugin (django-stubs) imports deployhub.settings and every app.
$(LINT_VENV)/.installed-lint: pyproject.toml scripts/venv.sh
	scripts/venv.sh $(LINT_VENV) web,lint $@

run: $(VENV)/.installed-run
	$(PY) manage.py run_embedded

# The checks first (make lint: a finding fails in seconds, in CI too: .ci/run is make test),
# then the suite. The suite runs from .venv-test; tests that must run in the product start
# .venv's Python. The live server answers each request in a thread of its own: a kept database
# connection would outlive its thread and pile up over a run, so tests open one per request.
test: $(VENV)/.installed-run $(TEST_VENV)/.installed-test
	$(MAKE) lint
	scripts/ensure_services.sh
	DATABASE_CONN_MAX_AGE=0 DEPLOYHUB_RUN_PYTHON=$(PY) $(TEST_PY) -m pytest -n 2 --dist loadfile --durations=25

# The tests that need no service: tests/conftest.py marks the others `services` (the database,
# the broker, a live server, worker processes, Chromium). The database and the broker point at
# a closed port here, so a test that reaches one without the mark fails instead of passing.
test-fast: $(VENV)/.installed-run $(TEST_VENV)/.installed-test
	DATABASE_URL=postgres://postgres@127.0.0.1:9/none CELERY_BROKER_URL=redis://127.0.0.1:9/0 \
	DEPLOYHUB_RUN_PYTHON=$(PY) $(TEST_PY) -m pytest -n 2 --dist loadfile -m "not services"

# Its device worker runs in make run's environment, as users get it; torch (eager rows) in .venv-test.
bench: $(VENV)/.installed-run $(TEST_VENV)/.installed-test
	scripts/ensure_services.sh
	DEPLOYHUB_RUN_PYTHON=$(PY) $(TEST_PY) bench/run.py

# ResNet-50 on an NVIDIA GPU (needs torch with CUDA there); says NOT RUN anywhere else.
bench-gpu: $(TEST_VENV)/.installed-test
	$(TEST_PY) bench/gpu.py

# The conformance corpus through auto mode on an embedded hub whose workers run make run's .venv.
conformance: $(VENV)/.installed-run $(TEST_VENV)/.installed-test
	$(TEST_PY) scripts/conformance.py --worker-python $(PY)

# Faults: its own PostgreSQL, Redis and stack, broken ten ways over 500+ jobs; the
# hub and workers run make run's .venv. A short form runs in make test (tests/test_soak_short.py).
soak: $(VENV)/.installed-run $(TEST_VENV)/.installed-test
	$(TEST_PY) scripts/soak.py --worker-python $(PY)

# Each check stops the run on a finding: ruff's rules and format, the layer contracts, the types
# of the modules [tool.mypy] reports (python -m: the plugin imports deployhub from here), and
# the templates' format ([tool.djlint]). CONTRIBUTING.md, "Checks", says what each covers.
lint: $(LINT_VENV)/.installed-lint
	$(LINT_VENV)/bin/ruff check .
	$(LINT_VENV)/bin/ruff format --check .
	$(LINT_VENV)/bin/lint-imports
	$(LINT_VENV)/bin/python -m mypy
	$(LINT_VENV)/bin/djlint --check templates

format: $(LINT_VENV)/.installed-lint
	$(LINT_VENV)/bin/ruff check --fix .
	$(LINT_VENV)/bin/ruff format .
	$(LINT_VENV)/bin/djlint --reformat templates

# docs/api-reference.md: every API v1 operation, read from the hub's OpenAPI schema (no database
# or server needed); tests/test_openapi.py says when it is out of date.
api-reference: $(VENV)/.installed-run
	$(PY) scripts/api_reference.py > docs/api-reference.md.new
	mv docs/api-reference.md.new docs/api-reference.md

# Needs torch (not part of `make run`): regenerates deployhub/demo/assets/.
demo-assets: $(TEST_VENV)/.installed-test
	$(TEST_PY) scripts/make_demo_assets.py

clean:
	rm -rf var .pytest_cache .mypy_cache bench/results.json $(LINT_VENV)
