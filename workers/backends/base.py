"""The base every runtime backend implements, and the pure helpers of compatibility keys.

A backend compiles a model into an artifact (an engine) that only runs where
the fields returned by its `compat_fields` are the same. Both sides use those
fields: a worker reports them when it completes a compile, and the hub
computes them from a device's fingerprint to decide whether that device may
download an engine. So `compat_fields` is pure, reads only the fingerprint and
the build config, and must work where the runtime is not installed.
"""

import abc
import hashlib
import importlib
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import ClassVar

from workers.fingerprint import installed_version, isa_level


@dataclass
class CompileResult:
    """What a backend's compile produced."""

    artifact: Path
    timing_cache: Path | None = None
    calibration_cache: Path | None = None  # INT8 scales (TensorRT), reusable across its GPUs
    log: str = ""
    tool_versions: dict = field(default_factory=dict)
    graph_report: dict | None = None  # nodes and operators before and after, what was fused


class Backend(abc.ABC):
    """A runtime that compiles models into engines, loads them and runs them."""

    name: ClassVar[str]  # the name jobs and engines use ("onnxruntime")
    runtime: ClassVar[str]  # the module that must import for the backend to run here
    extra: ClassVar[str]  # the pip extra that installs the runtime: deployhub[<extra>]
    # The pip distributions that install the runtime module, most common first.
    distributions: ClassVar[tuple[str, ...]] = ()
    # The default-domain (ai.onnx) opsets its ONNX importer takes; None: no bound known.
    min_opset: ClassVar[int | None] = None
    max_opset: ClassVar[int | None] = None
    # Operator domains it runs besides the default one, and default-domain operators it does
    # not run (or only through plugins): preflight names them before anything is built.
    extra_domains: ClassVar[tuple[str, ...]] = ()
    unsupported_ops: ClassVar[frozenset[str]] = frozenset()
    # The builds auto mode tries, by precision: {"fp32": {}, "int8": {"precision": "int8"}}.
    auto_builds: ClassVar[dict[str, dict]] = {}
    # Precisions whose builds import more than the runtime, and the modules they import.
    build_imports: ClassVar[dict[str, tuple[str, ...]]] = {}
    # The version format it builds from ("onnx", or "pt2": a torch.export program), and a
    # word for it in refusals.
    source_format: ClassVar[str] = "onnx"
    source_label: ClassVar[str] = "ONNX"
    # Where it runs: on an NVIDIA GPU only, or on the CPU (ISA facts then apply to it).
    needs_gpu: ClassVar[bool] = False
    runs_on_cpu: ClassVar[bool] = False
    # Precisions that only a GPU provider builds, and why (preflight's words).
    gpu_precisions: ClassVar[dict[str, str]] = {}
    # True when its builds are specialised to the version's shape contract (TensorRT's
    # optimisation profiles): the contract is then part of the build config.
    builds_from_contract: ClassVar[bool] = False
    # Why dynamic shapes in the contract build slowly, when they do.
    dynamic_shapes_slow: ClassVar[str | None] = None
    # True when its engine is an ONNX file the measurement harness runs in an ONNX Runtime
    # session of its own (workers/measure/benchmark.py); other engines are run through load/infer.
    harness_runs_engine: ClassVar[bool] = False
    # The selftest (workers/selftest.py): the largest |engine - reference| its tiny model may
    # show (FP32 builds match to rounding), and what its install needs besides the pip extra.
    selftest_tolerance: ClassVar[float] = 1e-4
    install_note: ClassVar[str] = ""
    # What probe_runtime() reports, field by field, as the hub checks a fingerprint's entry
    # of the runtime (workers/fingerprint.py SHAPE says how a shape reads).
    runtime_fields: ClassVar[dict] = {"version": str}

    @classmethod
    def host_problems(cls, fingerprint):
        """Return what the host lacks for this backend beyond its Python package (selftest)."""
        return []

    @classmethod
    def probe_runtime(cls):
        """Return what the device fingerprint reports of the runtime ({"version": ...}), None
        when it is absent. Cheap: the installed version is read without importing it."""
        version = installed_version(cls.runtime, cls.distributions or (cls.runtime,))
        return None if version is None else {"version": version}

    @classmethod
    def available(cls):
        """Return True when this backend's runtime imports on this machine."""
        return importable(cls.runtime)

    @classmethod
    def capabilities(cls):
        """Return {precision: {"ok": True} or {"ok": False, "reason": why}} for build_imports.

        Each module is really imported (once per process): an installed package
        can still fail to import what it needs, as ONNX Runtime's quantisation
        does without sympy. The imports are heavy, so the fingerprint asks a child.
        """
        return {
            precision: _capability(cls.extra, modules)
            for precision, modules in cls.build_imports.items()
        }

    @classmethod
    @abc.abstractmethod
    def compat_fields(cls, fingerprint: dict, build_config: dict) -> dict:
        """Return the fields of a device an artifact built with this config depends on."""

    @classmethod
    def needs_calibration(cls, build_config):
        """Return True when a build with this config reads the version's calibration data."""
        return (build_config or {}).get("precision") == "int8"

    @classmethod
    def calibration_cache(cls, build_config, fingerprint, model_sha256, dataset_sha256):
        """Return (key, toolchain version) of the calibration cache a build on a device with
        this fingerprint reuses, or None when its builds keep none (pure, for the hub)."""
        return None

    @classmethod
    def artifact_problem(cls, path):
        """Say why the file at path is not an engine this backend builds ("" when it is one).

        Loads nothing into a runtime (workers/backends/artifacts.py); the hub runs it in
        a capped child before it signs an uploaded engine. A backend that cannot tell
        refuses every file, so a new backend cannot skip the check by omission.
        """
        return f"the {cls.name} backend has no check of its engines"

    @classmethod
    def check_config(cls, build_config):
        """Raise JobError when the build config cannot be built; pure, for the hub too."""
        return None  # every config is accepted unless a backend knows better

    @classmethod
    def canonical_config(cls, build_config: dict) -> dict:
        """Return the build config as this backend builds it: defaults filled, aliases resolved.

        Two configs that build the same artifact give equal canonical configs, so
        the engine store keys engines on this (its digest) and asking again for
        the same build reuses the engine. Pure, for the hub too; keys the backend
        does not know are kept, for check_config to refuse.
        """
        return dict(build_config or {})

    @abc.abstractmethod
    def compile(
        self,
        source: Path,
        build_config: dict,
        workdir: Path,
        *,
        timing_cache: Path | None = None,
        calibration: Path | None = None,
        progress=None,
    ) -> CompileResult:
        """Compile the ONNX model at source into workdir; return a CompileResult.

        timing_cache is an earlier build's cache to start from; calibration an
        `.npz` of preprocessed samples that calibrate INT8 (`inputs`, or one array
        per model input; workers/measure/feeds.py reads both); progress, when given, is
        called as progress(fraction, message). A backend that calibrates also
        takes model_io (the version's signature and contract), given with the
        calibration data.
        """

    @abc.abstractmethod
    def load(self, artifact: Path, build_config: dict):
        """Load a compiled artifact (verified beforehand); return a handle for infer."""

    @abc.abstractmethod
    def infer(self, handle, feeds: dict) -> list:
        """Run the loaded artifact on {input name: array}; return the outputs in order."""


@cache
def importable(module):
    """Return True when a module imports here (tried once per process)."""
    try:
        importlib.import_module(module)
    except Exception:  # missing, or installed without its native libraries
        return False
    return True


@cache
def import_problem(module):
    """Return why a module does not import here ("sympy is missing"), None when it does; once."""
    try:
        importlib.import_module(module)
    except Exception as error:  # missing, or installed without what it needs
        missing = _missing_module(error)
        return f"{missing} is missing" if missing else f"{module} does not import ({error})"
    return None


def _missing_module(error):
    """Return the name of the module whose absence caused error (walking its chain), or None."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError) and error.name:
            return error.name
        error = error.__cause__ or error.__context__
    return None


def _capability(extra, modules):
    """Return {"ok": True} when every module imports, else the first problem and its remedy."""
    problem = next(filter(None, map(import_problem, modules)), None)
    if problem is None:
        return {"ok": True}
    return {"ok": False, "reason": f"{problem}: pip install deployhub[{extra}]"}


def with_defaults(build_config, defaults):
    """Return build_config with each of defaults filled in where it is absent or null."""
    config = dict(build_config or {})
    return {**config, **{k: v for k, v in defaults.items() if config.get(k) is None}}


def canonical(obj):
    """Return obj as compact JSON with sorted keys: equal objects, equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(obj):
    """Return the sha256 hex of obj's canonical JSON."""
    return hashlib.sha256(canonical(obj).encode()).hexdigest()


def compat_key(backend_name, fields):
    """Return the compatibility key of a backend's compat fields: "<backend>:<sha256>"."""
    return f"{backend_name}:{digest(fields)}"


def differences(a_fields, b_fields):
    """Return {dotted field: [a value, b value]} for the fields that differ (None when absent)."""
    a_flat, b_flat = _flatten(a_fields), _flatten(b_fields)
    names = list(a_flat) + [name for name in b_flat if name not in a_flat]
    return {
        name: [a_flat.get(name), b_flat.get(name)]
        for name in names
        if a_flat.get(name) != b_flat.get(name)
    }


def describe_differences(diffs):
    """Return differences as one line: "onnxruntime 1.32.0 ≠ 1.31.0; cpu isa avx512 ≠ avx2"."""
    return "; ".join(
        f"{name.replace('_', ' ').replace('.', ' ')} {_show(a)} ≠ {_show(b)}"
        for name, (a, b) in diffs.items()
    )


def tool_version(fingerprint, tool):
    """Return a toolchain's version from a fingerprint ({"onnxruntime": {"version": ..}})."""
    entry = (fingerprint or {}).get(tool)
    return entry.get("version") if isinstance(entry, dict) else None


def cpu_isa(fingerprint):
    """Return the fingerprint's CPU ISA level, derived from its flags when not reported."""
    cpu = (fingerprint or {}).get("cpu")
    if not isinstance(cpu, dict):
        return None
    return cpu.get("isa_level") or isa_level(cpu.get("flags"))


def cpu_flags(fingerprint):
    """Return the fingerprint's CPU flags, or None when unknown."""
    cpu = (fingerprint or {}).get("cpu")
    return cpu.get("flags") if isinstance(cpu, dict) else None


def gpu_compute_capability(fingerprint, index=0):
    """Return a GPU's compute capability ("8.6"), None without that GPU."""
    gpus = (fingerprint or {}).get("gpus")
    if not isinstance(gpus, list) or len(gpus) <= index or not isinstance(gpus[index], dict):
        return None
    return gpus[index].get("compute_capability")


def cuda_version(fingerprint, kind):
    """Return the fingerprint's CUDA version of a kind ("driver_api", "runtime"), or None."""
    cuda = (fingerprint or {}).get("cuda")
    return cuda.get(kind) if isinstance(cuda, dict) else None


def version_parts(version, count):
    """Return the first count dot-separated parts of a version ("10.16.1.11", 3 -> "10.16.1")."""
    if version is None:
        return None
    return ".".join(str(version).split(".")[:count])


def _flatten(fields, prefix=""):
    """Return nested dicts as one dict with dotted names."""
    flat = {}
    for name, value in (fields or {}).items():
        dotted = f"{prefix}{name}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def _show(value):
    """Return a field value as people read it (None as "none", booleans lower case)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


class BuildLog:
    """The progress reports and timed log lines of one build."""

    def __init__(self, progress=None):
        self.report = progress or (lambda fraction, message: None)
        self.notes = []

    def note(self, line):
        """Add a line to the build log."""
        self.notes.append(line)

    @contextmanager
    def stage(self, fraction, message):
        """Report a stage as it starts; log how long it took once it is done."""
        self.report(fraction, message)
        started = time.monotonic()
        yield
        self.note(f"{message}: {time.monotonic() - started:.2f} s")

    def log(self):
        """Return the build log, one line per note."""
        return "".join(f"{line}\n" for line in self.notes)
