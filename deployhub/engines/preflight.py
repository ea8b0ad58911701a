"""Before any build: what will fail or be slow, per backend, on a device class's toolchain.

Pure checks on what the hub already knows: the version's opset, operators and
contract, and the fingerprints of the class's devices. Answers in milliseconds.
"""

from dataclasses import dataclass, field

from workers.backends.base import cpu_isa
from workers.backends.graph_report import quantised_by_authors
from workers.backends.known import BACKENDS
from workers.checks.convert import CONVERT_OPSET
from workers.fingerprint import shape_problem


@dataclass
class Verdict:
    """What one backend will do with the version: ok, slow or fail, and why."""

    backend: str
    fails: list = field(default_factory=list)
    slow: list = field(default_factory=list)
    too_old: bool = False  # the opset is older than the backend runs

    @property
    def verdict(self):
        return "fail" if self.fails else "slow" if self.slow else "ok"

    @property
    def only_too_old(self):
        """Return True when an old opset is all that fails: a conversion would clear it."""
        return self.too_old and len(self.fails) == 1


def _flags(fingerprint):
    return set(((fingerprint or {}).get("cpu") or {}).get("flags") or [])


def _check_runtime(verdict, fingerprints, precision):
    """Fail a build no device of the class can make: no runtime, or the build's imports fail."""
    backend = BACKENDS[verdict.backend]
    if not fingerprints:
        verdict.fails.append("no device of the class has reported a fingerprint yet")
        return
    with_runtime = [fp for fp in fingerprints if fp.get(backend.runtime)]
    if not with_runtime:
        verdict.fails.append(
            f"no device of the class has {backend.runtime}: install deployhub[{backend.extra}]"
        )
    elif precision in backend.build_imports:
        _check_capability(verdict, with_runtime, precision)


def _check_capability(verdict, fingerprints, precision):
    """Fail a precision whose build, every device says, cannot import what it needs.

    A device that does not say (a worker from before capabilities were
    reported) might make the build, so it does not fail it.
    """
    reports = [_capability(fp, verdict.backend, precision) for fp in fingerprints]
    if any(report is None or report["ok"] for report in reports):
        return
    reasons = sorted({str(report.get("reason") or "its imports fail") for report in reports})
    verdict.fails.append(
        f"no device of the class can build {precision} with {verdict.backend}: "
        + "; ".join(reasons)
    )


def _capability(fingerprint, backend, precision):
    """Return a device's report on a build ({"ok": bool, "reason": ...}), None if it says none."""
    report = fingerprint.get("capabilities")
    for key in (backend, precision):
        report = report.get(key) if isinstance(report, dict) else None
    return report if isinstance(report, dict) and "ok" in report else None


def _check_graph(verdict, version):
    backend = BACKENDS[verdict.backend]
    if backend.source_format != "onnx":
        if version.format != backend.source_format:
            verdict.fails.append(f"{backend.name} builds from {backend.source_label}")
        return
    _check_opset(verdict, version.opset)
    operators = (version.graph or {}).get("operators", {})
    foreign = sorted(
        op for op in operators if "." in op and op.rsplit(".", 1)[0] not in backend.extra_domains
    )
    unsupported = sorted(op for op in operators if op in backend.unsupported_ops)
    if foreign or unsupported:
        verdict.fails.append(f"unsupported operators: {', '.join(foreign + unsupported)}")


def _check_opset(verdict, opset):
    """Fail a default-domain opset outside the range the backend's ONNX importer takes."""
    backend = BACKENDS[verdict.backend]
    if not opset:
        return
    if backend.max_opset is not None and opset > backend.max_opset:
        verdict.fails.append(
            f"opset {opset} is newer than {backend.name} takes (≤ {backend.max_opset}): "
            "export with an older opset"
        )
    if backend.min_opset is not None and opset < backend.min_opset:
        verdict.too_old = True
        verdict.fails.append(
            f"opset {opset} is older than {backend.name} runs (≥ {backend.min_opset}): "
            f"convert it (Convert to opset {CONVERT_OPSET} on the version page)"
        )


def quantised_source(version):
    """Return how the version's authors quantised it already ("" when they did not)."""
    return quantised_by_authors(version.graph or {}) if version.is_onnx else ""


def _check_quantised(verdict, version, precision):
    """Fail a build that would quantise again a source its authors quantised."""
    backend = BACKENDS[verdict.backend]
    if backend.source_format == "onnx" and backend.needs_calibration({"precision": precision}):
        if why := quantised_source(version):
            verdict.fails.append(why)


def _check_shapes(verdict, version):
    dynamic = [
        name
        for name, c in (version.contract.get("inputs") or {}).items()
        if c.get("dynamic") or "min" in (c.get("batch") or {})
    ]
    why = BACKENDS[verdict.backend].dynamic_shapes_slow
    if dynamic and why:
        verdict.slow.append(f"dynamic shapes on {', '.join(dynamic)}: {why}")


def _check_hardware(verdict, fingerprints, precision):
    backend = BACKENDS[verdict.backend]
    gpus = [gpu for fp in fingerprints for gpu in (fp.get("gpus") or [])]
    if backend.needs_gpu and not gpus:
        verdict.fails.append(f"{backend.name} needs an NVIDIA GPU; the class's devices report none")
    flags = set.intersection(*(_flags(fp) for fp in fingerprints)) if fingerprints else set()
    on_cpu = backend.runs_on_cpu
    if precision == "bf16" and on_cpu and not flags & {"amx_bf16", "avx512_bf16"}:
        verdict.fails.append("bf16 needs AMX or AVX-512 BF16; the class's CPUs have neither")
    if precision == "int8" and on_cpu and not flags & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        verdict.slow.append(
            "int8 without VNNI runs slowly on these CPUs "
            f"(ISA {cpu_isa(fingerprints[0]) if fingerprints else 'unknown'})"
        )
    if precision in backend.gpu_precisions and not gpus:
        verdict.fails.append(backend.gpu_precisions[precision])


def class_fingerprints(device_class):
    """The fingerprints the class's devices reported (none yet, or one stored before the hub
    checked their shape that it cannot read: left out)."""
    devices = device_class.devices.all()
    return [d.fingerprint for d in devices if d.fingerprint and not shape_problem(d.fingerprint)]


def preflight(version, device_class, backends, precision="fp32", fingerprints=None):
    """Return a Verdict per backend for building this version on the class's devices."""
    if fingerprints is None:
        fingerprints = class_fingerprints(device_class)
    verdicts = []
    for backend in backends:
        verdict = Verdict(backend)
        _check_runtime(verdict, fingerprints, precision)
        _check_graph(verdict, version)
        _check_quantised(verdict, version, precision)
        _check_shapes(verdict, version)
        _check_hardware(verdict, fingerprints, precision)
        verdicts.append(verdict)
    return verdicts


# The builds auto mode would try: (backend, precision), as each backend class lists them.
def grid():
    """Return the (backend, precision) builds auto mode tries: every registered backend's."""
    return [
        (name, precision) for name, backend in BACKENDS.items() for precision in backend.auto_builds
    ]


def preflight_grid(version, device_class):
    """Return (backend, precision, Verdict) for every build of the grid on the class."""
    rows, fingerprints = [], class_fingerprints(device_class)  # once: a fleet may be large
    for backend, precision in grid():
        [verdict] = preflight(version, device_class, [backend], precision, fingerprints)
        rows.append((backend, precision, verdict))
    return rows


def too_old_for_every_build(version, device_class):
    """Return True when preflight rules out every build of the grid on the class, and for
    some of them only because the opset is too old: converting it would let them through."""
    verdicts = [verdict for _, _, verdict in preflight_grid(version, device_class)]
    return all(v.fails for v in verdicts) and any(v.only_too_old for v in verdicts)
