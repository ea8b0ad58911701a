"""Preflight: what will fail or be slow, per backend, before a build is queued."""

import copy

from deployhub.engines.preflight import preflight
from tests.compile_jobs import FINGERPRINT


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


def with_capabilities(capabilities, **toolchains):
    fingerprint = copy.deepcopy(FINGERPRINT)
    fingerprint["openvino"] = {"version": "2026.4.1", "devices": ["CPU"]}
    return {**fingerprint, **toolchains, "capabilities": capabilities}


NO_SYMPY = {"ok": False, "reason": "sympy is missing: pip install deployhub[worker]"}
NO_NNCF = {"ok": False, "reason": "nncf is missing: pip install deployhub[openvino]"}


def test_it_fails_int8_when_no_device_can_import_the_quantiser(version, device_class, make_device):
    device, _ = make_device()
    device.fingerprint = with_capabilities(
        {"onnxruntime": {"int8": NO_SYMPY}, "openvino": {"int8": NO_NNCF}}
    )
    device.save()

    int8 = verdicts(version, device_class, ["onnxruntime", "openvino"], "int8")
    fp32 = verdicts(version, device_class, ["onnxruntime", "openvino"], "fp32")

    assert int8["onnxruntime"].verdict == "fail"
    assert int8["onnxruntime"].fails == [
        "no device of the class can build int8 with onnxruntime: "
        "sympy is missing: pip install deployhub[worker]"
    ]
    assert int8["openvino"].fails == [
        "no device of the class can build int8 with openvino: "
        "nncf is missing: pip install deployhub[openvino]"
    ]
    assert fp32["onnxruntime"].verdict == fp32["openvino"].verdict == "ok"


def test_it_passes_int8_when_one_device_of_the_class_can(version, device_class, make_device):
    lacking, _ = make_device("lacking")
    lacking.fingerprint = with_capabilities({"onnxruntime": {"int8": NO_SYMPY}})
    lacking.save()
    able, _ = make_device("able")
    able.fingerprint = with_capabilities({"onnxruntime": {"int8": {"ok": True}}})
    able.save()

    assert verdicts(version, device_class, ["onnxruntime"], "int8")["onnxruntime"].verdict == "ok"


def test_it_does_not_fail_a_build_a_device_says_nothing_about(version, device_class, make_device):
    # A worker from before capabilities were reported, and one whose report is garbled.
    old, _ = make_device("old")
    old.fingerprint = copy.deepcopy(FINGERPRINT)
    old.save()
    garbled, _ = make_device("garbled")
    garbled.fingerprint = with_capabilities({"onnxruntime": ["int8"], "openvino": {"int8": 1}})
    garbled.save()

    result = verdicts(version, device_class, ["onnxruntime"], "int8")

    assert result["onnxruntime"].verdict == "ok"


def test_it_names_the_runtime_and_extra_from_the_backend_class(version, device_class, make_device):
    device, _ = make_device()
    device.fingerprint = copy.deepcopy(FINGERPRINT)  # ONNX Runtime only
    device.save()

    result = verdicts(version, device_class, ["openvino", "torch-aoti"])

    assert "no device of the class has openvino: install deployhub[openvino]" in (
        result["openvino"].fails
    )
    assert "no device of the class has torch: install deployhub[torch]" in (
        result["torch-aoti"].fails
    )


def test_it_passes_int8_on_this_workers_real_fingerprint(version, device_class, make_device):
    from workers import fingerprint

    device, _ = make_device()
    device.fingerprint = fingerprint.collect()
    device.save()

    result = verdicts(version, device_class, ["onnxruntime", "openvino"], "int8")

    assert device.fingerprint["capabilities"]["onnxruntime"]["int8"] == {"ok": True}
    assert result["onnxruntime"].fails == [] and result["openvino"].fails == []


def test_it_refuses_an_opset_older_than_a_backend_runs_and_says_how_to_convert(
    version, device_class, make_device
):
    device, _ = make_device()
    fingerprint = copy.deepcopy(FINGERPRINT)
    fingerprint["openvino"] = {"version": "2026.4.1", "devices": ["CPU"]}
    device.fingerprint = fingerprint
    device.save()
    type(version).objects.filter(pk=version.pk).update(opset=6)
    version.refresh_from_db()

    result = verdicts(version, device_class, ["onnxruntime", "openvino", "tensorrt"])

    assert result["onnxruntime"].fails == [
        "opset 6 is older than onnxruntime runs (≥ 7): "
        "convert it (Convert to opset 17 on the version page)"
    ]
    assert any(  # its frontend reads opset 6, but builds are measured against the source in ORT
        "opset 6 is older than openvino runs (≥ 7)" in why for why in result["openvino"].fails
    )
    assert any(
        "opset 6 is older than tensorrt runs (≥ 9)" in why for why in result["tensorrt"].fails
    )
