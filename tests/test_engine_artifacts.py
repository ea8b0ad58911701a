"""The hub's check that an uploaded engine is what its backend builds, before it signs one.

Real engines of each CPU backend pass it in their backends' tests; here, files
that are not engines are refused with a reason, each backend's way, and the
check runs in a capped child process as the hub runs it.
"""

import json
import subprocess
import sys
import zipfile

from tests.conftest import ASSETS, ROOT
from workers.backends import artifacts, tensorrt_plan
from workers.backends.known import BACKENDS, get

MODEL = ASSETS / "digits_cnn_v2.onnx"


def zipped(tmp_path, members, name="engine.zip"):
    path = tmp_path / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return path


def onnxruntime_backend():
    return get("onnxruntime")


def test_every_known_backend_says_how_its_engines_are_checked(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00" * 64)
    for backend in BACKENDS.values():
        problem = backend.artifact_problem(junk)
        assert problem and "has no check" not in problem, backend.name


def test_an_onnx_engine_must_parse_and_its_archive_hold_only_its_two_files(tmp_path):
    ort = onnxruntime_backend()
    model = MODEL.read_bytes()
    assert ort.artifact_problem(MODEL) == ""
    good = zipped(tmp_path, {"engine.onnx": model, "engine.onnx.data": b"weights"})
    assert ort.artifact_problem(good) == ""
    extra = zipped(tmp_path, {"engine.onnx": model, "run.sh": b"#!/bin/sh"}, "extra.zip")
    assert "'run.sh' is not one this backend writes" in ort.artifact_problem(extra)
    escape = zipped(tmp_path, {"engine.onnx": model, "../engine.onnx.data": b"w"}, "esc.zip")
    assert "points outside the archive" in ort.artifact_problem(escape)
    fake = zipped(tmp_path, {"engine.onnx": b"not a model"}, "fake.zip")
    assert "does not parse as an ONNX model" in ort.artifact_problem(fake)


def test_an_openvino_engine_must_hold_an_ir(tmp_path):
    openvino = get("openvino")
    ir = b'<?xml version="1.0"?><net name="m" version="11"><layers/><edges/></net>'
    assert openvino.artifact_problem(zipped(tmp_path, {"model.xml": ir, "model.bin": b""})) == ""
    html = zipped(tmp_path, {"model.xml": b"<html></html>", "model.bin": b""}, "html.zip")
    assert "not an OpenVINO IR" in openvino.artifact_problem(html)
    no_weights = zipped(tmp_path, {"model.xml": ir}, "noweights.zip")
    assert "lacks model.bin" in openvino.artifact_problem(no_weights)


def test_a_tensorrt_plan_is_known_by_its_header():
    header = (tensorrt_plan.PLAN_MAGIC).to_bytes(4, "little") + bytes(24)
    assert tensorrt_plan.plan_problem(header) == ""
    assert "tag" in tensorrt_plan.plan_problem(MODEL.read_bytes()[:28])
    assert "shorter" in tensorrt_plan.plan_problem(b"ftrt")


def test_an_aoti_package_is_a_pt2_archive_with_aotinductor_code(tmp_path):
    check = artifacts.pt2_package_problem
    args = ("data/aotinductor/", "archive_format", b"pt2")
    package = zipped(
        tmp_path,
        {"model/archive_format": b"pt2", "model/data/aotinductor/model/m.wrapper.so": b"\x7fELF"},
    )
    assert check(package, *args) == ""
    program = zipped(tmp_path, {"model/archive_format": b"pt2", "model/models/m.json": b"{}"}, "p")
    assert "without AOTInductor code" in check(program, *args)
    assert "not a zip archive" in check(MODEL, *args)


def test_a_bomb_in_an_engine_archive_is_refused(tmp_path):
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("engine.onnx", bytes(20_000_000))
    assert "unpacks" in onnxruntime_backend().artifact_problem(path)


def test_the_hub_runs_the_check_in_a_capped_child(tmp_path):
    junk = tmp_path / "engine.onnx"
    junk.write_bytes(b"an optimised onnx model")
    name = onnxruntime_backend().name
    command = [sys.executable, "-m", "workers.backends.artifacts", name, str(junk), "512"]

    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=True)

    assert "does not parse" in json.loads(done.stdout)["problem"]
    assert get(name).artifact_problem(MODEL) == ""


def test_an_onnx_engine_cannot_point_its_weights_outside_its_archive(tmp_path):
    import onnx

    model = onnx.load(str(MODEL))
    tensor = model.graph.initializer[0]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "../../secrets/weights.bin"
    bare = tmp_path / "engine.onnx"
    bare.write_bytes(model.SerializeToString())

    assert "points at weights outside it" in onnxruntime_backend().artifact_problem(bare)
    entry.value = "engine.onnx.data"
    inside = zipped(tmp_path, {"engine.onnx": model.SerializeToString(), "engine.onnx.data": b""})
    assert onnxruntime_backend().artifact_problem(inside) == ""
