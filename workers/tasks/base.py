"""What a task is to the evaluate job: a decoder, an agreement with FP32, a labelled score.

A task (classification, detection, ...) is a small subclass of Task, registered by name in
TASKS; workers/checks/evaluate.py decodes every run's outputs with it and measures the decoded
objects. Pure numpy, so the hub can import it to check and propose declarations.
"""

from typing import NamedTuple

import numpy as np

from workers.errors import JobError

EPSILON = 1e-12


class TaskError(JobError):
    """A task declaration that cannot be used; the message names the param and what it takes.

    A JobError (so a ValueError): an evaluate job with a bad declaration fails with it.
    """


class Headline(NamedTuple):
    """The one figure a task is judged on: its key in a result, its direction, its name."""

    key: str
    higher_is_better: bool
    label: str


# Tasks by name (register adds one; a second one of a name raises).
TASKS = {}


def register(task_class):
    """Register a Task subclass (a class decorator) by its name; refuse a name twice."""
    task = task_class()
    if task.name in TASKS:
        raise ValueError(f"a task named {task.name!r} is already registered")
    if task.labelled and task.labelled.key not in task.labelled_keys:
        raise ValueError(
            f"the headline metric {task.labelled.key!r} is not one of {task.labelled_keys}"
        )
    TASKS[task.name] = task
    return task_class


class Task:
    """One task: how its outputs decode into objects and how those objects are measured.

    params lists the params a declaration may give (others are refused); labelled_keys
    the keys score() returns, which a run without labels reports as None.
    """

    name = ""
    label = ""
    agreement: Headline = None
    labelled: Headline | None = None
    labelled_keys = ()
    label_arrays = ()
    params = ()
    # Agreement figures judged beside the headline, each against a bound of its own (named by
    # its key in DEFAULT_TOLERANCES): what the headline alone would let through.
    guards = ()

    def normalise(self, params, outputs):
        """Return params with defaults filled and names checked against outputs."""
        return known_params(self.name, params, self.params)

    def decode(self, outputs, names, params, batch, real):
        """Return one decoded object per real sample of one run's outputs.

        Objects own their arrays (copies, never views of an output): a runtime may write
        its next run's outputs into the same buffers.
        """
        raise NotImplementedError

    def agree(self, reference, candidate, params):
        """Return how closely candidate objects agree with the reference's, sample by sample."""
        raise NotImplementedError

    def score(self, objects, labels, params):
        """Return the labelled metrics of decoded objects ({} for a task without any)."""
        return {}

    def unscored(self):
        """Return the labelled metrics of a run without labels: every key, None."""
        return dict.fromkeys(self.labelled_keys)


def known_params(task, params, allowed):
    """Return params as a new dict; refuse a param the task does not take, naming it."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise TaskError(f"the {task} params must be an object (a dict), got {params!r}")
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        takes = ", ".join(allowed) or "none"
        raise TaskError(f"{task} takes no param {unknown[0]!r} (its params: {takes})")
    return dict(params)


def output_param(task, params, outputs, key="output", default=None):
    """Return the output a param names (default: `default`, else the first); refuse others."""
    names = [output["name"] for output in outputs]
    name = params.get(key, default if default is not None else (names or [None])[0])
    if name not in names:
        listed = ", ".join(map(repr, names)) or "none"
        raise TaskError(
            f"{task} param {key!r} names no output of the model: {name!r} (outputs: {listed})"
        )
    return outputs[names.index(name)]


def shape_of(output):
    """Return an output's shape as a list (empty when unknown); -1 and symbols stay as they are."""
    return list(output.get("shape") or [])


def known(dim):
    """Return True when a dimension is a size (an int >= 0), not a symbol, None or -1."""
    return isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0


def whole(task, params, key, minimum=0):
    """Return params[key] as an int of at least minimum; refuse anything else, naming it."""
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TaskError(f"{task} param {key!r} must be a whole number >= {minimum}, got {value!r}")
    return value


def fraction(task, params, key):
    """Return params[key] as a float between 0 and 1; refuse anything else, naming it."""
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise TaskError(f"{task} param {key!r} must be a number from 0 to 1, got {value!r}")
    return float(value)


def choice(task, params, key, choices):
    """Return params[key] when it is one of choices; refuse anything else, naming them."""
    value = params[key]
    if value not in choices:
        raise TaskError(f"{task} param {key!r} must be one of {', '.join(choices)}, got {value!r}")
    return value


def sample_rows(output, batch, real):
    """Return one run's output as each real sample's part: its rows when axis 0 is the batch,
    else the whole output (it belongs to the run, as workers/measure/feeds.per_sample reads it)."""
    output = np.asarray(output)
    if output.ndim and output.shape[0] == batch:
        return list(output[:real])
    return [output]


def output_rows(outputs, names, name, batch, real):
    """Return the per-sample rows of the output called name."""
    return sample_rows(outputs[names.index(name)], batch, real)


def cosine(reference, candidate):
    """Return the cosine similarity of two arrays read flat (1.0 when either is all zeros)."""
    reference = np.asarray(reference, dtype=np.float64).reshape(-1)
    candidate = np.asarray(candidate, dtype=np.float64).reshape(-1)
    norms = np.linalg.norm(reference) * np.linalg.norm(candidate)
    return float(reference @ candidate / norms) if norms else 1.0


def max_relative_error(reference, candidate):
    """Return the largest |candidate - reference| / |reference| of two arrays (0 when empty)."""
    reference = np.asarray(reference, dtype=np.float64).reshape(-1)
    candidate = np.asarray(candidate, dtype=np.float64).reshape(-1)
    if not reference.size:
        return 0.0
    error = np.abs(reference - candidate) / np.maximum(np.abs(reference), EPSILON)
    return float(error.max())


def mean_or_none(values):
    """Return the mean of values as a float, None when there are none (JSON has no NaN)."""
    return float(np.mean(values)) if len(values) else None
