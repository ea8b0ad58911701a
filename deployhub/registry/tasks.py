"""A version's task: proposed from its graph at upload, confirmed or corrected by its team.

The declaration says what the model does and how to read its outputs (workers/tasks: the
head's layout, score threshold, IoU, box format, class count); every evaluation of the
version's engines reads them with it and judges them in the task's own terms.
"""

from django.db import transaction

from deployhub.teams.models import Event
from workers.tasks import TASKS, TaskError, normalise, propose
from workers.tasks.propose import BOX_TASKS, image_size


class TaskRefused(ValueError):
    """The task declaration does not fit the version; the message says why."""


def proposed_task(info):
    """Return the task a version's inputs, outputs and operators suggest, not yet confirmed."""
    outputs = info.get("outputs") or []
    operators = (info.get("graph") or {}).get("operators") or {}
    proposal = propose(info.get("inputs") or [], outputs, operators)
    try:
        declaration = normalise(proposal, outputs)
    except TaskError as exc:  # a proposal its own checks refuse: read every output as it is
        declaration = normalise({"task": "generic", "params": {}}, outputs)
        proposal = {**proposal, "why": f"{proposal.get('why', '')} ({exc}; read as generic)"}
    return {**declaration, "why": proposal.get("why", ""), "confirmed": False}


def inherited_task(parent, info):
    """Return a child version's task: its parent's when the outputs are the same, else proposed."""
    same_outputs = [o["name"] for o in parent.outputs] == [o["name"] for o in info["outputs"]]
    if parent.task.get("task") and same_outputs:
        return {**parent.task, "why": f"as v{parent.number}: {parent.task.get('why', '')}"}
    return proposed_task(info)


def declared(version, task, params):
    """Return the version's declaration of a task and its params, checked against its outputs."""
    if not task or not isinstance(task, str):
        raise TaskRefused(f"Say which task the version does: one of {', '.join(sorted(TASKS))}.")
    if task not in TASKS:
        raise TaskRefused(f"{task!r} is not a task; choose one of {', '.join(sorted(TASKS))}.")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise TaskRefused(
            'The task\'s params are a JSON object, such as {"score_threshold": 0.25}.'
        )
    if task in BOX_TASKS and "image_size" not in params:  # boxes are clipped to the image
        params = {**params, "image_size": image_size(version.inputs)}
    try:
        return normalise({"task": task, "params": params}, version.outputs)
    except TaskError as exc:
        raise TaskRefused(f"The {task} task does not fit this version: {exc}") from exc


def declare_task(version, user, task, params):
    """Confirm or correct a version's task; the audit log records what it was before."""
    declaration = declared(version, task, params)
    before = version.task
    version.task = {**declaration, "why": f"declared by {user}", "confirmed": True}
    with transaction.atomic():
        version.save(update_fields=["task"])
        _record(version, user, before)
    return version


def _record(version, user, before):
    Event.record(
        version.team,
        user,
        "version.task_declared",
        version,
        before=_summary(before),
        after=_summary(version.task),
    )


def _summary(declaration):
    if not declaration.get("task"):
        return "none"
    return f"{declaration['task']} {declaration.get('params', {})}"
