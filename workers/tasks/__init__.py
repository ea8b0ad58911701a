"""Task-aware evaluation: what a model's outputs mean, and how they are measured.

    from workers.tasks import TASKS, Task, TaskError, normalise, propose, DEFAULT_TOLERANCES

A declaration {"task": name, "params": {...}} says how to decode the outputs; each Task in
TASKS decodes them into objects (boxes, masks, strings, vectors), measures a candidate's
agreement with the FP32 source without labels, and its accuracy with them. One module per
task family; pure numpy (pycocotools and rapidfuzz imported where they are needed).
"""

from workers.tasks import (  # noqa: F401 (each module registers its tasks)
    classification,
    detection,
    instances,
    segmentation,
    text,
    vectors,
)
from workers.tasks.base import TASKS, Headline, Task, TaskError, register
from workers.tasks.propose import propose

# Per task: "drop" in points (x100) of the labelled headline in its bad direction (None:
# no labelled metric), "agreement" the floor of the agreement headline (ceiling, in pixels,
# for keypoints' error), and a bound for each of the task's guards (Task.guards: mask IoU
# beside an instance segmenter's F1, F1 beside keypoints' error). A device class may
# override them per task.
DEFAULT_TOLERANCES: dict[str, dict[str, float | None]] = {
    "classification": {"drop": 1.0, "agreement": 0.99},
    "detection": {"drop": 1.0, "agreement": 0.99},
    "instance_segmentation": {"drop": 1.0, "agreement": 0.99, "mask_iou": 0.9},
    "keypoints": {"drop": 1.0, "agreement": 2.0, "f1": 0.99},
    "semantic_segmentation": {"drop": 1.0, "agreement": 0.99},
    "text_recognition": {"drop": 0.5, "agreement": 0.99},
    "embedding": {"drop": None, "agreement": 0.999},
    "generic": {"drop": None, "agreement": 0.999},
}


def normalise(declaration, outputs):
    """Return a declaration {"task", "params"} with its params filled and checked.

    outputs: the model's outputs [{"name", "dtype", "shape"}]. Other keys (a proposal's
    "why") are left out. Raises TaskError naming the param at fault and what it should be.
    """
    if not isinstance(declaration, dict):
        raise TaskError(
            f'a task declaration is {{"task": name, "params": {{...}}}}, got {declaration!r}'
        )
    name = declaration.get("task")
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}: one of {', '.join(TASKS)}")
    params = TASKS[name].normalise(declaration.get("params") or {}, list(outputs))
    return {"task": name, "params": params}


__all__ = [
    "DEFAULT_TOLERANCES",
    "TASKS",
    "Headline",
    "Task",
    "TaskError",
    "normalise",
    "propose",
    "register",
]
