"""The device fingerprint: what the hub keys compiled engines on."""

import json

import onnxruntime
import psutil

from workers import fingerprint
from workers.cli import main


def test_it_collects_the_documented_fields():
    collected = fingerprint.collect()

    assert collected["schema"] == 1
    assert set(collected) == {
        "schema",
        "os",
        "python",
        "hostname",
        "cpu",
        "memory_mb",
        "onnxruntime",
    }
    assert set(collected["os"]) == {"system", "release", "machine"}
    assert set(collected["cpu"]) == {"model", "count", "flags"}
    assert collected["cpu"]["count"] == psutil.cpu_count(logical=True)
    assert collected["memory_mb"] == psutil.virtual_memory().total // 2**20
    assert json.loads(json.dumps(collected)) == collected


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
    assert printed["schema"] == 1
