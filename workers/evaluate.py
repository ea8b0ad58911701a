"""How closely an engine reproduces its FP32 source: the evaluate job.

The reference is the source ONNX model run in FP32 by ONNX Runtime on the CPU.
Both run the same batches of samples, made by workers/feeds.py from the version's
signature and contract (each input's dtype, the allowed batch, every input of
the model); the first output is compared sample by sample, and every output's
largest difference is reported. With labels, both are scored with the task's
metric from METRICS (classification: top-1 and top-5 accuracy); adding a task
is one registered function.
"""

from typing import NamedTuple

import numpy as np

from workers import feeds as model_feeds
from workers.errors import Cancelled, JobError

EPSILON = 1e-12
PROGRESS_EVERY = 20


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
        self.output_max_abs = []

    def add_run(self, reference_outputs, engine_outputs, batch, real):
        """Add one run's outputs: the first, sample by sample; every one to its max error."""
        if len(engine_outputs) != len(reference_outputs):
            raise JobError(
                f"the engine gives {len(engine_outputs)} outputs, the source "
                f"{len(reference_outputs)}: they do not describe the same model"
            )
        for index, (reference, engine) in enumerate(
            zip(reference_outputs, engine_outputs, strict=True)
        ):
            error = _max_abs_error(reference, engine, index)
            if index == len(self.output_max_abs):
                self.output_max_abs.append(error)
            self.output_max_abs[index] = max(self.output_max_abs[index], error)
        references = model_feeds.per_sample(reference_outputs[0], batch, real)
        engines = model_feeds.per_sample(engine_outputs[0], batch, real)
        for reference, engine in zip(references, engines, strict=False):
            self.add(reference, engine)

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
            "output_max_abs_errors": [float(error) for error in self.output_max_abs],
        }
        if labels is not None and len(labels) != count:
            labels = None  # the outputs are not one per sample: the labels cannot score them
        result["task"], result["metric"] = metric.task, metric.headline
        result["reference"] = _task_metrics(metric, reference, labels)
        result["engine"] = _task_metrics(metric, engine, labels)
        return result


def _max_abs_error(reference, engine, index=0):
    """Return the largest absolute difference of two outputs; refuse outputs of other shapes
    (an infinite error is no figure: JSON has none, and the run would say nothing)."""
    reference = np.asarray(reference, dtype=np.float64)
    engine = np.asarray(engine, dtype=np.float64)
    if reference.shape != engine.shape:
        raise JobError(
            f"the engine's output {index} has shape {list(engine.shape)}, the source's "
            f"{list(reference.shape)}: they do not describe the same model"
        )
    return float(np.abs(reference - engine).max()) if reference.size else 0.0


def _task_metrics(metric, outputs, labels):
    if labels is None:
        return dict.fromkeys(metric.keys)
    return {key: float(value) for key, value in metric.compute(outputs, labels).items()}


def reference_runner(model_path):
    """Return (input metas, run(feeds) -> outputs) of the FP32 source: ONNX Runtime on the
    CPU, or PyTorch eager for a torch.export program (.pt2)."""
    if str(model_path).endswith(".pt2"):
        return _eager_runner(model_path)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return list(session.get_inputs()), lambda feeds: session.run(None, feeds)


def _eager_runner(model_path):
    import torch

    from workers.backends.torch_aoti import input_metas_from_pt2

    module = torch.export.load(str(model_path)).module()
    metas = input_metas_from_pt2(model_path)

    def run(feeds):
        with torch.inference_mode():
            outputs = module(*(torch.from_numpy(array) for array in feeds.values()))
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        return [output.float().numpy() for output in outputs]

    return metas, run


def evaluate(
    run_engine, model_path, dataset_path, params, progress=None, should_stop=None, model_io=None
):
    """Compare run_engine(feeds) -> outputs with the FP32 source on a dataset; return metrics.

    model_io (the job's) says what the model takes; without it, the source's own inputs.
    The params' batch_size, when given, is the batch fed; else the model's default.
    """
    metas, run_reference = reference_runner(model_path)
    source = model_feeds.input_specs(model_io or metas)
    arrays, labels = model_feeds.load_dataset(
        dataset_path, source, int(params.get("max_samples") or 1000), what="evaluation"
    )
    source = model_feeds.fitted(source, arrays)
    metric = task_of(params, labels)
    total, done, comparison = len(next(iter(arrays.values()))), 0, Comparison()
    for index, (feeds, real) in enumerate(
        model_feeds.dataset_batches(arrays, source, _batch_param(params))
    ):
        if should_stop and should_stop():
            raise Cancelled()
        batch = model_feeds.batch_of(feeds, source)
        comparison.add_run(run_reference(feeds), run_engine(feeds), batch, real)
        done += real
        if progress and index % PROGRESS_EVERY == 0:
            progress(done / total, f"evaluated {done} of {total} samples")
    return comparison.result(labels, metric)


def _batch_param(params):
    """Return the evaluate job's batch_size param, None when not given."""
    batch = params.get("batch_size")
    if batch is None:
        return None
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise JobError(
            f"evaluate param batch_size must be a whole number of at least 1, got {batch!r}"
        )
    return batch
