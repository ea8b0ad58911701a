"""The device worker package never imports Django, directly or through a dependency."""

import ast
import os
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).resolve().parent.parent / "workers"

IMPORT_EVERYTHING = (
    "import workers.cli, workers.runner, workers.app, workers.measure.benchmark, workers.client, "
    "workers.fingerprint, sys; "
    "assert not any(m == 'django' or m.startswith('django.') for m in sys.modules), "
    "sorted(m for m in sys.modules if m.startswith('django'))"
)


def _imported_modules(path):
    """Return the absolute module names a Python file imports."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


def _is_django(module):
    return module == "django" or module.startswith("django.")


def test_it_finds_no_django_import_in_any_worker_file():
    files = sorted(WORKERS.rglob("*.py"))
    assert WORKERS / "runner.py" in files

    offenders = [
        str(path.relative_to(WORKERS.parent))
        for path in files
        if any(_is_django(module) for module in _imported_modules(path))
    ]

    assert offenders == [], f"these worker files import django: {offenders}"


def test_it_imports_the_worker_without_loading_django_even_with_settings_in_env():
    # The hub's settings variable is often set on shared hosts; Celery's Django
    # fixup would import Django as soon as the app is created if we let it.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "deployhub.settings"}

    completed = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING + "; workers.app.app.loader"],
        cwd=WORKERS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert completed.returncode == 0, completed.stderr


def test_it_refuses_django_in_a_worker_process_even_where_it_is_installed():
    code = (
        "import workers.app\n"
        "try:\n"
        "    import django.conf\n"
        "except ImportError as refused:\n"
        "    print(refused)\n"
        "else:\n"
        "    raise SystemExit('django was importable')\n"
    )

    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=WORKERS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "never imports Django" in completed.stdout
