"""Preflight: what will fail or be slow, per backend, before a build is queued."""

import copy

from deployhub.engines.preflight import preflight
from tests.test_engines import FINGERPRINT


def verdicts(version, device_class, backends, precision="fp32"):
    return {v.backend: v for v in preflight(version, device_class, backends, precision)}


def test_it_passes_onnxruntime_and_fails_tensorrt_without_a_gpu(version, device_class, make_device):
    device, _ = make_device()
    device.fingerprint = FINGERPRINT
    device.save()
    result = verdicts(version, device_class, ["onnxruntime", "tensorrt"])
    assert result["onnxruntime"].verdict == "ok"
    assert result["tensorrt"].verdict == "fail"
    assert any("deployhub[tensorrt]" in why for why in result["tensorrt"].fails)
    assert any("NVIDIA GPU" in why for why in result["tensorrt"].fails)


def test_it_flags_bf16_without_hardware_and_int8_without_vnni(version, device_class, make_device):
    device, _ = make_device()
    old_cpu = copy.deepcopy(FINGERPRINT)
    old_cpu["cpu"]["flags"] = ["avx2"]
    old_cpu["openvino"] = {"version": "2026.4.1", "devices": ["CPU"]}
    device.fingerprint = old_cpu
    device.save()
    assert verdicts(version, device_class, ["openvino"], "bf16")["openvino"].verdict == "fail"
    assert verdicts(version, device_class, ["openvino"], "int8")["openvino"].verdict == "slow"
    assert verdicts(version, device_class, ["onnxruntime"], "fp16")["onnxruntime"].verdict == "fail"


def test_it_fails_operators_and_opsets_a_backend_does_not_take(version, device_class, make_device):
    device, _ = make_device()
    fingerprint = copy.deepcopy(FINGERPRINT)
    fingerprint["openvino"] = {"version": "2026.4.1", "devices": ["CPU"]}
    device.fingerprint = fingerprint
    device.save()
    ModelVersion = type(version)
    ModelVersion.objects.filter(pk=version.pk).update(
        opset=30, graph={"operators": {"Conv": 1, "com.microsoft.FusedConv": 1}}
    )
    version.refresh_from_db()
    result = verdicts(version, device_class, ["onnxruntime", "openvino"])
    assert any("opset 30" in why for why in result["onnxruntime"].fails)
    assert any("com.microsoft.FusedConv" in why for why in result["openvino"].fails)
    assert not any("FusedConv" in why for why in result["onnxruntime"].fails)


def test_it_says_so_when_no_device_has_reported(version, device_class):
    assert "no device" in verdicts(version, device_class, ["onnxruntime"])["onnxruntime"].fails[0]
