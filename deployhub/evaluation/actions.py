"""Evaluations of an engine against its FP32 source: requested, fed and recorded here.

An evaluate job runs the engine and its source model on a dataset (agreement and
the task metric: AccuracyRun), on a golden set's pairs (GoldenRun), or both.
"""

from deployhub.evaluation.models import AccuracyRun, GoldenRun
from deployhub.jobs.actions import submit_job
from deployhub.jobs.errors import ResultRejected
from deployhub.jobs.kinds import FileInput
from deployhub.jobs.models import JobKind
from deployhub.registry.models import Dataset, GoldenSet
from workers.kinds import DATASET_INPUT, GOLDEN_INPUT


class EvaluationRefused(ValueError):
    """The evaluation cannot be asked for as it stands; the message says why."""


def request_evaluation(
    engine, user, *, dataset=None, golden_set=None, max_samples=1000, extra_params=None
):
    """Queue an evaluate job of an engine on a dataset, on a golden set, or both."""
    version = engine.model_version
    if dataset is None and golden_set is None:
        raise EvaluationRefused("Choose a dataset, a golden set or both to evaluate the engine on.")
    if dataset is not None and dataset.model_id != version.model_id:
        raise EvaluationRefused(f"The dataset {dataset.name!r} belongs to another model.")
    if golden_set is not None and golden_set.model_version_id != version.pk:
        raise EvaluationRefused(f"The golden set {golden_set.name!r} belongs to another version.")
    params = {"max_samples": max_samples, **(extra_params or {})}
    if version.task.get("task"):  # how the worker reads the outputs (workers/tasks)
        params["task"] = {"task": version.task["task"], "params": version.task.get("params", {})}
    if dataset is not None:
        params["dataset"] = dataset.pk
    if golden_set is not None:
        params["golden"] = {
            "set": golden_set.pk,
            "atol": golden_set.atol,
            "rtol": golden_set.rtol,
            "input_names": [spec["name"] for spec in version.inputs],
            "output_names": [spec["name"] for spec in version.outputs],
        }
    return submit_job(
        team=engine.team,
        kind=JobKind.EVALUATE,
        device_class=engine.device_class,
        user=user,
        model_version=version,
        engine=engine,
        params=params,
    )


def dataset_of(job):
    """Return the dataset an evaluate job runs on, if any."""
    dataset_id = job.params.get("dataset")
    if not dataset_id:
        return None
    return Dataset.objects.filter(pk=dataset_id, model=job.model_version.model).first()


def golden_set_of(job):
    """Return the golden set an evaluate job checks its engine on, if any."""
    golden_id = (job.params.get("golden") or {}).get("set")
    if not golden_id or job.engine is None:
        return None
    return GoldenSet.objects.filter(pk=golden_id, model_version=job.engine.model_version).first()


def dataset_input(job, device=None):
    """The dataset an evaluate job runs on, when it names one."""
    dataset = dataset_of(job)
    return {DATASET_INPUT: FileInput.of(dataset, "dataset.npz")} if dataset else {}


def golden_input(job, device=None):
    """The golden set an evaluate job checks its engine on, when it names one."""
    golden = golden_set_of(job)
    return {GOLDEN_INPUT: FileInput.of(golden, golden.filename)} if golden else {}


def record_evaluation(job, result):
    """Store an evaluate job's figures: AccuracyRun for a dataset, GoldenRun for golden pairs."""
    stored = []
    if "samples" in result or "golden" not in result:
        stored.append(AccuracyRun.record(job, result))
    if "golden" in result:
        if not isinstance(result["golden"], dict):
            raise ResultRejected("The golden result must be a JSON object.")
        stored.append(GoldenRun.record(job, result["golden"]))
    return stored[0]
