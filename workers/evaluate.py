"""How closely an engine reproduces its FP32 source: the evaluate job.

The reference is the source ONNX model run in FP32 by ONNX Runtime on the CPU.
Both run the same samples, one at a time; the first output is compared.
"""

import numpy as np

from workers.errors import Cancelled, JobError

EPSILON = 1e-12
PROGRESS_EVERY = 20


def _load_dataset(path, max_samples):
    with np.load(path, allow_pickle=False) as data:
        if "inputs" not in data:
            raise JobError("the evaluation dataset has no 'inputs' array")
        inputs = data["inputs"][:max_samples]
        labels = data["labels"][:max_samples] if "labels" in data else None
    if len(inputs) == 0:
        raise JobError("the evaluation dataset is empty")
    return inputs, labels


def _topk_hits(logits, labels, k):
    top = np.argsort(-logits, axis=1)[:, :k]
    return float(np.mean([label in row for row, label in zip(top, labels, strict=True)]))


class Comparison:
    """Running comparison of engine outputs against reference outputs."""

    def __init__(self):
        self.reference, self.engine = [], []
        self.max_abs = self.max_rel = self.sum_abs = self.sum_rel = 0.0
        self.cosines = []

    def add(self, reference, engine):
        reference = np.asarray(reference, dtype=np.float64).reshape(-1)
        engine = np.asarray(engine, dtype=np.float64).reshape(-1)
        if reference.shape != engine.shape:
            raise JobError(
                f"the engine's output has {engine.size} values, the source's "
                f"{reference.size}: they do not describe the same model"
            )
        error = np.abs(reference - engine)
        relative = error / np.maximum(np.abs(reference), EPSILON)
        self.max_abs, self.max_rel = (
            max(self.max_abs, error.max()),
            max(self.max_rel, relative.max()),
        )
        self.sum_abs += error.mean()
        self.sum_rel += relative.mean()
        norms = np.linalg.norm(reference) * np.linalg.norm(engine)
        self.cosines.append(float(reference @ engine / norms) if norms else 1.0)
        self.reference.append(reference)
        self.engine.append(engine)

    def result(self, labels):
        count = len(self.cosines)
        reference, engine = np.stack(self.reference), np.stack(self.engine)
        result = {
            "samples": count,
            "top1_agreement": float(np.mean(reference.argmax(1) == engine.argmax(1))),
            "max_abs_error": float(self.max_abs),
            "mean_abs_error": self.sum_abs / count,
            "max_rel_error": float(self.max_rel),
            "mean_rel_error": self.sum_rel / count,
            "cosine_min": min(self.cosines),
            "cosine_mean": float(np.mean(self.cosines)),
        }
        result["reference"] = _task_metrics(reference, labels)
        result["engine"] = _task_metrics(engine, labels)
        return result


def _task_metrics(logits, labels):
    if labels is None:
        return {"top1": None, "top5": None}
    return {
        "top1": _topk_hits(logits, labels, 1),
        "top5": _topk_hits(logits, labels, min(5, logits.shape[1])),
    }


def evaluate(run_engine, model_path, dataset_path, params, progress=None, should_stop=None):
    """Compare run_engine(feeds) -> outputs with the FP32 source on a dataset; return metrics."""
    import onnxruntime

    inputs, labels = _load_dataset(dataset_path, int(params.get("max_samples") or 1000))
    reference = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    model_input = reference.get_inputs()[0]
    comparison = Comparison()
    for index, sample in enumerate(inputs):
        if should_stop and should_stop():
            raise Cancelled()
        feeds = {model_input.name: np.ascontiguousarray(sample[None], dtype=np.float32)}
        comparison.add(reference.run(None, feeds)[0], run_engine(feeds)[0])
        if progress and index % PROGRESS_EVERY == 0:
            progress(index / len(inputs), f"evaluated {index} of {len(inputs)} samples")
    return comparison.result(labels)
