"""A lint, format, type or template error fails the checks `make lint` runs, and CI runs them.

Each test writes a scratch file with one deliberate error beside a copy of the project's
pyproject.toml (the tools' settings) and runs the tool the way `make lint` does; a clean twin
of the file passes, so a failure is the error's and not the setup's. The tools come from the
test environment (the dev extra installs the lint extra), at the versions `make lint` uses.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CLEAN = 'def total(counts: list[int]) -> int:\n    """Add the counts."""\n    return sum(counts)\n'
MISTYPED = CLEAN.replace("-> int:", "-> str:")


def run(folder, *command):
    return subprocess.run(
        [str(arg) for arg in command], cwd=folder, capture_output=True, text=True, timeout=120
    )


def project_settings(folder, drop=()):
    """Copy pyproject.toml into folder, less the lines that start with one of `drop`."""
    lines = (ROOT / "pyproject.toml").read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(tuple(drop))]
    (folder / "pyproject.toml").write_text("".join(kept))
    return folder


def module(folder, dotted, source):
    """Write the module `dotted` (a.b.c) under folder, each package with its __init__.py."""
    *packages, name = dotted.split(".")
    for depth in range(1, len(packages) + 1):
        (folder.joinpath(*packages[:depth])).mkdir(exist_ok=True)
        (folder.joinpath(*packages[:depth]) / "__init__.py").write_text("")
    path = folder.joinpath(*packages) / f"{name}.py"
    path.write_text(source)
    return path


def mypy(folder, *files):
    """mypy as make lint runs it, on files."""
    # No cache: a file rewritten within the same second at the same size reads as unchanged.
    command = (sys.executable, "-m", "mypy", "--no-incremental", *files)
    return run(folder, *command)


def test_make_test_runs_the_checks_before_the_suite():
    """CI runs make test alone (.ci/run, tests/test_deployment_files.py): the checks come
    with it, first."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]

    assert recipe[0].strip() == "$(MAKE) lint"
    assert "pytest" in recipe[-1]


def test_ruff_fails_on_an_unused_import_and_passes_without_it(tmp_path):
    project_settings(tmp_path)
    (tmp_path / "clean.py").write_text(CLEAN)
    (tmp_path / "unused.py").write_text("import os\n\n" + CLEAN)

    found = run(tmp_path, BIN / "ruff", "check", "unused.py")
    clean = run(tmp_path, BIN / "ruff", "check", "clean.py")

    assert found.returncode == 1, found.stdout + found.stderr
    assert "F401" in found.stdout
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_ruff_format_check_fails_on_unformatted_code(tmp_path):
    project_settings(tmp_path)
    (tmp_path / "clean.py").write_text(CLEAN)
    (tmp_path / "cramped.py").write_text(CLEAN.replace("counts: list[int]", "counts:list[int]"))

    found = run(tmp_path, BIN / "ruff", "format", "--check", "cramped.py")
    clean = run(tmp_path, BIN / "ruff", "format", "--check", "clean.py")

    assert found.returncode == 1, found.stdout + found.stderr
    assert "--> cramped.py" in found.stdout and "1 file would be reformatted" in found.stdout
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_mypy_fails_on_a_type_error_in_a_checked_module_only(tmp_path):
    """deployhub_client is in the checked scope ([tool.mypy]); a module outside it is not, yet.

    The copy leaves out the Django plugin: these scratch modules import no Django, and without
    it mypy needs no settings and runs in seconds.
    """
    project_settings(tmp_path, drop=("plugins",))
    checked = module(tmp_path, "deployhub_client.scratch", MISTYPED)
    module(tmp_path, "unchecked.scratch", MISTYPED)

    found = mypy(tmp_path, "deployhub_client", "unchecked")
    checked.write_text(CLEAN)
    clean = mypy(tmp_path, "deployhub_client", "unchecked")

    assert found.returncode == 1, found.stdout + found.stderr
    assert "deployhub_client/scratch.py:3: error: Incompatible return value" in found.stdout
    assert "unchecked/" not in found.stdout
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_mypy_fails_on_a_function_without_annotations_where_they_are_required(tmp_path):
    """deployhub.api.v1 must annotate every function; deployhub_client.* is checked without."""
    project_settings(tmp_path, drop=("plugins",))
    bare = "def total(counts):\n    return sum(counts)\n"
    module(tmp_path, "deployhub.api.v1", bare)
    module(tmp_path, "deployhub_client.scratch", bare)

    found = mypy(tmp_path, "deployhub", "deployhub_client")

    assert found.returncode == 1, found.stdout + found.stderr
    assert "deployhub/api/v1.py:1: error: Function is missing a type annotation" in found.stdout
    assert "deployhub_client/" not in found.stdout


def test_djlint_check_fails_on_an_unindented_template_until_it_is_reformatted(tmp_path):
    project_settings(tmp_path)
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "flat.html").write_text(  # nothing indented
        "<div>\n<ul>\n{% for item in items %}\n<li>{{ item }}</li>\n{% endfor %}\n</ul>\n</div>\n"
    )

    found = run(tmp_path, BIN / "djlint", "--check", "templates")
    run(tmp_path, BIN / "djlint", "--reformat", "templates")
    clean = run(tmp_path, BIN / "djlint", "--check", "templates")

    assert found.returncode == 1, found.stdout + found.stderr
    assert clean.returncode == 0, clean.stdout + clean.stderr
