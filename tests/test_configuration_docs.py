"""docs/configuration.md names every environment variable the hub and the worker read.

Read from the source as text: a variable added to deployhub/settings.py, to another hub
module, to the device worker or to the client without a row in the table fails here.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "configuration.md"
NAME = r"\"([A-Z][A-Z0-9_]*)\""
READS = [
    re.compile(r"\benv_(?:str|bool|int|list)\(\s*" + NAME),  # deployhub/settings.py's helpers
    re.compile(r"\benviron(?:\.get)?[\[(]\s*" + NAME),  # os.environ["X"], environ.get("X")
    re.compile(r"\benv\(\s*" + NAME),  # env = os.environ.get, then env("X")
    re.compile(r"\b[A-Z_]*(?:_ENV|_VARIABLE)\s*=\s*" + NAME),  # a name kept as a constant
    re.compile(r"\benvvar\s*=\s*" + NAME),  # click's option from a variable
]
# Read for Django's own machinery, never configured by an operator.
NOT_CONFIGURATION = {"DJANGO_SETTINGS_MODULE"}


def variables_read(text):
    """The environment variable names a module's source reads."""
    return {name for pattern in READS for name in pattern.findall(text)} - NOT_CONFIGURATION


def sources():
    """The hub's settings and modules, the device worker and the client, as Python files."""
    for package in ("deployhub", "workers", "deployhub_client"):
        yield from sorted((ROOT / package).rglob("*.py"))


def documented():
    """The variable names in docs/configuration.md's table rows."""
    rows = [line for line in TABLE.read_text().splitlines() if line.startswith("|")]
    return set(re.findall(r"`([A-Z][A-Z0-9_]*)`", "\n".join(rows)))


def test_every_variable_the_code_reads_has_a_row_in_the_table():
    table = documented()
    missing = {
        f"{name} ({path.relative_to(ROOT)})"
        for path in sources()
        for name in variables_read(path.read_text())
        if name not in table
    }

    assert not missing, "docs/configuration.md has no row for:\n" + "\n".join(sorted(missing))


def test_the_settings_variables_are_found_by_the_reader():
    # The reader must see what settings.py reads, or the test above proves nothing.
    found = variables_read((ROOT / "deployhub" / "settings.py").read_text())

    assert {"DEPLOYHUB_ENV", "SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL"} <= found
    assert {"DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE", "DEPLOYHUB_METRICS_NETWORKS"} <= found


def test_the_reader_finds_each_way_the_code_reads_a_variable():
    source = """
X = env_int("A_INT", 3)
token = os.environ.get("B_GET")
root = os.environ["C_ITEM"]
parser.add_argument("--hub", default=env("D_ALIAS"))
CONFIG_ENV = "E_CONSTANT"
URL_VARIABLE = "F_CONSTANT"
@click.option("--key", envvar="G_CLICK")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "deployhub.settings")
"""
    expected = {"A_INT", "B_GET", "C_ITEM", "D_ALIAS", "E_CONSTANT", "F_CONSTANT", "G_CLICK"}

    assert variables_read(source) == expected


def test_the_readme_points_to_the_table():
    assert "docs/configuration.md" in (ROOT / "README.md").read_text()
