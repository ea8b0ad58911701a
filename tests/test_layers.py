"""The layer contracts in pyproject.toml hold, and an upward import breaks them.

Test files import nothing from each other: what several share lives in a module
of its own in tests/ (or in conftest.py, for fixtures).
"""

import ast
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
    for package in ("deployhub", "workers", "deployhub_client"):
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


def imported_test_modules(path):
    """Name each tests/test_*.py module the file at path imports, with the line."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # tests/ is one flat package: a relative import names one of its modules.
            module = ".".join(filter(None, ["tests" if node.level else "", node.module]))
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for parts in (name.split(".") for name in names):
            if parts[0] == "tests" and len(parts) > 1 and parts[1].startswith("test_"):
                found.add(f"{path.parent.name}/{path.name}:{node.lineno} imports tests.{parts[1]}")
    return found


def test_no_file_imports_from_a_test_file():
    folders = [ROOT / "tests", ROOT / "scripts", ROOT / "bench"]

    imports = set().union(*(imported_test_modules(p) for f in folders for p in f.rglob("*.py")))

    listed = "\n".join(sorted(imports))
    assert not imports, f"move what they share into a module of its own:\n{listed}"


def test_an_import_from_a_test_file_is_found(tmp_path):
    path = tmp_path / "tests" / "test_new.py"
    path.parent.mkdir()
    path.write_text("from tests.test_protocol import RESULT\nfrom . import test_engines\n")

    assert imported_test_modules(path) == {
        "tests/test_new.py:1 imports tests.test_protocol",
        "tests/test_new.py:2 imports tests.test_engines",
    }


def test_the_client_importing_the_hub_breaks_its_contract(tmp_path):
    copy_of_the_code(tmp_path)
    (tmp_path / "deployhub_client" / "leak.py").write_text(
        "import deployhub.core.choices  # noqa: F401\nimport django.conf  # noqa: F401\n"
    )

    completed = lint_imports(tmp_path)

    assert completed.returncode != 0
    assert "deployhub_client.leak -> deployhub.core.choices (l.1)" in completed.stdout
    assert "deployhub_client.leak -> django (l.2)" in completed.stdout


def test_the_hub_importing_a_worker_module_it_does_not_share_breaks_its_contract(tmp_path):
    copy_of_the_code(tmp_path)
    (tmp_path / "deployhub" / "jobs" / "device_side.py").write_text(
        "import workers.kinds  # noqa: F401\nimport workers.runner  # noqa: F401\n"
    )

    completed = lint_imports(tmp_path)

    assert completed.returncode != 0
    assert "deployhub.jobs.device_side -> workers.runner (l.2)" in completed.stdout
    assert "device_side -> workers.kinds" not in completed.stdout
