"""Describe this device's hardware and toolchain (its fingerprint), and what changed in it.

The hub keys compiled engines on these fields, so a field that cannot be read
is reported as None, never guessed; an empty list means "queried, there are
none". Nothing here is volatile (no free memory, clocks or temperatures): the
same device reports the same fingerprint until its hardware or software
changes, so the hub can treat any difference as a change worth recording.

The hub imports `diff` and `isa_level`, so module-level imports stay light;
runtimes are imported inside the functions that read them.
"""

import copy
import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import sys
from functools import cache
from pathlib import Path

from workers.errors import JobError

SCHEMA = 2
CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
CPUINFO = Path("/proc/cpuinfo")
TOOLCHAINS = ("onnxruntime", "tensorrt", "openvino", "torch", "cudnn")
TORCH_PROBE_SECONDS = 120
CAPABILITIES_PROBE_SECONDS = 120


def collect():
    """Return this device's fingerprint as a JSON-able dict."""
    nvml = _nvml()
    torch = _torch()
    known = {
        "schema": SCHEMA,
        "os": _os(),
        "python": platform.python_version(),
        "hostname": socket.gethostname() or None,
        "cpu": _cpu(),
        "memory_mb": _memory_mb(),
        "gpus": nvml["gpus"],
        "nvidia_driver": nvml["driver"],
        "cuda": _cuda(nvml["cuda_driver_api"], torch),
        "torch": torch,
        "cudnn": None if torch is None or torch["cudnn"] is None else {"version": torch["cudnn"]},
        "capabilities": _capabilities_in_child(),
    }
    return {**_runtimes(known), **known}


def _runtimes(known):
    """Return {runtime: what its backend's probe_runtime() reports, None when absent} for each
    registered backend's runtime the fields above do not report (torch is one of them)."""
    from workers.backends.known import BACKENDS

    backends = {b.runtime: b for b in BACKENDS.values() if b.runtime not in known}
    return {runtime: backends[runtime].probe_runtime() for runtime in sorted(backends)}


def load_override(path, fingerprint=None):
    """Return the fingerprint (collected when not given) with a JSON file merged over it.

    The override lets tests pretend to be another device and lets an operator
    rehearse a driver or runtime upgrade before doing it. The file is read on
    every call, so a running worker reports an edited file at its next heartbeat.
    An override that changes the CPU flags changes the derived ISA level with
    them, unless it sets `cpu.isa_level` itself.
    """
    override = json.loads(Path(path).read_text())
    if not isinstance(override, dict):
        raise ValueError(f"fingerprint override {path} must hold a JSON object")
    merged = deep_merge(collect() if fingerprint is None else fingerprint, override)
    _rederive_isa_level(merged.get("cpu"), override.get("cpu"))
    return merged


def _rederive_isa_level(cpu, cpu_override):
    """Derive the ISA level again from overridden flags, unless the override sets it too."""
    if not (isinstance(cpu, dict) and isinstance(cpu_override, dict)):
        return
    if "flags" in cpu_override and "isa_level" in cpu and "isa_level" not in cpu_override:
        cpu["isa_level"] = isa_level(cpu.get("flags"))


def deep_merge(base, override):
    """Return a copy of base with override merged in, dict by dict."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def isa_level(flags):
    """Return the CPU's vector ISA level ("avx512", "avx2", "sse4", "baseline"), None if unknown.

    Runtimes pick kernels and memory layouts by this level, which is why an
    offline-optimised model or a compiled blob may not move between levels.
    """
    if flags is None:
        return None
    for level, flag in (("avx512", "avx512f"), ("avx2", "avx2"), ("sse4", "sse4_2")):
        if flag in flags:
            return level
    return "baseline"


def diff(old, new):
    """Return readable lines saying what changed from one fingerprint to the next.

    For people (a device's change history, an audit event), e.g.
    "NVIDIA driver 550.54.15 → 560.28.03" or "CPU flag avx512f removed".
    """
    old, new = old or {}, new or {}
    lines = []
    for key in _keys_in_order(old, new):
        before, after = old.get(key), new.get(key)
        if before != after:
            lines += _DESCRIBERS.get(key, _describe_other)(key, before, after)
    return lines


# The type of every field the hub reads (compatibility keys, preflight, diff, pages), as
# collect() reports them: a type, [shape] for a list of that shape, {field: shape} for an
# object, {ANY: shape} for an object whose every field has that shape. A field may be null
# (unknown) or absent; fields not named are kept as they are (an override may add one).
ANY = "*"
SHAPE = {
    "schema": int,
    "os": {"system": str, "release": str, "machine": str},
    "python": str,
    "hostname": str,
    "cpu": {"model": str, "count": int, "flags": [str], "isa_level": str},
    "memory_mb": int,
    "gpus": [{"index": int, "name": str, "uuid": str, "compute_capability": str, "memory_mb": int}],
    "nvidia_driver": str,
    "cuda": {"driver_api": str, "runtime": str},
    "torch": {"version": str, "cuda": str, "cudnn": str},
    "cudnn": {"version": str},
    "capabilities": {ANY: {ANY: {"ok": bool, "reason": str}}},
}
KINDS = {str: "text", int: "an integer", bool: "true or false", list: "a list", dict: "an object"}


def shape():
    """Return SHAPE with each registered backend's runtime entry (what _runtimes reports)."""
    from workers.backends.known import BACKENDS

    runtimes = {b.runtime: b.runtime_fields for b in BACKENDS.values() if b.runtime not in SHAPE}
    return {**SHAPE, **runtimes}


def shape_problem(fingerprint):
    """Say which field of a fingerprint the hub cannot read, and why; "" when it can read all.

    "fingerprint.os must be an object (or null), not text": readers take a field of the
    wrong type for another (a string's characters as CPU flags) or fail on it.
    """
    if not isinstance(fingerprint, dict):
        return f"fingerprint must be an object, not {_kind(fingerprint)}"
    return _shape_problem(fingerprint, shape(), "fingerprint")


def _shape_problem(value, expected, where):
    """Say where value, or a value inside it, is not of the expected shape ("" when all are)."""
    wanted = type(expected) if isinstance(expected, list | dict) else expected
    if not isinstance(value, wanted) or (isinstance(value, bool) and wanted is not bool):
        return f"{where[:120]} must be {KINDS[wanted]} (or null), not {_kind(value)}"
    if isinstance(expected, list):
        inside = ((f"{where}[{i}]", item, expected[0]) for i, item in enumerate(value))
    elif isinstance(expected, dict):
        fields = value if ANY in expected else [key for key in expected if key in value]
        inside = (
            (f"{where}.{key}", value[key], expected.get(key, expected.get(ANY))) for key in fields
        )
    else:
        return ""
    for place, item, inner in inside:
        if item is not None and (problem := _shape_problem(item, inner, place)):
            return problem
    return ""


def _kind(value):
    """Name a JSON value's type as people read it ("text", "a list", "null")."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float):
        return "a number with a fraction"
    return KINDS.get(type(value), type(value).__name__)


def _os():
    """Return the operating system's name, release and machine type."""
    return {
        "system": platform.system() or None,
        "release": platform.release() or None,
        "machine": platform.machine() or None,
    }


def _cpu():
    """Return the CPU model, logical core count, the ISA flags we care about and their level."""
    info = _cpuinfo_fields()
    flags = info.get("flags")
    known = None if flags is None else [f for f in CPU_FLAGS if f in flags.split()]
    return {
        "model": info.get("model name") or platform.processor() or None,
        "count": os.cpu_count(),
        "flags": known,
        "isa_level": isa_level(known),
    }


def cpu_flags_here():
    """Return the ISA flags DeployHub cares about of this machine's CPU, None if unreadable."""
    return _cpu()["flags"]


def _cpuinfo_fields():
    """Return the fields of the first processor in /proc/cpuinfo ({} if unreadable)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def _memory_mb():
    """Return the total RAM in MiB."""
    import psutil

    return psutil.virtual_memory().total // 2**20


def _nvml():
    """Return the GPUs, driver version and CUDA driver API version NVML reports (None each)."""
    unknown = {"gpus": None, "driver": None, "cuda_driver_api": None}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no pynvml, no driver, no libnvidia-ml: nothing can be read
        return unknown
    try:
        return {
            "gpus": _nvml_gpus(pynvml),
            "driver": _nvml_read(pynvml, lambda: _text(pynvml.nvmlSystemGetDriverVersion())),
            "cuda_driver_api": _nvml_read(pynvml, lambda: _cuda_version(pynvml)),
        }
    finally:
        _nvml_read(pynvml, pynvml.nvmlShutdown)


def _nvml_gpus(nvml):
    """Return each GPU's index, name, UUID, compute capability and memory (None if unreadable)."""
    count = _nvml_read(nvml, nvml.nvmlDeviceGetCount)
    if count is None:
        return None
    return [_nvml_gpu(nvml, index) for index in range(count)]


def _nvml_gpu(nvml, index):
    """Return one GPU's fields; a field NVML refuses is None."""
    handle = _nvml_read(nvml, lambda: nvml.nvmlDeviceGetHandleByIndex(index))
    if handle is None:
        return dict.fromkeys(("name", "uuid", "compute_capability", "memory_mb"), None) | {
            "index": index
        }
    capability = _nvml_read(nvml, lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    memory = _nvml_read(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    return {
        "index": index,
        "name": _nvml_read(nvml, lambda: _text(nvml.nvmlDeviceGetName(handle))),
        "uuid": _nvml_read(nvml, lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
        "compute_capability": None if capability is None else "{}.{}".format(*capability),
        "memory_mb": None if memory is None else memory.total // 2**20,
    }


def _nvml_read(nvml, read):
    """Return read(), or None when NVML refuses (old driver, unsupported query)."""
    try:
        return read()
    except nvml.NVMLError:
        return None


def _cuda_version(nvml):
    """Return the CUDA version the driver supports as "major.minor" (12040 -> "12.4")."""
    version = nvml.nvmlSystemGetCudaDriverVersion()
    return f"{version // 1000}.{version % 1000 // 10}"


def _text(value):
    """Return NVML's string, decoded when an older pynvml gives bytes."""
    return value.decode() if isinstance(value, bytes) else value


def _cuda(driver_api, torch):
    """Return the CUDA driver API version and the runtime torch was built with, or None."""
    runtime = None if torch is None else torch["cuda"]
    if driver_api is None and runtime is None:
        return None
    return {"driver_api": driver_api, "runtime": runtime}


def _torch():
    """Return torch's version and the CUDA and cuDNN it was built with, or None if absent."""
    version = installed_version("torch", ("torch",))
    if version is None:
        return None
    return {"version": version, **_torch_build()}


def _torch_build():
    """Return the CUDA runtime and cuDNN versions of torch (None each when unknown)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return {"cuda": torch.version.cuda, "cudnn": _cudnn_version(torch)}
    return _torch_build_in_child()


@cache
def _torch_build_in_child():
    """Ask a child Python what torch was built with; once per process.

    Importing torch here would add some 200 MB (far more with CUDA) to every
    benchmark's peak RSS and preload torch's CUDA and cuDNN libraries into the
    process ONNX Runtime runs in, so the worker keeps torch out until a job needs it.
    """
    try:
        build = _from_child("probe_torch_build", TORCH_PROBE_SECONDS)
        return {"cuda": build["cuda"], "cudnn": _cudnn_text(build["cudnn"])}
    except (OSError, JobError, KeyError, TypeError):
        return {"cuda": None, "cudnn": None}  # installed but broken: unknown


@cache
def _capabilities_in_child():
    """Ask a child Python which builds of each backend import what they need; once per process.

    {"onnxruntime": {"int8": {"ok": false, "reason": "sympy is missing: pip install ..."}}}:
    the hub's preflight reads it, as it cannot import anything on the device.
    The imports are real (a package name proves little) and heavy (sympy,
    NNCF, and torch where installed), so they stay out of the worker's process,
    whose memory benchmarks measure. None when the child cannot say.
    """
    try:
        capabilities = _from_child("probe_capabilities", CAPABILITIES_PROBE_SECONDS)
    except (OSError, JobError):
        return None
    return capabilities if isinstance(capabilities, dict) else None


def _from_child(probe, timeout):
    """Run one of the probes below in a build's child process; return what it returns.

    The child forks from the worker's warm build server (workers/backends/forkserver.py),
    which a worker starts here, at its first fingerprint: its first build starts warm.
    """
    from workers.backends.isolate import run_isolated

    return run_isolated(f"{__name__}.{probe}", {}, timeout=timeout)


def probe_torch_build():
    """Return torch's CUDA runtime and raw cuDNN version number (in a child process)."""
    import torch

    try:
        cudnn = torch.backends.cudnn.version()
    except Exception:  # cuDNN present but unloadable
        cudnn = None
    return {"cuda": torch.version.cuda, "cudnn": cudnn}


def probe_capabilities():
    """Return, per backend, which builds import what they need (in a child process)."""
    from workers.backends.known import BACKENDS

    return {name: b.capabilities() for name, b in BACKENDS.items() if b.build_imports}


def _cudnn_version(torch):
    """Return torch's cuDNN version as "major.minor.patch", or None without cuDNN."""
    try:
        number = torch.backends.cudnn.version()
    except Exception:  # cuDNN present but unloadable
        return None
    return _cudnn_text(number)


def _cudnn_text(number):
    """Return a cuDNN version number as "major.minor.patch" (90100 -> "9.1.0"), None if none."""
    if not number:
        return None
    # cuDNN 9 encodes major*10000 + minor*100 + patch; cuDNN 8 major*1000 + minor*100 + patch.
    major, rest = divmod(number, 10000) if number >= 90000 else divmod(number, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def installed_version(module, distributions):
    """Return the version this process runs (or would import) of a module, None if absent.

    A module already imported reports its own version: the package on disk may
    have been upgraded since, and this process still runs the old one. Otherwise
    the installed distribution's metadata answers without a heavy import.
    """
    loaded = sys.modules.get(module)
    if getattr(loaded, "__version__", None):
        return str(loaded.__version__)
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return _imported_version(module)


@cache
def _imported_version(module):
    """Return a module's __version__ by importing it (no metadata to read), None if absent."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
        return str(importlib.import_module(module).__version__)
    except Exception:  # not importable, or no version: not installed as far as we can tell
        return None


# How diff names things; a field not listed is named by its key, underscores as spaces.
LABELS = {
    "schema": "fingerprint schema",
    "hostname": "hostname",
    "python": "Python",
    "memory_mb": "memory (MB)",
    "nvidia_driver": "NVIDIA driver",
    "cudnn": "cuDNN",
    "flags": "flag",
    "providers": "provider",
    "devices": "device",
    "isa_level": "ISA level",
    "driver_api": "driver API",
    "cuda": "CUDA",
    "compute_capability": "compute capability",
    "uuid": "UUID",
}
# The order diff lists changes in; keys not listed come after, sorted.
KEY_ORDER = (
    "schema",
    "os",
    "hostname",
    "python",
    "cpu",
    "memory_mb",
    "gpus",
    "nvidia_driver",
    "cuda",
    *TOOLCHAINS,
    "capabilities",
)


def _keys_in_order(old, new):
    """Return the keys of both fingerprints, known ones in a fixed order, then the rest sorted."""
    keys = set(old) | set(new)
    return [key for key in KEY_ORDER if key in keys] + sorted(keys - set(KEY_ORDER), key=str)


def _describe_scalar(key, before, after):
    """Describe a changed plain value (hostname, Python version, RAM)."""
    return [_change(_label(key), before, after)]


def _describe_section(label):
    """Return a describer of a dict of fields (os, cpu, cuda) whose lines start with label."""

    def describe(key, before, after):
        if not all(isinstance(side, dict | None) for side in (before, after)):
            return [_change(label, before, after)]  # a section stored before shapes were checked
        return _describe_dict(label, before or {}, after or {})

    return describe


def _describe_toolchain(key, before, after):
    """Describe an installed, removed or changed runtime and its extras (providers, devices)."""
    label = _label(key)
    if before is None:
        return [f"{label} installed ({_show(_version(after))})"]
    if after is None:
        return [f"{label} removed (was {_show(_version(before))})"]
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return [_change(label, before, after)]
    old, new = before.get("version"), after.get("version")
    lines = [] if old == new else [_change(label, old, new)]
    # torch's cuDNN is reported once, by the top-level "cudnn" entry.
    return lines + _describe_dict(label, before, after, skip=("version", "cudnn"))


def _describe_gpus(key, before, after):
    """Describe GPUs added, removed, swapped or changed, by index."""
    if not (isinstance(before, list) and isinstance(after, list)):
        return [_change("GPUs", _gpu_names(before), _gpu_names(after))]
    old, new = _gpus_by_index(before), _gpus_by_index(after)
    lines = []
    for index in sorted(set(old) | set(new)):
        if index not in old:
            lines.append(f"GPU {index} added ({_show(new[index].get('name'))})")
        elif index not in new:
            lines.append(f"GPU {index} removed (was {_show(old[index].get('name'))})")
        else:
            lines += _describe_gpu(index, old[index], new[index])
    return lines


def _describe_gpu(index, before, after):
    """Describe how one GPU changed: another model, another unit of the same model, or fields."""
    lines = []
    if before.get("name") != after.get("name"):
        lines.append(f"GPU {index}: {_show(before.get('name'))} → {_show(after.get('name'))}")
    elif before.get("uuid") != after.get("uuid"):
        lines.append(
            f"GPU {index}: another {_show(after.get('name'))} "
            f"(UUID {_show(before.get('uuid'))} → {_show(after.get('uuid'))})"
        )
    return lines + _describe_dict(f"GPU {index}", before, after, skip=("index", "name", "uuid"))


def _describe_capabilities(key, before, after):
    """Describe builds that became possible or impossible: "onnxruntime int8 builds: ... → ..."."""
    before, after = _nested(before), _nested(after)
    lines = []
    for backend in list(before) + [name for name in after if name not in before]:
        old, new = _nested(before.get(backend)), _nested(after.get(backend))
        for precision in list(old) + [name for name in new if name not in old]:
            was, now = _capability_text(old.get(precision)), _capability_text(new.get(precision))
            if was != now:
                lines.append(f"{backend} {precision} builds: {was} → {now}")
    return lines


def _nested(value):
    """Return value when it is a dict, else an empty one (an unknown section)."""
    return value if isinstance(value, dict) else {}


def _capability_text(capability):
    """Return "possible", "impossible (why)" or "unknown" for one capability entry."""
    if not isinstance(capability, dict) or "ok" not in capability:
        return "unknown"
    return "possible" if capability["ok"] else f"impossible ({capability.get('reason')})"


def _describe_other(key, before, after):
    """Describe a field diff has no words for (one an override added, say)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return _describe_dict(str(key), before, after)
    return [_change(str(key), before, after)]


def _describe_dict(label, before, after, skip=()):
    """Describe each changed field of two dicts; lists as items added and removed."""
    lines = []
    for field in list(before) + [field for field in after if field not in before]:
        old, new = before.get(field), after.get(field)
        if old == new or field in skip:
            continue
        name = f"{label} {_label(field)}"
        if isinstance(old, list) and isinstance(new, list):
            lines += [f"{name} {_show(item)} removed" for item in old if item not in new]
            lines += [f"{name} {_show(item)} added" for item in new if item not in old]
        else:
            lines.append(_change(name, old, new))
    return lines


def _change(label, before, after):
    """Return "label before → after"."""
    return f"{label} {_show(before)} → {_show(after)}"


def _show(value):
    """Return a value as people read it: None is "unknown", a list its items."""
    if value is None:
        return "unknown"
    if isinstance(value, list):
        return ", ".join(_show(item) for item in value) or "none"
    return str(value)


def _label(key):
    """Return the words diff uses for a field."""
    return LABELS.get(key, str(key).replace("_", " "))


def _version(toolchain):
    """Return a toolchain entry's version (the entry itself when it is a plain value)."""
    return toolchain.get("version") if isinstance(toolchain, dict) else toolchain


def _gpus_by_index(gpus):
    """Return {index: gpu} for a list of GPUs (position when a GPU has no index)."""
    by_index = {}
    for position, gpu in enumerate(gpus):
        gpu = gpu if isinstance(gpu, dict) else {"name": gpu}
        index = gpu.get("index")
        by_index[index if isinstance(index, int) else position] = gpu
    return by_index


def _gpu_names(gpus):
    """Return the names of a list of GPUs, or the value itself when it is not a list."""
    if not isinstance(gpus, list):
        return gpus
    return [gpu.get("name") if isinstance(gpu, dict) else gpu for gpu in gpus]


_DESCRIBERS = {
    "schema": _describe_scalar,
    "hostname": _describe_scalar,
    "python": _describe_scalar,
    "memory_mb": _describe_scalar,
    "os": _describe_section("OS"),
    "cpu": _describe_section("CPU"),
    "cuda": _describe_section("CUDA"),
    "gpus": _describe_gpus,
    "nvidia_driver": _describe_toolchain,
    **dict.fromkeys(TOOLCHAINS, _describe_toolchain),
    "capabilities": _describe_capabilities,
}
