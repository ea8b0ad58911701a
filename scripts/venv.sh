#!/usr/bin/env bash
# Build one of DeployHub's environments: a virtualenv with this project (editable) and some extras.
# Usage: scripts/venv.sh VENV EXTRAS STAMP. `make run` and `make test` build make run's
# environment with this same script, so the tests run in exactly what users get.
set -euo pipefail
venv=$1 extras=$2 stamp=$3
python=${PYTHON:-$(command -v python3.11 || command -v python3)}
cd "$(dirname "$0")/.."

test -x "$venv/bin/python" || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[$extras]"
touch "$stamp"
