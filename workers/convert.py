"""Convert an ONNX model to another opset with onnx.version_converter, and measure the change.

Old files use operator versions runtimes no longer run (ONNX Runtime needs
ai.onnx opset 7 or later), so the source cannot be run where the converted
model runs: the ONNX reference evaluator computes the source's outputs, ONNX
Runtime the converted model's, on the same random inputs. The result has the
shape of an export result (docs/protocol.md), so the hub stores the converted
file as a child version the way it stores an exported .pt2. Runs on a worker.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workers.errors import JobError, one_line
from workers.export import output_difference
from workers.feeds import random_array

# The opset "Convert to opset N" offers by default.
CONVERT_OPSET = 17
MIN_OPSET = 7
UNSUPPORTED = "unsupported_operator"
REFERENCE = "onnx.reference.ReferenceEvaluator"


@dataclass(frozen=True)
class Settings:
    """What a conversion asks for, read from an export job's params."""

    opset: int = CONVERT_OPSET
    input_shapes: dict = field(default_factory=dict)
    samples: int = 4
    seed: int = 0


def convert_onnx(source, out_path, params, progress=None):
    """Write source converted to params["convert_to_opset"] at out_path; return the report.

    The report names both opsets and the largest differences between the
    source's outputs (reference evaluator) and the converted model's (ONNX Runtime).
    """
    import onnx

    settings = read_settings(params)
    report = progress or _ignore_progress
    report(0.0, "loading the model")
    model = load_source(source)
    source_opset = default_opset(model)
    report(0.2, f"converting opset {source_opset} to {settings.opset}")
    converted = convert_model(model, settings.opset)
    onnx.save(converted, str(out_path))
    report(0.5, "comparing the converted model with the source")
    feeds = random_feeds(model, settings)
    differences = compare(model, out_path, feeds)
    report(1.0, "done")
    return {
        "conversion": "onnx.version_converter",
        "source_opset": source_opset,
        "opset": settings.opset,
        "ir_version": converted.ir_version,
        "onnx_version": onnx.__version__,
        "onnx_bytes": Path(out_path).stat().st_size,
        "samples": settings.samples,
        "reference": REFERENCE,
        **differences,
    }


def conversion_line(result):
    """Return the log line that says what a conversion did and how far it strays."""
    return (
        f"converted opset {result['source_opset']} to {result['opset']} with "
        f"onnx.version_converter ({result['onnx_bytes']} bytes); largest difference from the "
        f"source ({REFERENCE}) over {result['samples']} samples: "
        f"{result['max_abs_diff']:.3g} absolute, {result['max_rel_diff']:.3g} relative"
    )


def read_settings(params):
    """Return the conversion Settings from a job's params, checking them."""
    import onnx

    params = params or {}
    opset = params.get("convert_to_opset", CONVERT_OPSET)
    newest = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise JobError(
            f"convert_to_opset must be a whole number from {MIN_OPSET} to {newest} "
            f"(this worker's onnx {onnx.__version__}), got {opset!r}"
        )
    samples = params.get("samples", 4)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise JobError(f"samples must be a whole number of at least 1, got {samples!r}")
    shapes = params.get("input_shapes") or {}
    if not isinstance(shapes, dict):
        raise JobError("input_shapes must be {input name: [fixed dims]}")
    return Settings(opset=opset, input_shapes=shapes, samples=samples)


def load_source(path):
    """Load an ONNX file with its weights; refuse one that keeps them in external files."""
    import onnx

    if Path(path).suffix == ".zip":
        raise JobError(
            "this version keeps its weights in external data files: converting it is not "
            "supported yet; convert the file with onnx.version_converter and upload the result"
        )
    try:
        return onnx.load(str(path))
    except Exception as error:
        raise JobError(f"the model is not a readable ONNX file: {_one_line(error)}") from error


def default_opset(model):
    """Return the model's ai.onnx opset."""
    return next(
        (entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None
    )


def convert_model(model, opset):
    """Return the model converted to opset, checked, at an IR version that opset needs.

    A failed conversion raises a JobError of category unsupported_operator with
    the converter's message: some operators have no adapter between versions.
    """
    import onnx
    from onnx import version_converter

    if default_opset(model) == opset:
        raise JobError(f"the model is at opset {opset} already: nothing to convert")
    try:
        converted = version_converter.convert_version(model, opset)
        converted.ir_version = max(
            converted.ir_version, onnx.helper.find_min_ir_version_for([_opset_id(opset)])
        )
        onnx.checker.check_model(converted, full_check=True)
    except Exception as error:
        raise JobError(
            f"{UNSUPPORTED}: onnx.version_converter could not convert opset "
            f"{default_opset(model)} to {opset}: {_one_line(error)}"
        ) from error
    return converted


def random_feeds(model, settings):
    """Return `samples` random {input name: array} feeds for the model's true inputs.

    Shapes come from settings.input_shapes (the version's contract) where given,
    else from the model, with symbolic dimensions as 1.
    """
    from onnx import helper

    weights = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in weights]
    rng = np.random.default_rng(settings.seed)
    specs = []
    for value in inputs:
        tensor = value.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        shape = settings.input_shapes.get(value.name) or [
            dim.dim_value if dim.dim_value > 0 else 1 for dim in tensor.shape.dim
        ]
        specs.append((value.name, tuple(shape), dtype))
    return [
        {name: random_array(rng, dtype, shape) for name, shape, dtype in specs}
        for _ in range(settings.samples)
    ]


def compare(model, converted_path, feeds):
    """Return the largest differences between the source (reference) and the converted (ORT)."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    try:
        session = ort.InferenceSession(str(converted_path), providers=["CPUExecutionProvider"])
    except Exception as error:
        raise JobError(
            f"{UNSUPPORTED}: ONNX Runtime cannot load the converted model: {_one_line(error)}"
        ) from error
    try:
        reference = ReferenceEvaluator(model, new_ops=legacy_operators(model))
        expected = [reference.run(None, feed) for feed in feeds]
    except Exception as error:
        raise JobError(
            f"{UNSUPPORTED}: the ONNX reference evaluator cannot run the source, so the "
            f"conversion cannot be checked: {_one_line(error)}"
        ) from error
    names = [output.name for output in session.get_outputs()]
    diffs = [
        output_difference(name, np.asarray(got), np.asarray(want), against="the source")
        for feed, wanted in zip(feeds, expected, strict=True)
        for name, got, want in zip(names, _run(session, feed), wanted, strict=True)
    ]
    return {
        "max_abs_diff": max(abs_diff for abs_diff, _ in diffs),
        "max_rel_diff": max(rel_diff for _, rel_diff in diffs),
    }


def _run(session, feed):
    """Run the converted model on one feed, or raise a JobError naming the shapes it got."""
    try:
        return session.run(None, feed)
    except Exception as error:
        shapes = ", ".join(f"{name} {list(array.shape)}" for name, array in feed.items())
        raise JobError(
            f"the converted model fails in ONNX Runtime on {shapes}: {_one_line(error)}"
        ) from error


def legacy_operators(model):
    """Return reference implementations of opset < 7 operators the evaluator lacks, or None.

    Before opset 7, Add, Sub, Mul and Div broadcast only when asked
    (broadcast=1), aligning the second input at `axis`; the evaluator
    broadcasts the numpy way, which differs as soon as axis is given.
    """
    from onnx.reference.op_run import OpRun

    if (default_opset(model) or MIN_OPSET) >= MIN_OPSET:
        return None

    def legacy(numpy_op):
        def _run(self, a, b, broadcast=None, axis=None, consumed_inputs=None):
            if broadcast and axis is not None:
                b = b.reshape(b.shape + (1,) * (a.ndim - axis - b.ndim))
            return (numpy_op(a, b).astype(a.dtype),)

        return _run

    ops = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
    return [
        type(name, (OpRun,), {"op_domain": "", "_run": legacy(numpy_op)})
        for name, numpy_op in ops.items()
    ]


def _opset_id(opset):
    from onnx import helper

    return helper.make_opsetid("", opset)


def _one_line(error):
    """Return an error as one line, naming its type: every line of it (ONNX Runtime names the
    offending indices after "...for the following indices")."""
    text = one_line(error)
    return one_line(f"{type(error).__name__}: {text}" if text else type(error).__name__)


def _ignore_progress(fraction, message):
    """Accept a progress report and do nothing with it."""
