"""The names of the device protocol (docs/protocol.md), each spelled here once.

Job kinds, and the names of the inputs a job's device downloads and of the artifacts
it uploads. The hub's JobKind takes its values from here, its input providers and
result recorders use these names, and the worker's job handlers key their work on
them, so hub and device cannot disagree on a name.
"""

BENCHMARK = "benchmark"
NOOP = "noop"
EXPORT = "export"
COMPILE = "compile"
EVALUATE = "evaluate"
PARITY = "parity"
COMPARE = "compare"

# Inputs: the model version's file, and the engine a job runs (signature checked).
MODEL_INPUT = "model"
ENGINE_INPUT = "engine"
# A compile job's calibration dataset, and the caches an earlier build on the device left.
CALIBRATION_INPUT = "calibration"
TIMING_CACHE_INPUT = "timing_cache"
CALIBRATION_CACHE_INPUT = "calibration_cache"
# An evaluate job's dataset and golden pairs (either or both).
DATASET_INPUT = "dataset"
GOLDEN_INPUT = "golden"
# A parity job's zip of images and tensors.npz.
PARITY_INPUT = "pack"

# Artifacts: an export's ONNX file; a compile's engine and the caches its build wrote.
EXPORT_ARTIFACT = "onnx"
ENGINE_ARTIFACT = "engine"
TIMING_CACHE_ARTIFACT = "timing_cache"
CALIBRATION_CACHE_ARTIFACT = "calibration_cache"


def compared_engine_input(engine_id: int | str) -> str:
    """The input name of one engine a compare job times: engine-<id>."""
    return f"{ENGINE_INPUT}-{engine_id}"


def is_engine_input(name: str) -> bool:
    """True for an input that carries an engine: `engine`, or `engine-<id>` of a compare job."""
    return name == ENGINE_INPUT or name.startswith(f"{ENGINE_INPUT}-")
