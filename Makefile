# DeployHub: `make run` starts the product, `make test` runs the whole suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test bench bench-gpu lint format demo-assets clean
.PRECIOUS: $(VENV)/.installed-%

# `make run` needs the hub and a CPU worker; the tests also need torch (export jobs) and dev tools.
$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS_$*)]"
	touch $@

EXTRAS_run := web,worker
EXTRAS_test := web,worker,torch,openvino,dev

run: $(VENV)/.installed-run
	$(PY) manage.py run_embedded

test: $(VENV)/.installed-test
	scripts/ensure_services.sh
	$(PY) -m pytest

bench: $(VENV)/.installed-test
	scripts/ensure_services.sh
	$(PY) bench/run.py

# ResNet-50 on an NVIDIA GPU (needs torch with CUDA there); says NOT RUN anywhere else.
bench-gpu: $(VENV)/.installed-test
	$(PY) bench/gpu.py

lint: $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(VENV)/.installed-test
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Needs torch and scikit-learn (not part of `make run`): regenerates deployhub/demo/assets/.
demo-assets:
	$(PY) scripts/make_demo_assets.py

clean:
	rm -rf var .pytest_cache bench/results.json
