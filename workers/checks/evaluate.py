"""How closely an engine reproduces its FP32 source: the evaluate job.

The reference is the source ONNX model run in FP32 by ONNX Runtime on the CPU.
Both run the same batches of samples, made by workers/measure/feeds.py from the version's
signature and contract (each input's dtype, the allowed batch, every input of
the model); the first output is compared sample by sample, and every output's
largest difference is reported. The job's task (workers/tasks: classification
when none is given) decodes both runs' outputs into objects (classes, boxes,
masks, strings, vectors): their agreement needs no labels; with the task's label
arrays in the dataset, both are scored too.
"""

import numpy as np

from workers import tasks
from workers.errors import Cancelled, JobError
from workers.measure import feeds as model_feeds

EPSILON = 1e-12
PROGRESS_EVERY = 20


def task_of(params, labels):
    """Return the job's task declaration {"task", "params"}, not yet checked against outputs.

    The job's `task` is a declaration, a task's name, or absent: classification, when
    the labels (if any) are 1-D integers; other labels need the job to name their task.
    """
    task = params.get("task")
    declaration = task if isinstance(task, dict) else {"task": task, "params": {}}
    if task:
        if declaration.get("task") not in tasks.TASKS:
            known = ", ".join(sorted(tasks.TASKS))
            raise JobError(
                f"no metric is registered for the task {declaration.get('task')!r} (known: {known})"
            )
        return declaration
    classes = (labels or {}).get("labels")
    if classes is not None and (classes.ndim != 1 or classes.dtype.kind not in "iu"):
        raise JobError(
            f"the labels are {classes.dtype} with shape {classes.shape}, not 1-D class indices: "
            "say which task they are for with the job's 'task' param"
        )
    return {"task": "classification", "params": {}}


class Decoded:
    """The objects a task decodes from the reference's and the engine's runs, side by side.

    The declaration is checked against the outputs of the first run (names and shapes as
    they come out), then every run is decoded with it.
    """

    def __init__(self, declaration, names):
        self.declaration, self.names = declaration, names
        self.task = tasks.TASKS[declaration["task"]]
        self.params = None
        self.reference, self.engine = [], []

    def add_run(self, reference_outputs, engine_outputs, batch, real):
        """Decode one run of both; keep the objects of its real samples."""
        names = self.names
        if not names or len(names) != len(reference_outputs):
            names = [f"output_{index}" for index in range(len(reference_outputs))]
        if self.params is None:
            self.params = self._checked(names, reference_outputs)
        decode = self.task.decode
        self.reference.extend(decode(reference_outputs, names, self.params, batch, real))
        self.engine.extend(decode(engine_outputs, names, self.params, batch, real))

    def _checked(self, names, outputs):
        """Return the declaration's params, normalised against the outputs of a run."""
        described = [
            {"name": name, "dtype": str(np.asarray(output).dtype), "shape": list(np.shape(output))}
            for name, output in zip(names, outputs, strict=True)
        ]
        return tasks.normalise(self.declaration, described)["params"]

    def result(self, labels, rows):
        """Return the task's part of the result: agreement, and labelled metrics of both."""
        task = self.task
        agreement = task.agree(self.reference, self.engine, self.params)
        labels = _task_labels(task, labels, rows, len(self.reference))
        return {
            "task": task.name,
            "params": self.params,
            "agreement": agreement,
            "agreement_metric": task.agreement.key,
            "metric": task.labelled.key if task.labelled else None,
            "reference": _scores(task, self.reference, labels, self.params),
            "engine": _scores(task, self.engine, labels, self.params),
            "top1_agreement": agreement.get("top1_agreement"),
        }


def _task_labels(task, labels, rows, count):
    """Return the task's label arrays, None when the dataset lacks one of them or when the
    objects are not one per dataset row (then the labels cannot score them)."""
    if not labels or not task.label_arrays or count != rows:
        return None
    if not all(name in labels for name in task.label_arrays):
        return None
    return {name: labels[name] for name in task.label_arrays}


def _scores(task, objects, labels, params):
    """Return a task's labelled metrics of objects (every key None without labels)."""
    if labels is None or not objects:
        return task.unscored()
    return task.score(objects, labels, params)


class Comparison:
    """Running comparison of engine outputs against reference outputs, number by number."""

    def __init__(self):
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

    def result(self):
        """Return the numeric comparison: errors and cosines of the first output, per sample."""
        count = len(self.cosines)
        return {
            "samples": count,
            "max_abs_error": float(self.max_abs),
            "mean_abs_error": self.sum_abs / count,
            "max_rel_error": float(self.max_rel),
            "mean_rel_error": self.sum_rel / count,
            "cosine_min": min(self.cosines),
            "cosine_mean": float(np.mean(self.cosines)),
            "output_max_abs_errors": [float(error) for error in self.output_max_abs],
        }


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


def reference_runner(model_path):
    """Return (input metas, run(feeds) -> outputs) of the FP32 source: ONNX Runtime on the
    CPU, or PyTorch eager for a torch.export program (.pt2)."""
    metas, _, run = reference_model(model_path)
    return metas, run


def reference_model(model_path):
    """Return (input metas, output names or None, run(feeds) -> outputs) of the FP32 source."""
    if str(model_path).endswith(".pt2"):
        metas, run = _eager_runner(model_path)
        return metas, None, run
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return list(session.get_inputs()), names, lambda feeds: session.run(None, feeds)


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
    The params' batch_size, when given, is the batch fed; else the model's default. The
    params' task (a declaration, a name, or none: classification) decodes the outputs.
    """
    metas, names, run_reference = reference_model(model_path)
    source = model_feeds.input_specs(model_io or metas)
    arrays, labels = model_feeds.load_dataset(
        dataset_path, source, int(params.get("max_samples") or 1000), what="evaluation"
    )
    source = model_feeds.fitted(source, arrays)
    decoded = Decoded(task_of(params, labels), names or _declared_outputs(model_io))
    total, done, comparison = len(next(iter(arrays.values()))), 0, Comparison()
    for index, (feeds, real) in enumerate(
        model_feeds.dataset_batches(arrays, source, _batch_param(params))
    ):
        if should_stop and should_stop():
            raise Cancelled()
        batch = model_feeds.batch_of(feeds, source)
        reference_outputs, engine_outputs = run_reference(feeds), run_engine(feeds)
        comparison.add_run(reference_outputs, engine_outputs, batch, real)
        decoded.add_run(reference_outputs, engine_outputs, batch, real)
        done += real
        if progress and index % PROGRESS_EVERY == 0:
            progress(done / total, f"evaluated {done} of {total} samples")
    return {**comparison.result(), **decoded.result(labels, total)}


def _declared_outputs(model_io):
    """Return the output names a job's model_io declares (None when it declares none)."""
    outputs = (model_io or {}).get("outputs") if isinstance(model_io, dict) else None
    return [output["name"] for output in outputs] if outputs else None


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
