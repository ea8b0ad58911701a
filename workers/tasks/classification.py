"""Classification: one score per class and sample; top-1 agreement with FP32, top-1/top-5."""

import numpy as np

from workers.tasks.base import Headline, Task, TaskError, output_param, output_rows, register


@register
class Classification(Task):
    """Class scores [N, C]: agreement is the share of samples whose top class is FP32's."""

    name = "classification"
    label = "Classification"
    agreement = Headline("top1_agreement", True, "top-1 agreement with FP32")
    labelled = Headline("top1", True, "top-1 accuracy")
    labelled_keys = ("top1", "top5")
    label_arrays = ("labels",)
    params = ("output",)

    def normalise(self, params, outputs):
        params = super().normalise(params, outputs)
        return {"output": output_param(self.name, params, outputs)["name"]}

    def decode(self, outputs, names, params, batch, real):
        rows = output_rows(outputs, names, params["output"], batch, real)
        return [{"scores": np.array(row).reshape(-1)} for row in rows]  # a copy: see base

    def agree(self, reference, candidate, params):
        same = [
            _top(ours, 1) == _top(theirs, 1)
            for ours, theirs in zip(candidate, reference, strict=True)
        ]
        return {"top1_agreement": float(np.mean(same)) if same else None}

    def score(self, objects, labels, params):
        classes = np.asarray(labels["labels"])
        if classes.ndim != 1 or classes.dtype.kind not in "iu":
            raise TaskError(
                f"classification labels must be 1-D class indices, got {classes.dtype} "
                f"with shape {list(classes.shape)}"
            )
        size = min(object_["scores"].size for object_ in objects)
        return {
            "top1": _hits(objects, classes, 1),
            "top5": _hits(objects, classes, min(5, size)),
        }


def _top(object_, k):
    """Return the k best classes of a decoded object, best first (ties: the lower index)."""
    return tuple(np.argsort(-object_["scores"], kind="stable")[:k])


def _hits(objects, classes, k):
    """Return the share of samples whose label is among their k best classes."""
    hits = [label in _top(object_, k) for object_, label in zip(objects, classes, strict=True)]
    return float(np.mean(hits))
