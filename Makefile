# DeployHub: `make run` starts the product, `make test` runs the whole suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench lint format demo-assets clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[web,worker,dev]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) manage.py run_embedded

test: $(STAMP)
	scripts/ensure_services.sh
	$(PY) -m pytest

bench: $(STAMP)
	scripts/ensure_services.sh
	$(PY) bench/run.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Needs torch and scikit-learn (not part of `make run`): regenerates deployhub/demo/assets/.
demo-assets:
	$(PY) scripts/make_demo_assets.py

clean:
	rm -rf var .pytest_cache bench/results.json
