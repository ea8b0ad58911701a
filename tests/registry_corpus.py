"""Write bad and good upload files for the registry's validation tests, at test time.

Each `write_*` function writes one file into the given folder and returns its
path; nothing here is committed as a binary. `CASES` lists the model-file cases
the hub must refuse, as (case name, writer, fragment of the error message), so
the same corpus can drive unit tests and HTTP-level tests. The zip bomb only
trips a cap of BOMB_CAP bytes or less: set the upload cap to it in such tests.
Writers that need torch import it lazily; the hub modules under test never do.
"""

import io
import json
import pickle
import random
import shutil
import stat
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
from django.conf import settings
from onnx import TensorProto, helper

from deployhub.registry.archives import RatioCap

ROOT = Path(__file__).resolve().parent.parent
DEMO_MODEL = ROOT / "deployhub" / "demo" / "assets" / "digits_cnn_v2.onnx"
BOMB_CAP = 10 * 1024 * 1024
BOMB_BYTES = 50 * 1024 * 1024
PICKLE_MESSAGE = "runs arbitrary code"


def default_cap():
    """Return the compression-ratio cap the hub unpacks uploads under by default (settings)."""
    return RatioCap(settings.DEPLOYHUB_MAX_UNPACK_RATIO, settings.DEPLOYHUB_UNPACK_ALLOWANCE_BYTES)


def _tiny_model(weight, input_dims=(1, 4)):
    """Return a one-node model y = x + w, with w the given initializer."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", weight.name], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_dims))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(input_dims))],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _external_weight(location, offset=0, length=16):
    """Return a 4-float initializer whose data is said to live in another file."""
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        weight.external_data.add(key=key, value=str(value))
    return weight


def _write_model(model, path):
    onnx.save_model(model, str(path))
    return path


def _write_zip(path, members):
    """Write a zip from (ZipInfo or name, bytes) pairs, exactly as given."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for info, data in members:
            archive.writestr(info, data)
    return path


def _member(name, mode):
    """Return a ZipInfo for a Unix member of the given st_mode (a link, a fifo)."""
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3
    info.external_attr = mode << 16
    return info


# Bad model files --------------------------------------------------------------


def write_random_bytes_onnx(folder):
    path = Path(folder) / "random.onnx"
    path.write_bytes(random.Random(7).randbytes(4096))
    return path


def write_truncated_onnx(folder):
    path = Path(folder) / "truncated.onnx"
    data = DEMO_MODEL.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def write_pickle_named_onnx(folder):
    path = Path(folder) / "model.onnx"
    path.write_bytes(pickle.dumps({"state_dict": [1.0, 2.0]}, protocol=2))
    return path


def write_onnx_with_parent_external_data(folder):
    model = _tiny_model(_external_weight("../../etc/passwd"))
    return _write_model(model, Path(folder) / "parent-data.onnx")


def write_onnx_with_absolute_external_data(folder):
    model = _tiny_model(_external_weight("/etc/passwd"))
    return _write_model(model, Path(folder) / "absolute-data.onnx")


def write_onnx_with_nested_parent_external_data(folder):
    model = _tiny_model(_external_weight("a/../../x"))
    return _write_model(model, Path(folder) / "nested-parent-data.onnx")


def write_onnx_with_windows_external_data(folder):
    model = _tiny_model(_external_weight("C:\\weights.bin"))
    return _write_model(model, Path(folder) / "windows-data.onnx")


def write_onnx_with_missing_external_data(folder):
    model = _tiny_model(_external_weight("weights.bin"))
    return _write_model(model, Path(folder) / "missing-data.onnx")


def write_onnx_with_huge_input(folder):
    """Write a model whose input declares 10^12 elements."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1], [0.0])
    model = _tiny_model(weight, input_dims=(1_000_000, 1_000_000))
    return _write_model(model, Path(folder) / "huge-input.onnx")


def write_zip_with_short_external_data(folder):
    """Write a zip whose model reads 16 bytes of a 4-byte external data file."""
    model = _tiny_model(_external_weight("weights.bin"))
    members = [("model.onnx", model.SerializeToString()), ("weights.bin", b"\x00" * 4)]
    return _write_zip(Path(folder) / "short-data.zip", members)


def write_zip_with_parent_member(folder):
    return _write_zip(Path(folder) / "parent.zip", [("../evil", b"x")])


def write_zip_with_absolute_member(folder):
    return _write_zip(Path(folder) / "absolute.zip", [("/evil", b"x")])


def write_zip_with_backslash_member(folder):
    return _write_zip(Path(folder) / "backslash.zip", [("a\\..\\..\\evil", b"x")])


def write_zip_with_symlink_member(folder):
    link = _member("weights.bin", mode=stat.S_IFLNK | 0o777)
    return _write_zip(Path(folder) / "symlink.zip", [(link, b"/etc/passwd")])


def write_zip_with_fifo_member(folder):
    fifo = _member("pipe", mode=stat.S_IFIFO | 0o644)
    return _write_zip(Path(folder) / "fifo.zip", [(fifo, b"")])


def write_zip_with_encrypted_member(folder):
    """Write a zip whose one member is flagged encrypted (zipfile cannot write one)."""
    path = _write_zip(Path(folder) / "encrypted.zip", [("model.onnx", b"sealed")])
    data = bytearray(path.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        data[data.index(signature) + offset] |= 0x1
    path.write_bytes(bytes(data))
    return path


def write_zip_with_duplicate_member(folder):
    path = Path(folder) / "duplicate.zip"
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as archive:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate, and writes it
        archive.writestr("model.onnx", DEMO_MODEL.read_bytes())
        archive.writestr("model.onnx", b"second")
    return path


def write_zip_bomb(folder):
    """Write a small zip that expands to BOMB_BYTES of zeros."""
    path = Path(folder) / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        with archive.open("zeros.bin", "w", force_zip64=True) as member:
            chunk = bytes(1024 * 1024)
            for _ in range(BOMB_BYTES // len(chunk)):
                member.write(chunk)
    return path


def write_zip_without_onnx(folder):
    return _write_zip(Path(folder) / "no-model.zip", [("README.txt", b"weights elsewhere")])


def write_zip_with_two_onnx(folder):
    data = DEMO_MODEL.read_bytes()
    return _write_zip(Path(folder) / "two-models.zip", [("a.onnx", data), ("b.onnx", data)])


def write_pickled_pt(folder):
    path = Path(folder) / "model.pt"
    path.write_bytes(pickle.dumps({"conv.weight": [0.1, 0.2], "epoch": 3}))
    return path


def write_torch_checkpoint_as_pt2(folder):
    """Write a torch.save state dict (a zip around data.pkl) under a .pt2 name."""
    import torch

    path = Path(folder) / "checkpoint.pt2"
    torch.save(torch.nn.Linear(4, 2).state_dict(), path)
    return path


def _rewrite_pt2(source, path, replace):
    """Copy a .pt2, passing each member's bytes through replace(name, data)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(path, "w") as new:
        for info in old.infolist():
            new.writestr(info.filename, replace(info.filename, old.read(info)))
    return path


class _RunsCommand:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


def _pt2_with_sample_pickle(folder, pickled, name):
    """Write a good .pt2 whose sample inputs (a torch.save zip) hold the given pickle."""
    good = write_good_pt2(Path(folder))
    payload = io.BytesIO()
    with zipfile.ZipFile(payload, "w") as inner:
        inner.writestr("archive/data.pkl", pickled)
        inner.writestr("archive/version", b"3\n")
    replace = lambda member, data: payload.getvalue() if "sample_inputs" in member else data  # noqa: E731
    return _rewrite_pt2(good, Path(folder) / name, replace)


def write_pt2_with_code_in_sample_inputs(folder):
    """Write a .pt2 whose sample inputs pickle calls os.system when a worker loads it."""
    pickled = pickle.dumps(_RunsCommand(), protocol=2)
    return _pt2_with_sample_pickle(folder, pickled, "sample-inputs-code.pt2")


def write_pt2_with_hidden_import_in_sample_inputs(folder):
    """Write a .pt2 whose sample inputs import os.system through memo lookups."""
    pickled = b"\x80\x04\x8c\x05posix\x94\x8c\x06system\x94h\x00h\x01\x93\x8c\x01x\x85R."
    return _pt2_with_sample_pickle(folder, pickled, "sample-inputs-hidden.pt2")


def write_pt2_calling_a_non_operator(folder):
    """Write a .pt2 whose graph calls operator.attrgetter, a step to reach os.system."""
    good = write_good_pt2(Path(folder))

    def replace(name, data):
        if name.endswith("models/model.json"):
            return data.replace(b'"torch.ops.aten.relu.default"', b'"_operator.attrgetter"')
        return data

    return _rewrite_pt2(good, Path(folder) / "non-operator.pt2", replace)


def write_pt2_with_code_in_shape_expression(folder):
    """Write a .pt2 whose symbolic dim is a Python expression sympy would evaluate."""
    good = write_good_pt2(Path(folder), dynamic_batch=True)

    def replace(name, data):
        if not name.endswith("models/model.json"):
            return data
        text = data.decode().replace("Symbol(", "__import__('os').system('echo pwned') or Symbol(")
        return text.encode()

    return _rewrite_pt2(good, Path(folder) / "shape-code.pt2", replace)


def write_pt2_with_pickled_weights(folder):
    """Write a .pt2 whose weights config says a weight must be unpickled."""
    good = write_good_pt2(Path(folder))

    def replace(name, data):
        if name.endswith("_weights_config.json"):
            return data.replace(b'"use_pickle": false', b'"use_pickle": true')
        return data

    return _rewrite_pt2(good, Path(folder) / "pickled-weights.pt2", replace)


def write_pt2_with_compiled_code(folder):
    """Write a .pt2 that carries an AOTInductor shared library next to the program."""
    good = write_good_pt2(Path(folder))
    path = Path(folder) / "compiled.pt2"
    shutil.copyfile(good, path)
    with zipfile.ZipFile(path, "a") as archive:
        root = archive.namelist()[0].split("/")[0]
        archive.writestr(f"{root}/data/aotinductor/model/model.so", b"\x7fELF")
    return path


# Good files and data sets -----------------------------------------------------


def write_good_onnx_zip(folder):
    """Write a zip of the demo model with its weights in weights.bin beside it."""
    staging = Path(folder) / "external-model"
    staging.mkdir()
    onnx.save_model(
        onnx.load(str(DEMO_MODEL)),
        str(staging / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    path = Path(folder) / "external-model.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in ("model.onnx", "weights.bin"):
            archive.write(staging / name, name)
    shutil.rmtree(staging)
    return path


def write_good_pt2(folder, dynamic_batch=False):
    """Write a torch.export program of a small conv net taking a [1, 3, 16, 16] image."""
    import torch

    class TinyNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, image):
            return self.conv(image).relu().mean(dim=(2, 3))

    example = (torch.randn(2 if dynamic_batch else 1, 3, 16, 16),)
    dims = {"image": {0: torch.export.Dim("batch", min=1, max=64)}} if dynamic_batch else None
    program = torch.export.export(TinyNet().eval(), example, dynamic_shapes=dims)
    path = Path(folder) / ("tiny-dynamic.pt2" if dynamic_batch else "tiny.pt2")
    torch.export.save(program, path)
    return path


def write_object_array_npz(folder):
    """Write an .npz whose array holds Python objects: loading it needs pickle."""
    path = Path(folder) / "objects.npz"
    np.savez(path, inputs=np.array([{"a": 1}], dtype=object))
    return path


def program_json(pt2_path):
    """Return the exported program JSON inside a .pt2, for tests to compare against."""
    with zipfile.ZipFile(pt2_path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/models/model.json"))
        return json.loads(archive.read(name))


OUTSIDE = "points outside the upload"
CASES = [
    ("random bytes named .onnx", write_random_bytes_onnx, "not an ONNX model"),
    ("truncated ONNX", write_truncated_onnx, "not an ONNX model"),
    ("pickle named .onnx", write_pickle_named_onnx, "not an ONNX model"),
    ("external data ../../etc/passwd", write_onnx_with_parent_external_data, OUTSIDE),
    ("external data /etc/passwd", write_onnx_with_absolute_external_data, OUTSIDE),
    ("external data a/../../x", write_onnx_with_nested_parent_external_data, OUTSIDE),
    ("external data C:\\weights.bin", write_onnx_with_windows_external_data, OUTSIDE),
    ("external data not uploaded", write_onnx_with_missing_external_data, "is missing"),
    ("external data too short", write_zip_with_short_external_data, "shorter than the model"),
    ("input of 10^12 elements", write_onnx_with_huge_input, "declares 1,000,000,000,000"),
    ("zip member ../evil", write_zip_with_parent_member, "climbs out"),
    ("zip member /evil", write_zip_with_absolute_member, "absolute path"),
    ("zip member with backslashes", write_zip_with_backslash_member, "backslash"),
    ("zip symlink member", write_zip_with_symlink_member, "symbolic link"),
    ("zip fifo member", write_zip_with_fifo_member, "special file"),
    ("zip encrypted member", write_zip_with_encrypted_member, "encrypted"),
    ("zip duplicate member", write_zip_with_duplicate_member, "twice"),
    ("zip bomb", write_zip_bomb, "expands to"),
    ("zip without .onnx", write_zip_without_onnx, "holds no .onnx file"),
    ("zip with two .onnx", write_zip_with_two_onnx, "holds 2 .onnx files: a.onnx, b.onnx"),
    ("pickled .pt", write_pickled_pt, PICKLE_MESSAGE),
    ("torch.save checkpoint named .pt2", write_torch_checkpoint_as_pt2, PICKLE_MESSAGE),
    (
        "pt2 sample inputs call os.system",
        write_pt2_with_code_in_sample_inputs,
        "inputs that import",
    ),
    ("pt2 hidden import in sample inputs", write_pt2_with_hidden_import_in_sample_inputs, "hide"),
    ("pt2 graph calls a non-operator", write_pt2_calling_a_non_operator, "not a torch operator"),
    ("pt2 shape expression runs code", write_pt2_with_code_in_shape_expression, "not plain"),
    ("pt2 with pickled weights", write_pt2_with_pickled_weights, "as a pickle"),
    ("pt2 with AOTInductor library", write_pt2_with_compiled_code, "compiled code"),
]
