"""What changed between two versions of a model: signature, opset, operators, spec, contract."""


def _tensor_rows(kind, old, new):
    before = {t["name"]: t for t in old}
    after = {t["name"]: t for t in new}
    rows = []
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        if a != b:
            rows.append((f"{kind} {name}", _describe_tensor(a), _describe_tensor(b)))
    return rows


def _describe_tensor(tensor):
    if tensor is None:
        return "—"
    shape = ", ".join(str(d) for d in tensor.get("shape") or [])
    return f"{tensor.get('dtype')} [{shape}]"


def _operator_rows(old, new):
    before, after = old.get("operators", {}), new.get("operators", {})
    return [
        (f"operator {op}", before.get(op, 0), after.get(op, 0))
        for op in sorted(before.keys() | after.keys())
        if before.get(op, 0) != after.get(op, 0)
    ]


def _dict_rows(prefix, old, new):
    return [
        (f"{prefix} {key}", old.get(key, "—"), new.get(key, "—"))
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


def diff_versions(old, new):
    """Return (what, before, after) rows for everything that differs between two versions."""
    rows = [
        (field, getattr(old, field), getattr(new, field))
        for field in ("format", "ir_version", "opset", "sha256")
        if getattr(old, field) != getattr(new, field)
    ]
    rows += _tensor_rows("input", old.inputs, new.inputs)
    rows += _tensor_rows("output", old.outputs, new.outputs)
    old_params, new_params = old.graph.get("parameters"), new.graph.get("parameters")
    if old_params != new_params:
        rows.append(("parameters", old_params, new_params))
    rows += _operator_rows(old.graph, new.graph)
    rows += _dict_rows("preprocessing", old.preprocessing, new.preprocessing)
    rows += _dict_rows("contract", old.contract.get("inputs", {}), new.contract.get("inputs", {}))
    return rows
