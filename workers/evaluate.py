"""How closely an engine reproduces its FP32 source: the evaluate job.

The reference is the source ONNX model run in FP32 by ONNX Runtime on the CPU.
Both run the same samples, one at a time; the first output is compared. With
labels, both are scored with the task's metric from METRICS (classification:
top-1 and top-5 accuracy); adding a task is one registered function.
"""

from typing import NamedTuple

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


class TaskMetric(NamedTuple):
    """How a task is scored: compute(outputs, labels) -> {key: fraction}, higher is better.

    headline is the key that accuracy tolerances are measured on, in points (x100).
    """

    task: str
    headline: str
    keys: tuple
    compute: object


# Task metrics by task name (register_metric adds one; a duplicate raises).
METRICS = {}


def register_metric(task, *, headline, keys):
    """Register fn(outputs, labels) -> {key: float} as the metric of a task."""

    if task in METRICS:
        raise ValueError(f"a metric for the task {task!r} is already registered")
    if headline not in keys:
        raise ValueError(f"the headline metric {headline!r} is not one of {keys}")

    def register(compute):
        METRICS[task] = TaskMetric(task, headline, tuple(keys), compute)
        return compute

    return register


def _topk_hits(logits, labels, k):
    top = np.argsort(-logits, axis=1)[:, :k]
    return float(np.mean([label in row for row, label in zip(top, labels, strict=True)]))


@register_metric("classification", headline="top1", keys=("top1", "top5"))
def classification(logits, labels):
    """Top-1 and top-5 accuracy of class scores (samples x classes) against class indices."""
    return {
        "top1": _topk_hits(logits, labels, 1),
        "top5": _topk_hits(logits, labels, min(5, logits.shape[1])),
    }


def task_of(params, labels):
    """Return the metric to score with: the job's `task`, else classification.

    Classification is the default when the labels are 1-D integers (or absent);
    other labels need the job to name their task.
    """
    task = params.get("task")
    if task:
        if task not in METRICS:
            known = ", ".join(sorted(METRICS))
            raise JobError(f"no metric is registered for the task {task!r} (known: {known})")
        return METRICS[task]
    if labels is not None and (labels.ndim != 1 or labels.dtype.kind not in "iu"):
        raise JobError(
            f"the labels are {labels.dtype} with shape {labels.shape}, not 1-D class indices: "
            "say which task they are for with the job's 'task' param"
        )
    return METRICS["classification"]


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

    def result(self, labels, metric=None):
        metric = metric or METRICS["classification"]
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
        result["task"], result["metric"] = metric.task, metric.headline
        result["reference"] = _task_metrics(metric, reference, labels)
        result["engine"] = _task_metrics(metric, engine, labels)
        return result


def _task_metrics(metric, outputs, labels):
    if labels is None:
        return dict.fromkeys(metric.keys)
    return {key: float(value) for key, value in metric.compute(outputs, labels).items()}


def reference_runner(model_path):
    """Return (input name, run(feeds) -> outputs) of the FP32 source: ONNX Runtime on the CPU,
    or PyTorch eager for a torch.export program (.pt2)."""
    if str(model_path).endswith(".pt2"):
        return _eager_runner(model_path)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return session.get_inputs()[0].name, lambda feeds: session.run(None, feeds)


def _eager_runner(model_path):
    import torch

    from workers.backends.torch_aoti import input_metas_from_pt2

    module = torch.export.load(str(model_path)).module()
    name = input_metas_from_pt2(model_path)[0].name

    def run(feeds):
        with torch.inference_mode():
            outputs = module(*(torch.from_numpy(array) for array in feeds.values()))
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        return [output.float().numpy() for output in outputs]

    return name, run


def evaluate(run_engine, model_path, dataset_path, params, progress=None, should_stop=None):
    """Compare run_engine(feeds) -> outputs with the FP32 source on a dataset; return metrics."""
    inputs, labels = _load_dataset(dataset_path, int(params.get("max_samples") or 1000))
    metric = task_of(params, labels)
    input_name, run_reference = reference_runner(model_path)
    comparison = Comparison()
    for index, sample in enumerate(inputs):
        if should_stop and should_stop():
            raise Cancelled()
        feeds = {input_name: np.ascontiguousarray(sample[None], dtype=np.float32)}
        comparison.add(run_reference(feeds)[0], run_engine(feeds)[0])
        if progress and index % PROGRESS_EVERY == 0:
            progress(index / len(inputs), f"evaluated {index} of {len(inputs)} samples")
    return comparison.result(labels, metric)
