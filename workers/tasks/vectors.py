"""Tasks measured by cosine similarity with FP32: embeddings, and any model (generic)."""

import numpy as np

from workers.tasks.base import (
    Headline,
    Task,
    cosine,
    max_relative_error,
    output_param,
    output_rows,
    register,
    sample_rows,
)


@register
class Embedding(Task):
    """A vector per sample: its cosine similarity with FP32's (worst and mean)."""

    name = "embedding"
    label = "Embedding"
    agreement = Headline("cosine_min", True, "cosine similarity vs FP32 (worst)")
    params = ("output",)

    def normalise(self, params, outputs):
        params = super().normalise(params, outputs)
        return {"output": output_param(self.name, params, outputs)["name"]}

    def decode(self, outputs, names, params, batch, real):
        rows = output_rows(outputs, names, params["output"], batch, real)
        return [{"vector": np.array(row).reshape(-1)} for row in rows]

    def agree(self, reference, candidate, params):
        return _cosines(
            cosine(ours["vector"], theirs["vector"])
            for ours, theirs in zip(reference, candidate, strict=True)
        )


@register
class Generic(Task):
    """Every output: cosine similarity and relative error vs FP32, together and one by one."""

    name = "generic"
    label = "Any model (every output)"
    agreement = Headline("cosine_min", True, "cosine similarity vs FP32 (worst)")

    def decode(self, outputs, names, params, batch, real):
        rows = [_rows(output, batch, real) for output in outputs]
        return [
            {"outputs": [sample[index] for sample in rows], "names": list(names)}
            for index in range(real)
        ]

    def agree(self, reference, candidate, params):
        whole = _cosines(
            cosine(_joined(ours), _joined(theirs))
            for ours, theirs in zip(reference, candidate, strict=True)
        )
        per_output = [
            _per_output(name, index, reference, candidate)
            for index, name in enumerate(reference[0]["names"] if reference else [])
        ]
        errors = [entry["max_rel_error"] for entry in per_output]
        return {**whole, "max_rel_error": max(errors, default=0.0), "per_output": per_output}


def _rows(output, batch, real):
    """Return one array per real sample: its rows, or the whole output for each sample."""
    rows = [np.array(row) for row in sample_rows(output, batch, real)]
    return rows if len(rows) == real else rows * real


def _joined(found):
    """Return every output of a generic object, flat and end to end."""
    return np.concatenate(
        [np.asarray(output, dtype=np.float64).reshape(-1) for output in found["outputs"]]
    )


def _per_output(name, index, reference, candidate):
    """Return one output's worst cosine and relative error over the samples."""
    pairs = [
        (ours["outputs"][index], theirs["outputs"][index])
        for ours, theirs in zip(reference, candidate, strict=True)
    ]
    return {
        "name": name,
        "cosine_min": min(cosine(a, b) for a, b in pairs),
        "max_rel_error": max(max_relative_error(a, b) for a, b in pairs),
    }


def _cosines(values):
    """Return the worst and mean of cosine similarities (None when there are none)."""
    values = list(values)
    if not values:
        return {"cosine_min": None, "cosine_mean": None}
    return {"cosine_min": min(values), "cosine_mean": float(np.mean(values))}
