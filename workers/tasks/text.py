"""Text recognition (CTC): greedy decoding; string agreement with FP32, CER against labels.

Greedy CTC: the argmax per step, repeats collapsed, blanks dropped. With a charset, token
t is charset[t] (the blank's place included); without one, a string is its token ids, and
a label text is read as token ids separated by spaces.
"""

import numpy as np

from workers.tasks.base import (
    Headline,
    Task,
    TaskError,
    choice,
    known,
    output_param,
    register,
    sample_rows,
    shape_of,
    whole,
)

LAYOUTS = ("NTV", "TNV")


@register
class TextRecognition(Task):
    """Strings per sample: exact agreement with FP32; CER (lower is better) with labels."""

    name = "text_recognition"
    label = "Text recognition"
    agreement = Headline("exact_agreement", True, "strings equal to FP32's")
    labelled = Headline("cer", False, "character error rate")
    labelled_keys = ("cer", "exact")
    label_arrays = ("label_texts",)
    params = ("output", "layout", "blank", "charset")

    def normalise(self, params, outputs):
        params = super().normalise(params, outputs)
        output = output_param(self.name, params, outputs)
        filled = {"output": output["name"], "layout": "NTV", "blank": 0, "charset": "", **params}
        choice(self.name, filled, "layout", LAYOUTS)
        whole(self.name, filled, "blank")
        if not isinstance(filled["charset"], str):
            raise TaskError(
                f"{self.name} param 'charset' must be a string, got {filled['charset']!r}"
            )
        _check_vocabulary(self.name, filled, shape_of(output))
        return filled

    def decode(self, outputs, names, params, batch, real):
        output = np.asarray(outputs[names.index(params["output"])])
        if params["layout"] == "TNV" and output.ndim == 3:
            output = output.transpose(1, 0, 2)
        rows = sample_rows(output, batch, real)
        return [_decoded(greedy(np.asarray(row), params["blank"]), params) for row in rows]

    def agree(self, reference, candidate, params):
        pairs = [
            (ours["tokens"], theirs["tokens"])
            for ours, theirs in zip(reference, candidate, strict=True)
        ]
        return {
            "exact_agreement": float(np.mean([a == b for a, b in pairs])) if pairs else None,
            "cer_vs_source": error_rate(pairs),
        }

    def score(self, objects, labels, params):
        pairs = [
            (_label_sequence(text, params), _sequence(found, params))
            for found, text in zip(objects, labels["label_texts"], strict=True)
        ]
        return {
            "cer": error_rate(pairs),
            "exact": float(np.mean([a == b for a, b in pairs])) if pairs else None,
        }


def _check_vocabulary(task, params, shape):
    """Refuse a blank or a charset that does not fit the output's vocabulary axis."""
    size = shape[2] if len(shape) == 3 and known(shape[2]) else None
    if shape and len(shape) != 3:
        raise TaskError(f"{task} reads an output [N, T, V] (or [T, N, V]); it has shape {shape}")
    if size is not None and params["blank"] >= size:
        raise TaskError(
            f"{task} param 'blank' is {params['blank']} but the output has {size} classes"
        )
    charset = params["charset"]
    if charset and size is not None and len(charset) < size:
        raise TaskError(
            f"{task} param 'charset' has {len(charset)} characters but the output has {size} "
            "classes and token t is charset[t] (the blank's place included): give one per class"
        )


def greedy(steps, blank):
    """Return the tokens of [T, V] step scores: argmax per step, repeats collapsed, no blanks."""
    best = np.asarray(steps).reshape(len(steps), -1).argmax(axis=1)
    changed = np.concatenate([[True], best[1:] != best[:-1]]) if best.size else best.astype(bool)
    return [int(token) for token in best[changed] if token != blank]


def _decoded(tokens, params):
    """Return a decoded object: the tokens and their text."""
    charset = params["charset"]
    text = "".join(charset[t] for t in tokens) if charset else " ".join(map(str, tokens))
    return {"tokens": tokens, "text": text}


def _sequence(found, params):
    """Return what a CER counts in a decoded object: its characters, else its token ids."""
    return list(found["text"]) if params["charset"] else [str(t) for t in found["tokens"]]


def _label_sequence(text, params):
    """Return a label text as a CER counts it: characters, or token ids split by spaces."""
    return list(str(text)) if params["charset"] else str(text).split()


def error_rate(pairs):
    """Return the sum of edit distances over the sum of the first sequences' lengths."""
    from rapidfuzz.distance import Levenshtein

    errors = sum(Levenshtein.distance(truth, found) for truth, found in pairs)
    length = sum(len(truth) for truth, _ in pairs)
    if not pairs:
        return None
    return errors / length if length else float(errors > 0)
