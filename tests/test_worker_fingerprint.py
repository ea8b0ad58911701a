"""The device fingerprint: what the hub keys compiled engines on, and what changed in it."""

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import onnxruntime
import psutil
import pytest

from workers import fingerprint
from workers.app import CONTEXT
from workers.cli import _start_device_heartbeat, main

ROOT = Path(__file__).resolve().parent.parent


def _nvml_works():
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def test_it_collects_the_documented_fields():
    collected = fingerprint.collect()

    assert collected["schema"] == 2
    assert set(collected) == {
        "schema",
        "os",
        "python",
        "hostname",
        "cpu",
        "memory_mb",
        "gpus",
        "nvidia_driver",
        "cuda",
        "onnxruntime",
        "tensorrt",
        "openvino",
        "torch",
        "cudnn",
        "capabilities",
    }
    assert set(collected["os"]) == {"system", "release", "machine"}
    assert set(collected["cpu"]) == {"model", "count", "flags", "isa_level"}
    assert collected["cpu"]["count"] == psutil.cpu_count(logical=True)
    assert collected["cpu"]["isa_level"] == fingerprint.isa_level(collected["cpu"]["flags"])
    assert collected["memory_mb"] == psutil.virtual_memory().total // 2**20
    assert json.loads(json.dumps(collected)) == collected
    # The hub checks every field's type (a field it does not check is one it does not read).
    assert set(fingerprint.shape()) == set(collected)
    assert fingerprint.shape_problem(collected) == ""


def test_it_reports_the_same_fingerprint_twice_in_a_row():
    assert fingerprint.collect() == fingerprint.collect()


@pytest.mark.skipif(_nvml_works(), reason="this machine has an NVIDIA driver")
def test_it_reports_gpus_driver_and_cuda_as_unknown_without_a_driver():
    collected = fingerprint.collect()

    assert collected["gpus"] is None
    assert collected["nvidia_driver"] is None
    assert collected["cuda"] is None or collected["cuda"]["driver_api"] is None


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") or importlib.util.find_spec("openvino"),
    reason="TensorRT or OpenVINO is installed here",
)
def test_it_reports_runtimes_that_are_not_installed_as_none():
    collected = fingerprint.collect()

    assert collected["tensorrt"] is None
    assert collected["openvino"] is None


def test_it_reports_the_installed_torch_and_what_it_was_built_with():
    torch = pytest.importorskip("torch")

    collected = fingerprint.collect()

    assert collected["torch"]["version"] == importlib.metadata.version("torch")
    assert collected["torch"]["cuda"] == torch.version.cuda
    if torch.version.cuda is None:
        assert collected["torch"]["cudnn"] is None
        assert collected["cudnn"] is None
        assert collected["cuda"] is None or collected["cuda"]["runtime"] is None


def test_it_asks_a_child_python_about_torch_and_keeps_torch_out_of_the_worker():
    torch = pytest.importorskip("torch")
    code = (
        "import sys, workers.fingerprint as f; f.collect(); f.collect(); "
        "print('torch' in sys.modules, f._torch_build_in_child.cache_info().misses)"
    )

    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )

    assert completed.stdout.split() == ["False", "1"], completed.stderr
    assert fingerprint._torch_build_in_child() == {
        "cuda": torch.version.cuda,
        "cudnn": fingerprint._cudnn_version(torch),
    }


def test_it_reports_which_builds_import_what_they_need_here():
    # The test install carries every CPU backend with its quantisers, as `make run`'s does.
    assert fingerprint.collect()["capabilities"] == {
        "onnxruntime": {"int8": {"ok": True}, "fp16": {"ok": True}},
        "openvino": {"int8": {"ok": True}},
    }


def test_it_says_which_module_a_build_misses_and_what_installs_it():
    # A child Python in which sympy and nncf cannot be imported, as in an install without them.
    code = (
        "import sys; sys.modules['sympy'] = sys.modules['nncf'] = None\n"
        "import json, workers.fingerprint as f; print(json.dumps(f.probe_capabilities()))"
    )

    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert json.loads(completed.stdout) == {
        "onnxruntime": {
            "int8": {"ok": False, "reason": "sympy is missing: pip install deployhub[worker]"},
            "fp16": {"ok": True},
        },
        "openvino": {
            "int8": {"ok": False, "reason": "nncf is missing: pip install deployhub[openvino]"}
        },
    }, completed.stderr


def test_it_probes_builds_in_a_child_and_keeps_quantisers_out_of_the_worker():
    code = (
        "import sys, workers.fingerprint as f; f.collect(); f.collect(); "
        "print('sympy' in sys.modules, 'nncf' in sys.modules, "
        "f._capabilities_in_child.cache_info().misses)"
    )

    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240
    )

    assert completed.stdout.split() == ["False", "False", "1"], completed.stderr


class FakeNvml(types.SimpleNamespace):
    """A stand-in for pynvml on a machine with two GPUs, for tests without a driver."""

    class NVMLError(Exception):
        pass

    def __init__(self, refuse=()):
        super().__init__(refuse=set(refuse), shutdowns=0)

    def _ask(self, name, value):
        if name in self.refuse:
            raise self.NVMLError(f"{name} not supported")
        return value

    def nvmlInit(self):
        self._ask("init", None)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return self._ask("driver", "550.54.15")

    def nvmlSystemGetCudaDriverVersion(self):
        return self._ask("cuda", 12040)

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return [b"NVIDIA A10", "NVIDIA L4"][handle]  # old pynvml answers bytes

    def nvmlDeviceGetUUID(self, handle):
        return self._ask("uuid", f"GPU-{handle}")

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return [(8, 6), (8, 9)][handle]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(total=[24 * 2**30, 23034 * 2**20][handle], free=123)


def test_it_reads_gpus_driver_and_cuda_from_nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)

    collected = fingerprint.collect()

    assert collected["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA A10",
            "uuid": "GPU-0",
            "compute_capability": "8.6",
            "memory_mb": 24576,
        },
        {
            "index": 1,
            "name": "NVIDIA L4",
            "uuid": "GPU-1",
            "compute_capability": "8.9",
            "memory_mb": 23034,
        },
    ]
    assert collected["nvidia_driver"] == "550.54.15"
    assert collected["cuda"]["driver_api"] == "12.4"
    assert fake.shutdowns == 1
    assert fingerprint.shape_problem(collected) == ""


def test_it_reports_what_nvml_refuses_as_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(refuse={"uuid", "cuda"}))

    collected = fingerprint.collect()

    assert [gpu["uuid"] for gpu in collected["gpus"]] == [None, None]
    assert collected["gpus"][0]["name"] == "NVIDIA A10"
    assert collected["nvidia_driver"] == "550.54.15"
    assert collected["cuda"] is None or collected["cuda"]["driver_api"] is None


def test_it_reports_no_gpu_information_when_nvml_does_not_start(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(refuse={"init"}))

    collected = fingerprint.collect()

    assert (collected["gpus"], collected["nvidia_driver"]) == (None, None)


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        (["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "amx_tile"], "avx512"),
        (["sse4_2", "avx", "avx2", "fma"], "avx2"),
        (["sse4_2", "avx"], "sse4"),
        ([], "baseline"),
        (None, None),
    ],
)
def test_it_derives_the_isa_level_from_the_flags(flags, level):
    assert fingerprint.isa_level(flags) == level


@pytest.mark.parametrize(
    ("number", "version"), [(90100, "9.1.0"), (91002, "9.10.2"), (8902, "8.9.2"), (None, None)]
)
def test_it_reads_cudnn_versions_of_both_encodings(number, version):
    cudnn = types.SimpleNamespace(version=lambda: number)
    torch = types.SimpleNamespace(backends=types.SimpleNamespace(cudnn=cudnn))

    assert fingerprint._cudnn_version(torch) == version


def test_it_reports_only_known_cpu_flags_in_a_fixed_order():
    flags = fingerprint.collect()["cpu"]["flags"]

    assert flags is None or flags == [f for f in fingerprint.CPU_FLAGS if f in flags]


def test_it_reads_cpu_model_and_flags_from_cpuinfo(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
        "flags\t\t: fpu sse4_2 avx avx2 avx512f avx512_vnni amx_tile amx_int8 avx512ifma\n\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    )
    monkeypatch.setattr(fingerprint, "CPUINFO", cpuinfo)

    cpu = fingerprint.collect()["cpu"]

    assert cpu["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert cpu["flags"] == [
        "sse4_2",
        "avx",
        "avx2",
        "avx512f",
        "avx512_vnni",
        "amx_tile",
        "amx_int8",
    ]


def test_it_reports_unknown_flags_as_none_rather_than_guessing(tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprint, "CPUINFO", tmp_path / "no-cpuinfo-here")

    assert fingerprint.collect()["cpu"]["flags"] is None


def test_it_reports_the_installed_onnxruntime():
    runtime = fingerprint.collect()["onnxruntime"]

    assert runtime["version"] == onnxruntime.__version__
    assert runtime["providers"] == onnxruntime.get_available_providers()
    assert "CPUExecutionProvider" in runtime["providers"]


def test_it_deep_merges_an_override_over_the_fingerprint(tmp_path):
    override = tmp_path / "override.json"
    override.write_text(json.dumps({"cpu": {"flags": ["avx2"]}, "gpus": [{"driver": "560.35"}]}))
    base = {"schema": 1, "cpu": {"model": "EPYC", "count": 2, "flags": ["avx512f"]}}

    merged = fingerprint.load_override(override, base)

    assert merged == {
        "schema": 1,
        "cpu": {"model": "EPYC", "count": 2, "flags": ["avx2"]},
        "gpus": [{"driver": "560.35"}],
    }
    assert base["cpu"]["flags"] == ["avx512f"]


def test_it_merges_an_override_over_the_collected_fingerprint(tmp_path):
    override = tmp_path / "override.json"
    override.write_text(json.dumps({"onnxruntime": {"version": "9.9.9"}}))

    merged = fingerprint.load_override(override)

    assert merged["onnxruntime"]["version"] == "9.9.9"
    assert merged["onnxruntime"]["providers"] == onnxruntime.get_available_providers()
    assert merged["cpu"] == fingerprint.collect()["cpu"]


def test_it_prints_the_fingerprint_with_the_override_applied(tmp_path, capsys):
    override = tmp_path / "override.json"
    override.write_text(json.dumps({"hostname": "rehearsal-box"}))

    status = main(["fingerprint", "--fingerprint-override", str(override)])

    assert status == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["hostname"] == "rehearsal-box"
    assert printed["schema"] == 2


def test_it_reads_the_override_file_again_on_every_call(tmp_path):
    override = tmp_path / "override.json"
    override.write_text(json.dumps({"nvidia_driver": "550.54.15"}))
    before = fingerprint.load_override(override)

    override.write_text(json.dumps({"nvidia_driver": "560.28.03"}))
    after = fingerprint.load_override(override)

    assert (before["nvidia_driver"], after["nvidia_driver"]) == ("550.54.15", "560.28.03")
    assert fingerprint.diff(before, after) == ["NVIDIA driver 550.54.15 → 560.28.03"]


def test_it_derives_the_isa_level_of_overridden_flags(tmp_path):
    override = tmp_path / "override.json"
    override.write_text(json.dumps({"cpu": {"flags": ["sse4_2", "avx", "avx2", "fma"]}}))
    base = {"cpu": {"model": "Xeon", "flags": ["avx2", "avx512f"], "isa_level": "avx512"}}

    assert fingerprint.load_override(override, base)["cpu"]["isa_level"] == "avx2"


def test_it_sends_the_current_fingerprint_on_every_device_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(CONTEXT, "fingerprint", None)
    override = tmp_path / "override.json"
    override.write_text(json.dumps({"nvidia_driver": "550.54.15"}))
    sent = []

    class RecordingClient:
        def heartbeat(self, fingerprint, delivery=None):
            sent.append(fingerprint)
            return {"state": "online"}

    stop = _start_device_heartbeat(RecordingClient(), {"heartbeat_interval": 0.02}, override)
    try:
        _wait_for(lambda: sent)
        override.write_text(json.dumps({"nvidia_driver": "560.28.03"}))
        _wait_for(lambda: sent[-1]["nvidia_driver"] == "560.28.03")
    finally:
        stop.set()

    assert sent[0]["nvidia_driver"] == "550.54.15"
    assert sent[0]["schema"] == 2
    assert CONTEXT.fingerprint["nvidia_driver"] == "560.28.03"


def _wait_for(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


A10_HOST = {
    "schema": 2,
    "os": {"system": "Linux", "release": "6.8.0", "machine": "x86_64"},
    "hostname": "edge-7",
    "python": "3.12.3",
    "cpu": {
        "model": "AMD EPYC 7543",
        "count": 32,
        "flags": ["sse4_2", "avx", "avx2", "fma", "avx512f"],
        "isa_level": "avx512",
    },
    "memory_mb": 257000,
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA A10",
            "uuid": "GPU-aaa",
            "compute_capability": "8.6",
            "memory_mb": 24576,
        }
    ],
    "nvidia_driver": "550.54.15",
    "cuda": {"driver_api": "12.4", "runtime": None},
    "onnxruntime": {"version": "1.31.0", "providers": ["CPUExecutionProvider"]},
    "tensorrt": None,
    "openvino": {"version": "2026.4.1", "devices": ["CPU"]},
    "torch": {"version": "2.13.0+cu124", "cuda": "12.4", "cudnn": "9.1.0"},
    "cudnn": {"version": "9.1.0"},
}
L4 = {
    "index": 0,
    "name": "NVIDIA L4",
    "uuid": "GPU-bbb",
    "compute_capability": "8.9",
    "memory_mb": 23034,
}


def _changed(**changes):
    return fingerprint.deep_merge(A10_HOST, changes)


@pytest.mark.parametrize(
    ("after", "lines"),
    [
        (A10_HOST, []),
        (_changed(nvidia_driver="560.28.03"), ["NVIDIA driver 550.54.15 → 560.28.03"]),
        (
            _changed(onnxruntime={"version": "1.32.0"}),
            ["onnxruntime 1.31.0 → 1.32.0"],
        ),
        (
            _changed(cpu={"flags": ["sse4_2", "avx", "avx2", "fma"], "isa_level": "avx2"}),
            ["CPU flag avx512f removed", "CPU ISA level avx512 → avx2"],
        ),
        (
            _changed(cpu={"flags": ["sse4_2", "avx", "avx2", "fma", "avx512f", "amx_tile"]}),
            ["CPU flag amx_tile added"],
        ),
        (
            _changed(gpus=[L4]),
            [
                "GPU 0: NVIDIA A10 → NVIDIA L4",
                "GPU 0 compute capability 8.6 → 8.9",
                "GPU 0 memory (MB) 24576 → 23034",
            ],
        ),
        (
            _changed(gpus=[{**A10_HOST["gpus"][0], "uuid": "GPU-ccc"}]),
            ["GPU 0: another NVIDIA A10 (UUID GPU-aaa → GPU-ccc)"],
        ),
        (
            _changed(gpus=[A10_HOST["gpus"][0], {**L4, "index": 1}]),
            ["GPU 1 added (NVIDIA L4)"],
        ),
        (_changed(gpus=None), ["GPUs NVIDIA A10 → unknown"]),
        (_changed(tensorrt={"version": "10.16.1"}), ["tensorrt installed (10.16.1)"]),
        (_changed(openvino=None), ["openvino removed (was 2026.4.1)"]),
        (
            _changed(onnxruntime={"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}),
            ["onnxruntime provider CUDAExecutionProvider added"],
        ),
        (
            _changed(torch={"cuda": "12.8", "cudnn": "9.5.0"}, cudnn={"version": "9.5.0"}),
            ["torch CUDA 12.4 → 12.8", "cuDNN 9.1.0 → 9.5.0"],
        ),
        (_changed(cuda={"driver_api": "12.6"}), ["CUDA driver API 12.4 → 12.6"]),
        (_changed(memory_mb=515000), ["memory (MB) 257000 → 515000"]),
        (_changed(os={"release": "6.11.0"}), ["OS release 6.8.0 → 6.11.0"]),
        (_changed(rack="b2"), ["rack unknown → b2"]),
        (
            _changed(capabilities={"onnxruntime": {"int8": {"ok": True}}}),
            ["onnxruntime int8 builds: unknown → possible"],
        ),
    ],
)
def test_it_describes_what_changed_for_people(after, lines):
    assert fingerprint.diff(A10_HOST, after) == lines


def test_it_lists_changes_in_a_stable_order():
    after = _changed(nvidia_driver="560.28.03", onnxruntime={"version": "1.32.0"}, python="3.13.1")

    assert fingerprint.diff(A10_HOST, after) == [
        "Python 3.12.3 → 3.13.1",
        "NVIDIA driver 550.54.15 → 560.28.03",
        "onnxruntime 1.31.0 → 1.32.0",
    ]


def test_it_describes_an_upgrade_from_a_schema_1_fingerprint():
    old = {"schema": 1, "cpu": {"model": "EPYC", "count": 2, "flags": ["avx2"]}}
    new = {
        "schema": 2,
        "cpu": {"model": "EPYC", "count": 2, "flags": ["avx2"], "isa_level": "avx2"},
    }

    assert fingerprint.diff(old, new) == [
        "fingerprint schema 1 → 2",
        "CPU ISA level unknown → avx2",
    ]
    assert fingerprint.diff(None, {}) == []


def test_importing_openvino_does_not_change_the_fingerprint():
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("openvino") is None:
        pytest.fail("the openvino extra is part of the test install")
    code = (
        "from workers import fingerprint as f; a = f.collect()['openvino']; import openvino; "
        "b = f.collect()['openvino']; assert a == b, (a, b); print(a['version'])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_it_describes_builds_that_became_impossible_and_why():
    before = _changed(capabilities={"onnxruntime": {"int8": {"ok": True}, "fp16": {"ok": True}}})
    lost = {"ok": False, "reason": "sympy is missing: pip install deployhub[worker]"}
    after = _changed(capabilities={"onnxruntime": {"int8": lost, "fp16": {"ok": True}}})

    assert fingerprint.diff(before, after) == [
        "onnxruntime int8 builds: possible → impossible "
        "(sympy is missing: pip install deployhub[worker])"
    ]
