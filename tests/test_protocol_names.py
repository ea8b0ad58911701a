"""The hub spells no device-protocol name itself: job kinds, input and artifact names come from
workers/kinds.py, so hub and worker cannot drift apart on one.

The check reads the hub's code (deployhub/, no migrations) where those names are used: the
keys of the inputs a kind's device receives (FileInput, EngineInput), the artifact names a
recorder looks up, and comparisons of a job's kind.
"""

import ast

from tests.layering import ROOT
from workers import kinds

HUB = ROOT / "deployhub"
INPUTS = ("FileInput", "EngineInput")
KINDS = {kinds.BENCHMARK, kinds.NOOP, kinds.EXPORT, kinds.COMPILE, kinds.EVALUATE}
KINDS |= {kinds.PARITY, kinds.COMPARE}


def _name(node):
    """The called name of a call (`f`, `x.f`, `FileInput.of` gives FileInput.of)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _name(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    return ""


def _spelled(node):
    """True for a literal string, or an f-string with literal text (engine-{id})."""
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(
        node, ast.JoinedStr
    )


def _input_keys(node):
    """The keys of a dict (or dict comprehension) whose values are job inputs."""
    if isinstance(node, ast.Dict):
        pairs = zip(node.keys, node.values, strict=True)
    elif isinstance(node, ast.DictComp):
        pairs = [(node.key, node.value)]
    else:
        return []
    return [
        key
        for key, value in pairs
        if isinstance(value, ast.Call) and _name(value.func).split(".")[0] in INPUTS
    ]


def _artifact_names(node):
    """The names given where an artifact is looked up: an *artifact*(...) call's arguments,
    `name=` of artifacts.filter(...), and the default of result.get("artifact", ...)."""
    if not isinstance(node, ast.Call):
        return []
    called = _name(node.func)
    if "artifact" in called.split(".")[-1]:
        return list(node.args)
    if called.endswith("artifacts.filter"):
        return [keyword.value for keyword in node.keywords if keyword.arg == "name"]
    if called.endswith(".get") and node.args and _literal(node.args[0]) == "artifact":
        return node.args[1:]
    return []


def _kind_comparisons(node):
    """The other side of a comparison with something named kind (job.kind == "compile")."""
    if not isinstance(node, ast.Compare):
        return []
    sides = [node.left, *node.comparators]
    if not any(_name(side).split(".")[-1] == "kind" for side in sides):
        return []
    return [side for side in sides if _literal(side) in KINDS]


def _literal(node):
    return node.value if isinstance(node, ast.Constant) else None


def bare_names(source, filename="<source>"):
    """Return 'file:line: text' for each protocol name the source spells itself."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        spelled = _input_keys(node) + _artifact_names(node) + _kind_comparisons(node)
        found += [
            f"{filename}:{value.lineno}: {ast.unparse(value)}"
            for value in spelled
            if _spelled(value)
        ]
    return found


def hub_files():
    return sorted(path for path in HUB.rglob("*.py") if "migrations" not in path.parts)


def test_the_hub_reads_every_protocol_name_from_workers():
    found = [
        hit
        for path in hub_files()
        for hit in bare_names(path.read_text(), str(path.relative_to(ROOT)))
    ]

    assert found == [], "use the names in workers/kinds.py instead: " + "; ".join(found)


def test_a_bare_input_artifact_or_kind_name_is_found():
    source = (
        "def inputs(job):\n"
        '    return {"engine": EngineInput(job.engine), "pack": FileInput.of(run, "p.zip")}\n'
        "def compared(job):\n"
        '    return {f"engine-{e.pk}": EngineInput(e) for e in job.engines}\n'
        "def record(job, result):\n"
        '    _artifact(job, "timing_cache", None)\n'
        '    job.artifacts.filter(name=result.get("artifact", "onnx"))\n'
        '    return job.kind == "compile"\n'
    )

    found = bare_names(source)

    assert sorted(hit.split(": ", 1)[1] for hit in found) == [
        "'compile'",
        "'engine'",
        "'onnx'",
        "'pack'",
        "'timing_cache'",
        "f'engine-{e.pk}'",
    ], found


def test_names_from_workers_kinds_pass():
    source = (
        "from workers.kinds import ENGINE_INPUT, compared_engine_input\n"
        "def inputs(job):\n"
        "    return {ENGINE_INPUT: EngineInput(job.engine)}\n"
        "def compared(job):\n"
        "    return {compared_engine_input(e.pk): EngineInput(e) for e in job.engines}\n"
    )

    assert bare_names(source) == []
