"""What a build did to the graph: operators before and after, and what was fused.

The findings are simple heuristics read from the two ONNX files, honest about
what they count: Conv+BatchNormalization(+Relu) groups in the source and,
in the built model, convolutions that carry their activation, INT8 operators,
quantize/dequantize boundaries, layout reorders and casts. Pure: it reads
the graphs (subgraphs included), never tensor data, and needs only `onnx`.
"""

from collections import Counter

DEFAULT_DOMAINS = ("", "ai.onnx")
CONV_OPS = ("Conv", "FusedConv", "QLinearConv", "ConvInteger", "NhwcFusedConv")
# Operators that compute in integers: QLinear* and these.
INT8_OPS = (
    "ConvInteger",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "QGemm",
    "QAttention",
    "DynamicQuantizeMatMul",
)
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
LAYOUT_OPS = ("ReorderInput", "ReorderOutput", "Transpose")
# Operators that quantise or compute in INT8, in ONNX graphs and in OpenVINO models.
QUANTIZED_OPS = (*QDQ_OPS, *INT8_OPS, "FakeQuantize", "FakeConvert")
NOTHING_QUANTISED = "nothing quantised: this int8 build runs in float, as the fp32 build does"


def onnx_graph_report(before_path, after_path):
    """Return {"before": .., "after": .., "fused": [findings]} for a source and its build."""
    before, after = _load(before_path), _load(after_path)
    return {
        "before": histogram(before),
        "after": histogram(after),
        "fused": findings(before, after),
    }


def histogram(model):
    """Return {"nodes": n, "operators": {op: count}} of a model, subgraphs included."""
    counts = Counter(op_name(node) for node in nodes_of(model))
    return {"nodes": sum(counts.values()), "operators": dict(sorted(counts.items()))}


def quantized_nodes(counts):
    """Return how many nodes of a histogram quantise or compute in INT8 (QDQ, QLinear*, ...).

    An int8 build with none quantised nothing: its graph had no operator the
    quantiser takes, and it runs in float like the fp32 build.
    """
    return sum(
        count
        for op, count in counts["operators"].items()
        if (kind := op.rsplit(".", 1)[-1]).startswith("QLinear") or kind in QUANTIZED_OPS
    )


def quantised_by_authors(counts):
    """Return how a source graph is quantised already, "" when it is not.

    counts is a histogram ({"operators": {op: count}}, domain-prefixed names).
    Such a source runs as INT8 as it is: a build that quantises it again would
    quantise it twice (ONNX Runtime's quantiser breaks on its Q/DQ pairs).
    """
    found = Counter()
    for op, count in counts.get("operators", {}).items():
        kind = op.rsplit(".", 1)[-1]
        if kind in QDQ_OPS:
            found["QuantizeLinear/DequantizeLinear"] += count
        elif kind.startswith("QLinear") or kind in QUANTIZED_OPS:
            found[kind] += count
    if not found:
        return ""
    pairs = found.pop("QuantizeLinear/DequantizeLinear", 0)
    parts = [f"{pairs} QuantizeLinear/DequantizeLinear nodes"] if pairs else []
    if found:
        described = ", ".join(f"{op} {count}" for op, count in sorted(found.items()))
        parts.append(f"{sum(found.values())} integer operators: {described}")
    return (
        f"already quantised by its authors ({'; '.join(parts)}): it runs as INT8 as it is; "
        "an INT8 build would quantise it twice"
    )


def findings(before, after):
    """Return readable lines saying what the build fused, folded, quantised or added."""
    before_ops, after_ops = _short_counts(before), _short_counts(after)
    lines = [f"nodes: {sum(before_ops.values())} → {sum(after_ops.values())}"]
    lines += _conv_group_lines(before, after, before_ops, after_ops)
    lines += _int8_lines(after_ops, before_ops)
    lines += _added_lines(before_ops, after_ops)
    return lines


def op_name(node):
    """Return a node's operator as people read it: "Conv", or "com.microsoft.FusedConv"."""
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


def nodes_of(model):
    """Return every node of a model, those of subgraphs (If, Loop, Scan bodies) included."""
    return [node for graph in _graphs(model.graph) for node in graph.node]


def conv_groups(model):
    """Return (Conv+BatchNormalization+Relu groups, Conv+BatchNormalization groups without Relu).

    A group is a chain in one graph where each output feeds only the next node.
    """
    with_relu = without_relu = 0
    for graph in _graphs(model.graph):
        consumers = _consumers(graph)
        for node in graph.node:
            if node.op_type != "Conv" or node.domain not in DEFAULT_DOMAINS:
                continue
            norm = _only_consumer(node, consumers, "BatchNormalization")
            if norm is None:
                continue
            if _only_consumer(norm, consumers, "Relu") is not None:
                with_relu += 1
            else:
                without_relu += 1
    return with_relu, without_relu


def _conv_group_lines(before, after, before_ops, after_ops):
    """Return what became of the source's Conv+BatchNormalization(+Relu) groups."""
    with_relu, without_relu = conv_groups(before)
    groups = with_relu + without_relu
    lines = []
    if groups and after_ops["BatchNormalization"] == 0:
        convs = _conv_kinds(after)
        relu_gone = after_ops["Relu"] <= before_ops["Relu"] - with_relu
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(convs.items()))
        if with_relu and relu_gone:
            lines.append(
                f"{with_relu} Conv+BatchNormalization+Relu groups became {with_relu} "
                f"nodes ({kinds})"
            )
        elif with_relu:
            lines.append(
                f"{with_relu} Conv+BatchNormalization+Relu groups became Conv+Relu: "
                "BatchNormalization folded into the weights, Relu kept"
            )
        if without_relu:
            lines.append(
                f"{without_relu} Conv+BatchNormalization groups became {without_relu} "
                "nodes (BatchNormalization folded into the weights)"
            )
    elif groups:
        lines.append(
            f"{after_ops['BatchNormalization']} BatchNormalization nodes were not "
            f"folded into their Conv ({groups} Conv+BatchNormalization groups before)"
        )
    activations = _fused_activations(after)
    if activations:
        described = ", ".join(f"{count} {act}" for act, count in sorted(activations.items()))
        lines.append(
            f"{sum(activations.values())} convolutions carry a fused activation ({described})"
        )
    return lines


def _int8_lines(after_ops, before_ops):
    """Return how much of the built model computes in INT8 and where it leaves it."""
    int8 = {op: n for op, n in after_ops.items() if op.startswith("QLinear") or op in INT8_OPS}
    lines = []
    if int8:
        described = ", ".join(f"{op} {count}" for op, count in sorted(int8.items()))
        lines.append(f"{sum(int8.values())} nodes compute in INT8 ({described})")
    quantize, dequantize = (after_ops[op] - before_ops[op] for op in QDQ_OPS)
    if quantize > 0 or dequantize > 0:
        lines.append(
            f"QuantizeLinear {max(quantize, 0)}, DequantizeLinear {max(dequantize, 0)} remain "
            "(where the graph enters and leaves INT8)"
        )
    return lines


def _added_lines(before_ops, after_ops):
    """Return the layout reorders and casts the build added."""
    lines = []
    layout = {op: after_ops[op] - before_ops[op] for op in LAYOUT_OPS}
    layout = {op: n for op, n in layout.items() if n > 0}
    if layout:
        described = ", ".join(f"{op} {count}" for op, count in layout.items())
        lines.append(f"added for layout: {described}")
    casts = after_ops["Cast"] - before_ops["Cast"]
    if casts > 0:
        lines.append(f"added Cast {casts} (type conversions, such as float32 ↔ float16)")
    return lines


def _conv_kinds(model):
    """Return {conv operator (with its activation): count} of a built model."""
    kinds = Counter()
    for node in nodes_of(model):
        if node.op_type in CONV_OPS:
            activation = _activation(node)
            suffix = f" with {activation}" if activation else ""
            kinds[f"{op_name(node)}{suffix}"] += 1
    return kinds


def _fused_activations(model):
    """Return {activation: count} over the built model's convolutions that carry one."""
    return Counter(
        _activation(node)
        for node in nodes_of(model)
        if node.op_type in CONV_OPS and _activation(node)
    )


def _activation(node):
    """Return a node's fused activation attribute ("Relu"), or None."""
    for attribute in node.attribute:
        if attribute.name == "activation" and attribute.s:
            return attribute.s.decode()
    return None


def _short_counts(model):
    """Return a Counter of operator types whatever their domain ("nchwc.Conv" counts as Conv)."""
    return Counter(node.op_type for node in nodes_of(model))


def _consumers(graph):
    """Return {tensor name: [nodes reading it]} of one graph (graph outputs count as readers)."""
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for output in graph.output:
        consumers.setdefault(output.name, []).append(None)
    return consumers


def _only_consumer(node, consumers, op_type):
    """Return the one node reading node's output when it is op_type, else None."""
    if len(node.output) != 1:
        return None
    readers = consumers.get(node.output[0], [])
    if len(readers) == 1 and readers[0] is not None and readers[0].op_type == op_type:
        return readers[0]
    return None


def _graphs(graph):
    """Yield a graph and, depth first, every subgraph inside it."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.HasField("g") else list(attribute.graphs)
            for subgraph in subgraphs:
                yield from _graphs(subgraph)


def _load(path):
    """Load an ONNX model's structure, leaving external tensor data on disk."""
    import onnx

    return onnx.load(str(path), load_external_data=False)
