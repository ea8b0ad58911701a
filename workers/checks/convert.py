"""Convert an ONNX model to another opset with onnx.version_converter, and measure the change.

Old files use operator versions runtimes no longer run (ONNX Runtime needs
ai.onnx opset 7 or later), so the source cannot be run where the converted
model runs: the ONNX reference evaluator computes the source's outputs, ONNX
Runtime the converted model's, on the same random inputs. Opset < 7 broadcasts
aligned at an axis are rewritten first, as onnx.version_converter aligns them
wrongly (align_legacy_broadcasts). The result has the shape of an export
result (docs/protocol.md), so the hub stores the converted file as a child
version the way it stores an exported .pt2. Runs on a worker.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workers.backends.isolate import CompileFailure
from workers.checks.export import output_difference
from workers.errors import JobError, one_line
from workers.measure.feeds import random_array

# The opset "Convert to opset N" offers by default.
CONVERT_OPSET = 17
MIN_OPSET = 7
UNSUPPORTED = "unsupported_operator"
REFERENCE = "onnx.reference.ReferenceEvaluator"
# Operators that, before opset 7, broadcast their second input only when asked
# (broadcast=1), aligned at `axis`; from opset 7 they broadcast the numpy way.
LEGACY_BROADCAST = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Pow": np.power,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
    "Equal": np.equal,
    "Greater": np.greater,
    "Less": np.less,
}


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

    A failed conversion raises a CompileFailure of category unsupported_operator with
    the converter's message: some operators have no adapter between versions.
    """
    import onnx
    from onnx import version_converter

    if default_opset(model) == opset:
        raise JobError(f"the model is at opset {opset} already: nothing to convert")
    try:
        converted = version_converter.convert_version(align_legacy_broadcasts(model), opset)
        converted.ir_version = max(
            converted.ir_version, onnx.helper.find_min_ir_version_for([_opset_id(opset)])
        )
        onnx.checker.check_model(converted, full_check=True)
    except Exception as error:
        raise CompileFailure(
            UNSUPPORTED,
            f"onnx.version_converter could not convert opset "
            f"{default_opset(model)} to {opset}: {_one_line(error)}",
        ) from error
    return converted


def align_legacy_broadcasts(model):
    """Return the model, or for opset < 7 a copy whose axis broadcasts need no axis.

    onnx.version_converter's 6 to 7 adapter unsqueezes B by rank(A) - rank(B)
    whatever the axis, so a [C] bias at axis 1 of [N, C, H, W] becomes
    [C, 1, 1, 1] and broadcasts the batch to C. Giving B the trailing ones its
    axis implies and dropping the axis leaves broadcast=1 alone: numpy
    broadcasting, which the adapter keeps as it is. A node whose ranks shape
    inference cannot tell stays as it was, for the converter to judge.
    """
    import onnx

    if (default_opset(model) or MIN_OPSET) >= MIN_OPSET:
        return model
    aligned = onnx.ModelProto()
    aligned.CopyFrom(model)
    ranks = _ranks(aligned)
    nodes = [new for node in aligned.graph.node for new in _aligned(aligned.graph, node, ranks)]
    aligned.graph.ClearField("node")
    aligned.graph.node.extend(nodes)
    return aligned


def _ranks(model):
    """Return {value name: rank} for every value whose rank onnx shape inference knows."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # an unknown rank only leaves the node to the converter
        inferred = model.graph
    values = [*inferred.input, *inferred.value_info, *inferred.output]
    ranks = {
        value.name: len(value.type.tensor_type.shape.dim)
        for value in values
        if value.type.tensor_type.HasField("shape")
    }
    ranks.update({tensor.name: len(tensor.dims) for tensor in model.graph.initializer})
    return ranks


def _aligned(graph, node, ranks):
    """Return the nodes that replace one: itself without `axis`, after an Unsqueeze of B if any.

    Only a legacy broadcast (broadcast=1 with an axis) whose A and B ranks are
    known changes; B gets rank(A) - axis - rank(B) trailing ones, in place when
    it is a weight only this node reads.
    """
    from onnx import helper

    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type not in LEGACY_BROADCAST or not attributes.get("broadcast"):
        return [node]
    if "axis" not in attributes or len(node.input) < 2:
        return [node]
    a_rank, b_rank = ranks.get(node.input[0]), ranks.get(node.input[1])
    if a_rank is None or b_rank is None:
        return [node]
    axis = attributes["axis"] + (a_rank if attributes["axis"] < 0 else 0)
    ones = a_rank - axis - b_rank
    if ones < 0:
        return [node]
    kept = [a for a in node.attribute if a.name != "axis"]
    node.ClearField("attribute")
    node.attribute.extend(kept)
    if ones == 0:
        return [node]
    if _weight(graph, node.input[1]) is not None:
        node.input[1] = _reshaped_weight(graph, node.input[1], ones)
        return [node]
    unsqueezed = _fresh_name(graph, f"{node.input[1]}_aligned_for_{node.output[0]}")
    unsqueeze = helper.make_node(
        "Unsqueeze", [node.input[1]], [unsqueezed], axes=list(range(b_rank, b_rank + ones))
    )
    node.input[1] = unsqueezed
    return [unsqueeze, node]


def _weight(graph, name):
    """Return the initializer called name, or None."""
    return next((tensor for tensor in graph.initializer if tensor.name == name), None)


def _reshaped_weight(graph, name, ones):
    """Return the name of the weight reshaped with `ones` trailing ones.

    A weight other nodes (or a graph output) also read keeps its shape: the
    reshaped copy gets a new name, and is listed as an input where the weight
    was (IR < 4 lists every initializer as one).
    """
    from onnx import helper, numpy_helper

    weight = _weight(graph, name)
    array = numpy_helper.to_array(weight)
    array = array.reshape(array.shape + (1,) * ones)
    shared = _readers(graph, name) > 1 or any(out.name == name for out in graph.output)
    new_name = _fresh_name(graph, f"{name}_aligned") if shared else name
    reshaped = numpy_helper.from_array(array, new_name)
    listed = helper.make_tensor_value_info(new_name, weight.data_type, list(array.shape))
    inputs = [value for value in graph.input if value.name == name]
    if shared:
        graph.initializer.append(reshaped)
        graph.input.extend([listed] if inputs else [])
        return new_name
    weight.CopyFrom(reshaped)
    for value in inputs:
        value.CopyFrom(listed)
    return name


def _readers(graph, name):
    """Return how many node inputs read name, in the graph and its subgraphs."""
    from onnx import helper

    count = 0
    for node in graph.node:
        count += sum(1 for used in node.input if used == name)
        for attribute in node.attribute:
            value = helper.get_attribute_value(attribute)
            for subgraph in value if isinstance(value, list) else [value]:
                count += _readers(subgraph, name) if hasattr(subgraph, "node") else 0
    return count


def _fresh_name(graph, stem):
    """Return stem, or stem with a number, that no value in the graph is called yet."""
    taken = {tensor.name for tensor in graph.initializer} | {v.name for v in graph.input}
    taken |= {output for node in graph.node for output in node.output}
    return next(
        name for name in (stem, *(f"{stem}_{i}" for i in range(1, 1000))) if name not in taken
    )


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
        raise CompileFailure(
            UNSUPPORTED, f"ONNX Runtime cannot load the converted model: {_one_line(error)}"
        ) from error
    try:
        reference = ReferenceEvaluator(model, new_ops=legacy_operators(model))
        expected = [reference.run(None, feed) for feed in feeds]
    except Exception as error:
        raise CompileFailure(
            UNSUPPORTED,
            f"the ONNX reference evaluator cannot run the source, so the "
            f"conversion cannot be checked: {_one_line(error)}",
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

    Before opset 7, the LEGACY_BROADCAST operators broadcast only when asked
    (broadcast=1), aligning the second input at `axis`; the evaluator
    broadcasts the numpy way, which differs as soon as axis is given.
    """
    from onnx.reference.op_run import OpRun

    if (default_opset(model) or MIN_OPSET) >= MIN_OPSET:
        return None

    def legacy(numpy_op):
        def _run(self, a, b, broadcast=None, axis=None, consumed_inputs=None):
            if broadcast and axis is not None:
                axis += a.ndim if axis < 0 else 0
                b = b.reshape(b.shape + (1,) * (a.ndim - axis - b.ndim))
            result = numpy_op(a, b)
            return (result if result.dtype == bool else result.astype(a.dtype),)

        return _run

    return [
        type(name, (OpRun,), {"op_domain": "", "_run": legacy(numpy_op)})
        for name, numpy_op in LEGACY_BROADCAST.items()
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
