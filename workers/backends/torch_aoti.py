"""PyTorch AOTInductor: a torch.export program compiled into a package for the CPU or a GPU.

The source is a `.pt2` program from `torch.export.save`. The artifact is
`engine.pt2`, the package `torch._inductor.aoti_compile_and_package` writes:
generated C++ (and, on CUDA, Triton kernels) built into a shared library that
links against libtorch, with the weights; `torch._inductor.aoti_load_package`
loads it. So its key holds torch's version and the machine architecture, and:

- on CUDA, the CUDA runtime and the GPU's compute capability the kernels are
  for. The host code is compiled for the plain x86-64 baseline without a
  vector ISA, so the host CPU is not in the key;
- on the CPU, the CPU's ISA level and the extensions inductor's vector code
  uses (VNNI, AVX-512 BF16, AMX). Inductor compiles with `-march=native` by
  default, which would tie the package to the build host's exact CPU; we
  compile for the ISA level instead (`x86-64-v4` for avx512), so the package
  runs on any CPU with the same level and extensions. CPU builds are x86 only.

Precision fp16 or bf16 casts the program's floating parameters, buffers and
inputs and exports it again; the engine still takes and returns float32 arrays
(`infer` casts at the boundary). The benchmark reads a package's input names,
shapes and types from its source program: `input_metas_from_pt2`.
"""

import platform
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from workers.backends import artifacts
from workers.backends.base import (
    Backend,
    BuildLog,
    CompileResult,
    cpu_flags,
    cpu_isa,
    cuda_version,
    gpu_compute_capability,
    tool_version,
    with_defaults,
)
from workers.errors import JobError

DEVICES = ("cpu", "cuda")
DEFAULT_DEVICE = "cpu"
# Build config precision -> the torch dtype the program is cast to (None: left as exported).
PRECISIONS = {"fp32": None, "fp16": "float16", "bf16": "bfloat16"}
DEFAULT_PRECISION = "fp32"
CONFIG_KEYS = ("device", "precision", "max_autotune")
ENGINE_FILE = "engine.pt2"
X86_MACHINES = ("x86_64", "AMD64")
# CPU flags (as the fingerprint names them) that inductor's vector ISA compiles code for.
CPU_EXTENSIONS = ("avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
# torch's CPU capability -> the -march the generated C++ is compiled for on x86.
MARCH = {"avx512": "x86-64-v4", "avx2": "x86-64-v3"}
BASELINE_MARCH = "x86-64"
# torch dtype -> the type name ONNX Runtime's NodeArg gives, which the benchmark reads.
ONNX_TYPES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "bfloat16": "tensor(bfloat16)",
    "float64": "tensor(double)",
    "int64": "tensor(int64)",
    "int32": "tensor(int32)",
    "int8": "tensor(int8)",
    "uint8": "tensor(uint8)",
    "bool": "tensor(bool)",
}
# Generated kernels: cpp_fused_relu_0 on the CPU, triton_poi_fused_add_0 (poi, red, per, tem).
KERNEL_NAME = re.compile(r"\b(?:cpp|triton_[a-z]+)_fused\w*")
# Calls into torch's own kernels (convolution, addmm_out) through AOTInductor's C shim.
LIBRARY_CALL = re.compile(r"\baoti_torch_(?:cpu|cuda)_(\w+)\(")


@dataclass(frozen=True)
class InputMeta:
    """One program input as the benchmark reads it, like ONNX Runtime's NodeArg."""

    name: str
    shape: list  # ints, and symbol names ("s77") for dynamic dimensions
    type: str  # "tensor(float)"


@dataclass
class LoadedPackage:
    """A loaded package, the device its inputs go to and the dtype its float inputs take."""

    model: object  # torch._inductor's AOTICompiledModel
    device: str
    dtype: object  # torch.dtype, or None to pass float inputs as given
    source: str = "AOTInductor package"  # what the runner's log says it loaded


class TorchAotiBackend(Backend):
    """AOTInductor packages (torch._inductor.aoti_compile_and_package)."""

    name = "torch-aoti"
    runtime = "torch"
    extra = "torch"
    source_format = "pt2"
    source_label = "a torch.export program (.pt2)"
    dynamic_shapes_slow = "AOTInductor compiles fixed shapes best; fix them in the contract"
    auto_builds = {"fp32": {}}

    @classmethod
    def artifact_problem(cls, path):
        """A PT2 archive (aoti_compile_and_package's zip) carrying AOTInductor code."""
        return artifacts.pt2_package_problem(path, "data/aotinductor/", "archive_format", b"pt2")

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        """Return torch, its CUDA, the device and architecture, and the GPU or CPU it targets."""
        torch = (fingerprint or {}).get("torch")
        cuda = torch.get("cuda") if isinstance(torch, dict) else None
        fields = {
            "torch": tool_version(fingerprint, "torch"),
            "cuda": cuda or cuda_version(fingerprint, "runtime"),
            "device": device_of(build_config),
            "machine": machine(fingerprint),
        }
        if fields["device"] == "cuda":
            fields["compute_capability"] = gpu_compute_capability(fingerprint)
        else:
            fields["cpu_isa"] = cpu_isa(fingerprint)
            fields["cpu_extensions"] = cpu_extensions(cpu_flags(fingerprint))
        return fields

    @classmethod
    def canonical_config(cls, build_config):
        """Return the config with its device, precision and max_autotune."""
        defaults = {"device": DEFAULT_DEVICE, "precision": DEFAULT_PRECISION, "max_autotune": False}
        return with_defaults(build_config, defaults)

    @classmethod
    def check_config(cls, build_config):
        """Refuse unknown keys, devices and precisions, and a max_autotune that is not a bool."""
        config = build_config or {}
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise JobError(
                f"torch-aoti build config has unknown keys {unknown}; known: {list(CONFIG_KEYS)}"
            )
        if device_of(config) not in DEVICES:
            raise JobError(f"torch-aoti device {device_of(config)!r} is not one of {list(DEVICES)}")
        if precision_of(config) not in PRECISIONS:
            raise JobError(
                f"torch-aoti precision {precision_of(config)!r} is not one of {list(PRECISIONS)}"
            )
        if not isinstance(config.get("max_autotune", False), bool):
            raise JobError("torch-aoti max_autotune must be true or false")

    def compile(
        self,
        source,
        build_config,
        workdir,
        *,
        timing_cache=None,
        calibration=None,
        progress=None,
    ):
        """Load the .pt2 program, cast and move it as asked, compile and package it."""
        import torch

        from workers.checks.export import load_program

        self.check_config(build_config)
        config = build_config or {}
        device, precision = device_of(config), precision_of(config)
        check_device_here(device)
        build = BuildLog(progress)
        build.note(
            f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), "
            f"device {device}, precision {precision}"
        )
        if calibration is not None:
            build.note("the calibration input is not used: AOTInductor builds have no int8")
        with build.stage(0.05, f"loading {Path(source).name}"):
            program = load_program(source)
        before = program_histogram(program)
        if precision != DEFAULT_PRECISION or device != DEFAULT_DEVICE:
            with build.stage(0.1, f"retargeting the program to {device}, {precision}"):
                program = retarget(program, device, precision)
        options = inductor_configs(config, device, cpu_capability(), platform.machine())
        package = Path(workdir) / ENGINE_FILE
        with build.stage(0.2, f"compiling with AOTInductor, inductor configs {options}"):
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(package), inductor_configs=options
            )
        report = graph_report(before, package)
        build.notes += report["fused"]
        build.note(f"artifact {package.name}: {package.stat().st_size} bytes")
        build.report(1.0, "built")
        return CompileResult(
            artifact=package,
            log=build.log(),
            tool_versions={"torch": torch.__version__, "cuda": torch.version.cuda},
            graph_report=report,
        )

    def load(self, artifact, build_config):
        """Load a package onto its device; return the handle infer runs."""
        import torch

        device = device_of(build_config)
        check_device_here(device)
        model = torch._inductor.aoti_load_package(str(artifact))
        dtype = PRECISIONS[precision_of(build_config)]
        return LoadedPackage(model, device, getattr(torch, dtype) if dtype else None)

    def infer(self, handle, feeds):
        """Run the package on the feeds' values, in order; return every output as numpy.

        Float inputs are cast to the engine's precision and float outputs back
        to float32, so an fp16 or bf16 engine takes and gives what its source does.
        """
        import torch

        from workers.checks.export import _leaves

        inputs = [_to_tensor(torch, array, handle) for array in feeds.values()]
        with torch.inference_mode():
            outputs = handle.model(*inputs)
        return [_to_numpy(torch, tensor, handle) for tensor in _leaves(outputs)]


def device_of(build_config):
    """Return the device a build config compiles for: "cpu" or "cuda"."""
    return (build_config or {}).get("device") or DEFAULT_DEVICE


def precision_of(build_config):
    """Return the precision a build config asks for: "fp32", "fp16" or "bf16"."""
    return (build_config or {}).get("precision") or DEFAULT_PRECISION


def machine(fingerprint):
    """Return the fingerprint's machine architecture ("x86_64"), None when unknown."""
    system = (fingerprint or {}).get("os")
    return system.get("machine") if isinstance(system, dict) else None


def cpu_extensions(flags):
    """Return which of the extensions inductor's vector code uses the CPU has; None if unknown."""
    if flags is None:
        return None
    return [flag for flag in CPU_EXTENSIONS if flag in flags]


def cpu_capability():
    """Return the vector ISA torch dispatches to on this CPU ("avx512", "avx2", "default")."""
    import torch

    return torch.backends.cpu.get_cpu_capability().lower()


def inductor_configs(build_config, device, capability, machine_name):
    """Return the inductor configs of a build: autotuning, and the CPU the C++ is built for.

    On x86 the CPU code is compiled for torch's ISA level, not `-march=native`;
    CUDA host code for the baseline, without vector ISA (simdlen 0). Elsewhere
    inductor's defaults stand.
    """
    options = {"max_autotune": True} if (build_config or {}).get("max_autotune") else {}
    if machine_name not in X86_MACHINES:
        return options
    if device == "cpu":
        return {**options, "cpp.march": MARCH.get(capability, BASELINE_MARCH)}
    return {**options, "cpp.march": BASELINE_MARCH, "cpp.simdlen": 0}


def check_device_here(device, machine_name=None):
    """Raise JobError when this worker cannot build or run packages for the device."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise JobError(no_cuda_message(torch))
    machine_name = machine_name or platform.machine()
    if device == "cpu" and machine_name not in X86_MACHINES:
        raise JobError(
            f"torch-aoti builds for the CPU on x86-64 workers only (their key is an x86 ISA "
            f"level); this worker is {machine_name}: build for device 'cuda' here"
        )


def no_cuda_message(torch):
    """Return why torch cannot use a CUDA GPU here, in words the failure classifier knows."""
    from workers.checks.export import _first_line

    if torch.version.cuda is None:
        why = f"this worker's torch {torch.__version__} is a CPU-only build"
    else:
        why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU"
        try:
            torch.cuda.init()
        except Exception as error:  # its message says why: no driver, an old driver, ...
            why += f" ({_first_line(error)})"
    # "install deployhub[" is what isolate.classify reads as runtime_missing.
    return (
        f"no CUDA GPU: {why}; build device 'cuda' on a worker with an NVIDIA GPU, "
        "where you install deployhub[torch] with a CUDA build of torch"
    )


def retarget(program, device, precision):
    """Return the program cast to the precision (exported again) and moved to the device."""
    import torch

    dtype = PRECISIONS[precision]
    if dtype:
        program = _cast(program, getattr(torch, dtype))
    if device != DEFAULT_DEVICE:
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    return program


def program_histogram(program):
    """Return {"nodes": n, "operators": {target: count}} of a program's call_function nodes."""
    counts = Counter(str(node.target) for node in program.graph.nodes if node.op == "call_function")
    return {"nodes": sum(counts.values()), "operators": dict(sorted(counts.items()))}


def graph_report(before, package):
    """Return the exported ops, the package's generated kernels and library calls, a summary.

    "after" is read from the C++ sources the package keeps: each generated
    kernel once, each call into torch's kernels per call site. Without sources
    the kernels are "n/a".
    """
    kernels, calls = generated_code(package)
    if kernels is None:
        line = f"nodes: {before['nodes']} exported ops; the package keeps no sources to count"
        return {"before": before, "after": {"kernels": "n/a"}, "fused": [line]}
    operators = {name: 1 for name in kernels}
    operators.update({f"{op} (library call)": count for op, count in sorted(calls.items())})
    after = {
        "nodes": len(kernels) + calls.total(),
        "kernels": len(kernels),
        "library_calls": calls.total(),
        "operators": operators,
    }
    line = (
        f"nodes: {before['nodes']} exported ops → {len(kernels)} generated kernels "
        f"and {calls.total()} calls into torch's kernels"
    )
    return {"before": before, "after": after, "fused": [line]}


def generated_code(package):
    """Return (sorted generated kernel names, Counter of library ops) of a package's sources.

    Both are None when the package holds no C++ source.
    """
    import zipfile

    with zipfile.ZipFile(package) as archive:
        sources = [
            archive.read(name).decode(errors="replace")
            for name in archive.namelist()
            if name.endswith(".cpp")
        ]
    if not sources:
        return None, None
    text = "\n".join(sources)
    return sorted(set(KERNEL_NAME.findall(text))), Counter(LIBRARY_CALL.findall(text))


def input_metas_from_pt2(path, batch_size=None):
    """Return the program's inputs as the benchmark reads them (name, shape, type).

    A dynamic first dimension becomes batch_size, or stays its symbol name
    ("s77") without one, which the benchmark fills with the job's batch size;
    later dynamic dimensions stay symbol names, which the benchmark refuses.
    """
    from workers.checks.export import _user_inputs, load_program

    names, metas = _user_inputs(load_program(path))
    return [
        InputMeta(name, _feed_shape(meta.shape, batch_size), _onnx_type(meta.dtype))
        for name, meta in zip(names, metas, strict=True)
    ]


def _feed_shape(shape, batch_size):
    """Return a program input's shape with a dynamic first dimension as batch_size."""
    sizes = [dim if isinstance(dim, int) else str(dim) for dim in shape]
    if sizes and isinstance(sizes[0], str) and batch_size:
        sizes[0] = batch_size
    return sizes


def _onnx_type(dtype):
    """Return a torch dtype as ONNX Runtime names it ("tensor(float)")."""
    name = str(dtype).removeprefix("torch.")
    return ONNX_TYPES.get(name, f"tensor({name})")


def _cast(program, dtype):
    """Return the program with floating parameters, buffers and inputs in dtype, exported again.

    Dynamic dimensions stay dynamic, over the same ranges.
    """
    import torch

    from workers.checks.export import _first_line, _user_inputs

    _, metas = _user_inputs(program)
    dims = {}
    examples, specs = [], []
    for meta in metas:
        example, spec = _example_input(torch, program, meta, dims)
        examples.append(example.to(dtype) if example.is_floating_point() else example)
        specs.append(spec)
    module = program.module().to(dtype)
    try:
        return torch.export.export(
            module, tuple(examples), dynamic_shapes=tuple(specs) if dims else None
        )
    except Exception as error:
        raise JobError(
            f"the program could not be exported again in {str(dtype).removeprefix('torch.')}: "
            f"{_first_line(error)}"
        ) from error


def _example_input(torch, program, meta, dims):
    """Return (a zero tensor like the program input, its dynamic dimensions {position: Dim})."""
    sizes, spec = [], {}
    for position, dim in enumerate(meta.shape):
        if isinstance(dim, int):
            sizes.append(dim)
            continue
        expr = dim.node.expr
        bounds = program.range_constraints.get(expr)
        sizes.append(_hint(dim, bounds))
        spec[position] = dims.setdefault(str(expr), _dim(torch, expr, bounds))
    return torch.zeros(sizes, dtype=meta.dtype), spec


def _hint(dim, bounds):
    """Return the size a dynamic dimension was exported at, else one inside its range."""
    hint = dim.node.hint
    if hint is not None:
        return int(hint)
    lower = int(bounds.lower) if bounds is not None else 2
    return max(lower, 2)


def _dim(torch, expr, bounds):
    """Return the torch.export Dim of a symbol over its range; AUTO for a derived dimension."""
    from torch.utils._sympy.numbers import int_oo

    if bounds is None or not expr.is_Symbol:
        return torch.export.Dim.AUTO
    limits = {"min": int(bounds.lower)}
    if bounds.upper != int_oo:
        limits["max"] = int(bounds.upper)
    return torch.export.Dim(str(expr), **limits)


def _to_tensor(torch, array, handle):
    """Return a feed as a tensor on the package's device, floats in its dtype."""
    import numpy as np

    tensor = torch.from_numpy(np.ascontiguousarray(array)).to(handle.device)
    if handle.dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(handle.dtype)
    return tensor


def _to_numpy(torch, tensor, handle):
    """Return an output as a numpy array; in float32 if the engine's cast made it, or bf16.

    numpy has no bf16, and an fp16 engine of a float32 program answers in float32.
    """
    if tensor.dtype == torch.bfloat16 or (handle.dtype and tensor.dtype == handle.dtype):
        tensor = tensor.float()
    return tensor.detach().cpu().numpy()
