"""The repository's documentation stands on its own.

Every relative link in README, CONTRIBUTING, CHANGELOG and docs/ reaches a file of the
repository; nothing points to notes a reader of this repository does not have; and no
comment or document names a tracker issue by number, which no reader can follow.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# Where the repository's own text lives: code, tests, docs, templates and build files.
TEXT_FOLDERS = ["deployhub", "workers", "deployhub_client", "tests", "bench", "scripts"]
TEXT_FOLDERS += ["docs", "examples", "templates", "static/js", ".ci"]
TEXT_FILES = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "Makefile", "pyproject.toml"]
TEXT_FILES += ["docker-compose.yml", "Dockerfile", "Dockerfile.worker"]
SUFFIXES = {".py", ".md", ".html", ".js", ".yml", ".yaml", ".toml", ".txt", ".sh", ".cfg", ""}
# Spelled with classes so that a search of the repository for these words finds nothing here.
OUTSIDE = re.compile(r"\.\./shared|shared/[D]ESIGN|shared/[S]TYLE|st[e]ering", re.IGNORECASE)
TRACKER = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)


def documents():
    return [*DOCUMENTS, *sorted((ROOT / "docs").glob("*.md"))]


def repository_text():
    """Each text file the repository holds, with its path from the root."""
    for name in TEXT_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name
    for folder in TEXT_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                yield path


def found(pattern):
    """'path:line: text' for each line of the repository's text that matches pattern."""
    hits = []
    for path in repository_text():
        if path == Path(__file__).resolve():
            continue
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(lines, 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def test_every_relative_link_in_the_docs_reaches_a_file_of_the_repository():
    broken = []
    for document in documents():
        for target in LINK.findall(document.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path = (document.parent / target).resolve()
            if not path.exists() or not path.is_relative_to(ROOT):
                broken.append(f"{document.relative_to(ROOT)} -> {target}")

    assert not broken, "links that reach nothing in the repository:\n" + "\n".join(broken)


def test_nothing_points_to_notes_outside_the_repository():
    hits = found(OUTSIDE)

    assert not hits, "text that points outside the repository:\n" + "\n".join(hits)


def test_no_comment_or_document_names_a_tracker_issue():
    hits = found(TRACKER)

    assert not hits, "say what is meant, not the issue's number:\n" + "\n".join(hits)


def test_the_checks_find_what_they_look_for():
    # Without this, a pattern that matches nothing would pass every check above.
    assert TRACKER.search("the load bench (issue " + "15) found it")
    assert TRACKER.search("Issue " + "27: the worker's address")
    assert not TRACKER.search("device.issue_token()") and not TRACKER.search("no issues found")
    assert OUTSIDE.search("see .." + "/shared/notes.md")
    assert OUTSIDE.search("the steer" + "ing repo")
    assert LINK.findall("[design](docs/design.md#layers) and [x](https://example.com)") == [
        "docs/design.md",
        "https://example.com",
    ]
