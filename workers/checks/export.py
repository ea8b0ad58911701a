"""Turn a PyTorch `torch.export` program (.pt2) into an ONNX model with fixed shapes.

The result has the shape of "Export result" in docs/protocol.md. torch is
imported inside the functions, so a worker without it still runs every other
kind of job. The hub never loads a .pt2: this runs on a worker only.
"""

import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workers.errors import JobError
from workers.measure import feeds

NO_TORCH = "this worker has no PyTorch: install deployhub[torch] to run export jobs"
# torch.onnx's TorchScript-based exporter: the dynamo-based one needs onnxscript.
MIN_OPSET, MAX_OPSET = 7, 20
ERROR_MAX_CHARS = 300
# A difference relative to an output that is all zeros is measured against this instead.
TINY = 1e-12
# Dtypes we can draw random inputs for and hand to ONNX Runtime as numpy arrays.
SUPPORTED_DTYPES = (
    "float32",
    "float16",
    "float64",
    "int64",
    "int32",
    "int8",
    "uint8",
    "bool",
)


@dataclass(frozen=True)
class Settings:
    """What an export job asks for, read from its params."""

    input_shapes: dict = field(default_factory=dict)
    opset: int = 17
    seed: int = 0
    samples: int = 4


@dataclass(frozen=True)
class ProgramInput:
    """One user input of the program: its name there, its ONNX name, shape and dtype."""

    name: str
    onnx_name: str
    shape: tuple
    dtype: object


def export_pt2_to_onnx(pt2_path, out_path, params, progress=None):
    """Export a .pt2 program to a single-file ONNX model at out_path and verify it.

    The ONNX model gets the fixed shapes of params["input_shapes"]; then it
    must pass the ONNX checker, and ONNX Runtime must agree with the program on
    `samples` random inputs. progress(fraction, message) is called per phase.
    """
    torch = _import_torch()
    settings = read_settings(params)
    report = progress or _ignore_progress
    report(0.0, "loading the program")
    program = load_program(pt2_path)
    inputs = match_inputs(program, settings.input_shapes)
    module = program.module()
    samples = random_samples(inputs, settings.samples, settings.seed)
    expected = [run_program(module, sample) for sample in samples]
    report(0.2, "exporting to ONNX")
    output_names = _output_names(len(expected[0]))
    export_module(module, samples[0], out_path, settings.opset, inputs, output_names)
    report(0.6, "checking the ONNX model")
    check_onnx(out_path)
    report(0.7, "comparing ONNX Runtime with PyTorch")
    onnx_inputs = [spec.onnx_name for spec in inputs]
    diffs = compare_with_onnxruntime(out_path, onnx_inputs, samples, expected, report)
    report(1.0, "done")
    return {
        "opset": settings.opset,
        "torch_version": torch.__version__,
        "onnx_bytes": Path(out_path).stat().st_size,
        **diffs,
        "samples": settings.samples,
        "input_shapes": {spec.onnx_name: list(spec.shape) for spec in inputs},
        "outputs": output_names,
    }


def read_settings(params):
    """Return the export Settings from a job's params, checking them."""
    params = params or {}
    defaults = Settings()
    settings = Settings(
        input_shapes=_read_input_shapes(params.get("input_shapes")),
        opset=int(params.get("opset", defaults.opset)),
        seed=int(params.get("seed", defaults.seed)),
        samples=int(params.get("samples", defaults.samples)),
    )
    if not MIN_OPSET <= settings.opset <= MAX_OPSET:
        raise JobError(
            f"export param opset must be between {MIN_OPSET} and {MAX_OPSET} "
            f"(torch.onnx's TorchScript-based exporter), got {settings.opset}"
        )
    if settings.samples < 1:
        raise JobError(f"export param samples must be at least 1, got {settings.samples}")
    return settings


def load_program(pt2_path):
    """Load a torch.export program; raise JobError when the file is not one."""
    import torch

    what = f"{Path(pt2_path).name} is not a PyTorch export program (.pt2 from torch.export.save)"
    # torch logs a long traceback before failing on a file that is not even a zip.
    if not zipfile.is_zipfile(pt2_path):
        raise JobError(f"{what}: it is not a zip archive")
    try:
        return torch.export.load(str(pt2_path))
    except Exception as error:
        raise JobError(f"{what}: {_first_line(error)}") from error


def match_inputs(program, input_shapes):
    """Pair the program's user inputs, in its order, with the fixed shapes to export at.

    The shapes match the program's inputs by name; when none of the names is
    the program's, they are taken in order and their names become the ONNX
    input names (the version's contract names them).
    """
    names, metas = _user_inputs(program)
    given = list(input_shapes)
    if len(given) != len(names):
        raise JobError(
            f"the program takes {len(names)} input(s) ({', '.join(names)}) but input_shapes "
            f"gives {len(given)} ({', '.join(given) or 'none'})"
        )
    unknown = [name for name in given if name not in names]
    if not unknown:
        given = names
    elif len(unknown) < len(given):
        raise JobError(
            f"input_shapes names {', '.join(unknown)}, which the program does not take "
            f"(its inputs: {', '.join(names)})"
        )
    return [
        _program_input(name, onnx_name, input_shapes[onnx_name], meta)
        for name, onnx_name, meta in zip(names, given, metas, strict=True)
    ]


def random_samples(inputs, count, seed=0):
    """Return `count` tuples of random tensors, one per input, drawn from `seed`.

    The arrays are workers/measure/feeds.py's synthetic feeds at the fixed export shapes.
    """
    import torch

    model_io = {"inputs": [_feeds_input(spec) for spec in inputs], "contract": None}
    samples = []
    for index in range(count):
        fed = feeds.synthetic_feeds(model_io, seed=seed + index)
        samples.append(tuple(torch.from_numpy(fed[spec.onnx_name]) for spec in inputs))
    return samples


def _feeds_input(spec):
    """Return a program input as workers/measure/feeds.py reads one (name, dtype, fixed shape)."""
    dtype = str(spec.dtype).removeprefix("torch.")
    return {"name": spec.onnx_name, "dtype": dtype, "shape": [int(dim) for dim in spec.shape]}


def run_program(module, sample):
    """Run the program on one sample; return its outputs as a list of numpy arrays."""
    import torch

    try:
        with torch.no_grad():
            outputs = module(*sample)
    except Exception as error:
        shapes = ", ".join(str(list(tensor.shape)) for tensor in sample)
        raise JobError(
            f"the program refuses inputs of shapes {shapes}: {_first_line(error)}"
        ) from error
    return [_to_numpy(tensor) for tensor in _leaves(outputs)]


def export_module(module, sample, out_path, opset, inputs, output_names):
    """Export the program's module to ONNX at fixed shapes with TorchScript tracing."""
    import torch

    # The module refuses train()/eval() (its graph is fixed already), but the
    # exporter reads the flag to pick inference ops (BatchNorm without batch
    # statistics): set it, and ask the exporter to leave it as it is.
    for submodule in module.modules():
        submodule.training = False
    try:
        with warnings.catch_warnings():
            _quiet_expected_warnings(torch)
            torch.onnx.export(
                module,
                sample,
                str(out_path),
                dynamo=False,
                opset_version=opset,
                input_names=[spec.onnx_name for spec in inputs],
                output_names=output_names,
                training=torch.onnx.TrainingMode.PRESERVE,
                do_constant_folding=True,
            )
    except Exception as error:
        raise JobError(
            f"torch.onnx.export could not convert the program: {_first_line(error)}"
        ) from error


def check_onnx(path):
    """Run the full ONNX checker; refuse a model that needs external data files."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as error:
        raise JobError(
            f"the exported ONNX model fails the checker: {_first_line(error)}"
        ) from error
    model = onnx.load(str(path), load_external_data=False)
    if any(uses_external_data(tensor) for tensor in model.graph.initializer):
        raise JobError("the exported ONNX model needs external data (over 2 GB): not supported yet")


def compare_with_onnxruntime(path, input_names, samples, expected, progress=None):
    """Run the ONNX model on the samples; return its largest differences from expected."""
    import onnxruntime as ort

    report = progress or _ignore_progress
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    diffs = []
    for index, (sample, wanted) in enumerate(zip(samples, expected, strict=True)):
        feeds = {name: _to_numpy(tensor) for name, tensor in zip(input_names, sample, strict=True)}
        diffs += _compare_outputs(session.run(None, feeds), wanted)
        report(0.7 + 0.3 * (index + 1) / len(samples), "comparing ONNX Runtime with PyTorch")
    return {
        "max_abs_diff": max(abs_diff for abs_diff, _ in diffs),
        "max_rel_diff": max(rel_diff for _, rel_diff in diffs),
    }


def output_difference(name, actual, reference, against="PyTorch"):
    """Return (largest absolute difference, that relative to the largest |reference|).

    Values equal in both (NaN in both included) differ by 0; a non-finite
    difference means one side went NaN or infinite alone, and is refused.
    against names what computed the reference, for the errors.
    """
    if actual.shape != reference.shape:
        raise JobError(
            f"output {name} has shape {list(actual.shape)} in ONNX Runtime and "
            f"{list(reference.shape)} in {against}"
        )
    actual, reference = actual.astype(np.float64), reference.astype(np.float64)
    same = (actual == reference) | (np.isnan(actual) & np.isnan(reference))
    diff = np.where(same, 0.0, np.abs(actual - reference))
    if not np.isfinite(diff).all():
        raise JobError(
            f"output {name} is NaN or infinite in only one of ONNX Runtime and {against}"
        )
    if diff.size == 0:
        return 0.0, 0.0
    scale = np.abs(np.where(np.isfinite(reference), reference, 0.0)).max()
    largest = float(diff.max())
    return largest, largest / max(float(scale), TINY)


def _import_torch():
    """Return the torch module, or raise the JobError telling how to install it."""
    try:
        import torch
    except ImportError as error:
        raise JobError(NO_TORCH) from error
    return torch


def _read_input_shapes(value):
    """Return {name: (dims...)} from params' input_shapes, checking every shape is fixed."""
    if not isinstance(value, dict) or not value:
        raise JobError(
            "an export job needs params.input_shapes: {input name: [fixed dims]}, "
            "from the version's input-shape contract"
        )
    shapes = {}
    for name, dims in value.items():
        if not isinstance(dims, list | tuple) or not all(_is_positive_int(dim) for dim in dims):
            raise JobError(
                f"input_shapes[{name!r}] must be a list of positive integers (fixed shapes), "
                f"got {dims!r}"
            )
        shapes[str(name)] = tuple(dims)
    return shapes


def _user_inputs(program):
    """Return the program's user input names and their example values (fake tensors)."""
    import torch

    names = list(program.graph_signature.user_inputs)
    values = {node.name: node.meta.get("val") for node in program.graph.nodes}
    metas = [values.get(name) for name in names]
    for name, meta in zip(names, metas, strict=True):
        if not isinstance(meta, torch.Tensor):
            raise JobError(f"the program's input {name!r} is not a tensor: not supported")
    return names, metas


def _program_input(name, onnx_name, shape, meta):
    """Return the ProgramInput for one program input, checking its rank and dtype."""
    if len(shape) != meta.dim():
        raise JobError(
            f"input {onnx_name!r} has {meta.dim()} dimensions in the program, "
            f"input_shapes gives {list(shape)}"
        )
    dtype_name = str(meta.dtype).removeprefix("torch.")
    if dtype_name not in SUPPORTED_DTYPES:
        raise JobError(
            f"input {onnx_name!r} has dtype {dtype_name}; supported: {', '.join(SUPPORTED_DTYPES)}"
        )
    return ProgramInput(name=name, onnx_name=onnx_name, shape=shape, dtype=meta.dtype)


def _compare_outputs(got, wanted):
    """Return (abs, rel) differences of each output of one sample."""
    if len(got) != len(wanted):
        raise JobError(f"the ONNX model has {len(got)} outputs, the program {len(wanted)}")
    names = _output_names(len(got))
    return [output_difference(*args) for args in zip(names, got, wanted, strict=True)]


def _leaves(value):
    """Return the tensors of a (possibly nested) output, in order."""
    if isinstance(value, list | tuple):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


def _to_numpy(tensor):
    """Return a tensor's values as a numpy array."""
    return tensor.detach().cpu().numpy()


def _output_names(count):
    """Return the ONNX output names: "output", or "output_0", "output_1", ..."""
    return ["output"] if count == 1 else [f"output_{index}" for index in range(count)]


def _quiet_expected_warnings(torch):
    """Silence the warnings this export always raises and that are not the user's business."""
    # We choose the TorchScript-based exporter (the dynamo one needs onnxscript),
    # and it warns about its own internals being deprecated.
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx")
    # TrainingMode.PRESERVE triggers it; the module is not training (see export_module).
    warnings.filterwarnings("ignore", message="It is recommended that constant folding be turned")
    # The program's input guards compare sizes in Python; with fixed shapes that is the point.
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)


def _first_line(error):
    """Return the first line of an error, naming its type, cut to a readable length."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else ""
    return (f"{type(error).__name__}: {text}" if text else type(error).__name__)[:ERROR_MAX_CHARS]


def _is_positive_int(value):
    """Return True for an int (not a bool) greater than zero."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _ignore_progress(fraction, message):
    """Accept a progress report and do nothing with it."""
