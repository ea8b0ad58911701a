"""The layer contracts in pyproject.toml hold, and an upward import breaks them."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(folder):
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=folder, capture_output=True, text=True, timeout=300
    )


def test_every_layer_contract_is_kept():
    completed = lint_imports(ROOT)

    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "0 broken" in completed.stdout


def copy_of_the_code(folder):
    """Copy the packages and the contracts into folder, for a test to break them there."""
    skip = shutil.ignore_patterns("*.onnx", "*.npz", "*.png", "__pycache__", "migrations")
    for package in ("deployhub", "workers"):
        shutil.copytree(ROOT / package, folder / package, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", folder)
    return folder


def test_an_app_importing_a_higher_one_breaks_the_layers(tmp_path):
    copy_of_the_code(tmp_path)
    (tmp_path / "deployhub" / "jobs" / "upward.py").write_text(
        "from deployhub.engines.models import Engine  # noqa: F401\n"
    )

    completed = lint_imports(tmp_path)

    assert completed.returncode != 0
    assert "deployhub.jobs.upward -> deployhub.engines.models" in completed.stdout


def test_a_worker_importing_django_breaks_its_contract(tmp_path):
    copy_of_the_code(tmp_path)
    (tmp_path / "workers" / "leak.py").write_text("import django.conf  # noqa: F401\n")

    completed = lint_imports(tmp_path)

    assert completed.returncode != 0
    assert "workers.leak -> django (l.1)" in completed.stdout
