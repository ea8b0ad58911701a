"""Uploaded files: names, kinds, archives, ONNX, .pt2; the code under test never imports torch."""

import os
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from deployhub.registry import archives
from deployhub.registry.archives import (
    check_filename,
    find_single_onnx,
    inspect_pt2,
    safe_extract_zip,
    sniff,
)
from deployhub.registry.inspect import InvalidModel, inspect_onnx
from tests import registry_corpus as corpus

EXTRACTION_FAILURES = [
    corpus.write_zip_with_parent_member,
    corpus.write_zip_with_absolute_member,
    corpus.write_zip_with_backslash_member,
    corpus.write_zip_with_symlink_member,
    corpus.write_zip_with_fifo_member,
    corpus.write_zip_with_encrypted_member,
    corpus.write_zip_with_duplicate_member,
    corpus.write_zip_bomb,
]


@pytest.fixture
def folders(tmp_path):
    """An input folder for the corpus and an empty work folder, as an upload gets."""
    (tmp_path / "in").mkdir()
    (tmp_path / "work").mkdir()
    return tmp_path / "in", tmp_path / "work"


def validate_upload(path, work, max_total_bytes=corpus.BOMB_CAP):
    """Run an upload through the checks in the order the hub runs them."""
    name = check_filename(path.name)
    kind = sniff(name, path.read_bytes()[:64])
    if kind == "onnx":
        return inspect_onnx(path)
    if kind == "pt2":
        return inspect_pt2(path, work, max_total_bytes=max_total_bytes, cap=corpus.default_cap())
    safe_extract_zip(path, work / "zip", max_total_bytes=max_total_bytes, cap=corpus.default_cap())
    return inspect_onnx(find_single_onnx(work / "zip"))


def save(model, path):
    onnx.save_model(model, str(path))
    return path


def model_with_input(dims, name="x"):
    """Return a checker-valid Identity model whose input declares dims."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], ["y"])],
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name, write, message", corpus.CASES, ids=[c[0] for c in corpus.CASES])
def test_it_refuses_every_corpus_case(folders, name, write, message):
    given, work = folders
    path = write(given)
    with pytest.raises(InvalidModel) as refused:
        validate_upload(path, work)
    assert message in str(refused.value)


@pytest.mark.parametrize("write", EXTRACTION_FAILURES, ids=lambda w: w.__name__)
def test_it_leaves_nothing_behind_when_extraction_fails(folders, write):
    given, work = folders
    with pytest.raises(InvalidModel):
        safe_extract_zip(
            write(given), work / "zip", max_total_bytes=corpus.BOMB_CAP, cap=corpus.default_cap()
        )
    assert not (work / "zip").exists()
    assert list(work.iterdir()) == []
    assert not (given.parent / "evil").exists()


def test_it_refuses_too_many_members(folders):
    given, work = folders
    path = given / "many.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for number in range(11):
            archive.writestr(f"f{number}.txt", b"")
    with pytest.raises(InvalidModel, match="holds 11 members; the limit is 10"):
        safe_extract_zip(
            path, work / "zip", max_total_bytes=100, cap=corpus.default_cap(), max_members=10
        )
    assert not (work / "zip").exists()


def understate_sizes(path, declared):
    """Rewrite a one-member zip's local and central headers to claim `declared` bytes."""
    data = bytearray(path.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = data.index(signature)
        data[start + offset : start + offset + 4] = declared.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_it_refuses_a_zip_whose_headers_understate_its_size(folders):
    given, work = folders
    path = given / "liar.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("zeros.bin", bytes(20 * 1024 * 1024))
    understate_sizes(path, 1024)
    assert zipfile.ZipFile(path).infolist()[0].file_size == 1024
    with pytest.raises(InvalidModel, match="'zeros.bin' could not be read"):
        safe_extract_zip(
            path, work / "zip", max_total_bytes=corpus.BOMB_CAP, cap=corpus.default_cap()
        )
    assert not (work / "zip").exists()


def test_it_stops_at_the_cap_by_counting_bytes_not_trusting_headers(folders, monkeypatch):
    given, work = folders
    monkeypatch.setattr(archives, "_check_declared_size", lambda infos, cap: None)
    monkeypatch.setattr(archives, "_check_declared_ratio", lambda infos, cap, size: None)
    with pytest.raises(InvalidModel, match="expands past the 10,485,760 byte limit"):
        safe_extract_zip(
            corpus.write_zip_bomb(given),
            work / "zip",
            max_total_bytes=corpus.BOMB_CAP,
            cap=archives.RatioCap(ratio=10**6, allowance=0),  # the size cap trips first
        )
    assert not (work / "zip").exists()


def test_it_extracts_a_good_zip_and_reads_its_external_data(folders):
    given, work = folders
    members = safe_extract_zip(
        corpus.write_good_onnx_zip(given),
        work / "zip",
        max_total_bytes=corpus.BOMB_CAP,
        cap=corpus.default_cap(),
    )
    model_path = find_single_onnx(work / "zip")
    info = inspect_onnx(model_path)
    plain = inspect_onnx(corpus.DEMO_MODEL)
    assert sorted(members) == ["model.onnx", "weights.bin"]
    assert model_path == work / "zip" / "model.onnx"
    assert info["external_data"] == ["weights.bin"]
    assert info["inputs"] == plain["inputs"] and info["graph"] == plain["graph"]
    assert plain["external_data"] == []


def test_it_reports_the_demo_graph():
    model = onnx.load(str(corpus.DEMO_MODEL))
    weights = [numpy_helper.to_array(init) for init in model.graph.initializer]
    graph = inspect_onnx(corpus.DEMO_MODEL)["graph"]
    assert graph["operators"]["Conv"] == 3
    assert graph["operators"]["BatchNormalization"] == 3
    assert graph["operators"]["Relu"] == 3
    assert graph["nodes"] == len(model.graph.node) == sum(graph["operators"].values())
    assert graph["parameters"] == sum(w.size for w in weights)
    assert graph["parameter_bytes"] == sum(w.nbytes for w in weights)


def test_it_counts_operators_inside_subgraphs_and_custom_domains(tmp_path):
    def branch(op):
        out = helper.make_tensor_value_info(f"{op}_out", TensorProto.FLOAT, [2])
        return helper.make_graph([helper.make_node(op, ["x"], [f"{op}_out"])], op, [], [out])

    nodes = [
        helper.make_node(
            "If", ["cond"], ["y"], then_branch=branch("Relu"), else_branch=branch("Neg")
        ),
        helper.make_node("Gelu", ["y"], ["z"], domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    path = save(helper.make_model(graph, opset_imports=opsets), tmp_path / "if.onnx")
    report = inspect_onnx(path)["graph"]
    assert report["operators"] == {"If": 1, "Neg": 1, "Relu": 1, "com.microsoft.Gelu": 1}
    assert report["nodes"] == 4


def test_it_reads_negative_dims_as_dynamic_axes_named_by_their_index(tmp_path):
    path = save(model_with_input([-1, 3, -1, 0]), tmp_path / "negative.onnx")

    info = inspect_onnx(path)

    assert info["inputs"][0]["shape"] == ["dim_0", 3, "dim_2", 0]
    assert info["outputs"][0]["shape"] == ["dim_0", 3, "dim_2", 0]


def test_it_counts_symbolic_dims_as_one(tmp_path):
    fits = save(model_with_input(["batch", 1000, 1000]), tmp_path / "fits.onnx")
    too_big = save(model_with_input(["batch", 1001, 1000]), tmp_path / "big.onnx")
    assert inspect_onnx(fits, max_input_elements=10**6)["inputs"][0]["shape"][0] == "batch"
    with pytest.raises(
        InvalidModel, match=r"declares 1,001,000 elements .* the limit is 1,000,000"
    ):
        inspect_onnx(too_big, max_input_elements=10**6)


def test_it_leaves_initializers_out_of_old_ir_inputs(tmp_path):
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "old",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)], ir_version=3)
    info = inspect_onnx(save(model, tmp_path / "old.onnx"))
    assert [value["name"] for value in info["inputs"]] == ["x"]
    assert info["graph"]["parameters"] == 2


def model_reading(tmp_path, location, offset="0"):
    """Save a model whose weight is read from `location`, next to it in tmp_path."""
    weight = corpus._external_weight(location, offset=offset)
    return save(corpus._tiny_model(weight), tmp_path / "model.onnx")


def test_it_refuses_external_data_through_a_link_out(tmp_path):
    (tmp_path / "weights.bin").symlink_to("/etc/passwd")
    with pytest.raises(InvalidModel, match="resolves, through a link, to a place outside"):
        inspect_onnx(model_reading(tmp_path, "weights.bin"))


def test_it_refuses_external_data_that_is_a_link_inside(tmp_path):
    (tmp_path / "real.bin").write_bytes(bytes(16))
    (tmp_path / "weights.bin").symlink_to(tmp_path / "real.bin")
    with pytest.raises(InvalidModel, match="is a link or a special file"):
        inspect_onnx(model_reading(tmp_path, "weights.bin"))


@pytest.mark.parametrize("location", ["a\\weights.bin", "weights\x00.bin", "\\\\server\\x"])
def test_it_refuses_external_data_names_with_backslashes_or_nul(tmp_path, location):
    with pytest.raises(InvalidModel, match="NUL or a backslash"):
        inspect_onnx(model_reading(tmp_path, location))


def test_it_refuses_negative_external_data_offsets(tmp_path):
    (tmp_path / "weights.bin").write_bytes(bytes(16))
    with pytest.raises(InvalidModel, match="offset '-1'; it must be a non-negative"):
        inspect_onnx(model_reading(tmp_path, "weights.bin", offset="-1"))


def test_it_accepts_external_data_in_a_subfolder(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "weights.bin").write_bytes(bytes(16))
    assert inspect_onnx(model_reading(tmp_path, "data/weights.bin"))["external_data"] == [
        "data/weights.bin"
    ]


@pytest.mark.parametrize(
    "name, message",
    [
        ("../x.onnx", "is a path"),
        ("a\\b.onnx", "is a path"),
        ("..", "is a path"),
        ("x\x00.onnx", "control characters"),
        ("m" * 295 + ".onnx", "300 characters long"),
        ("model\u202egpj.onnx", "invisible formatting characters"),
        ("mod\u200bel.onnx", "invisible formatting characters"),
        ("a\x85b.onnx", "control characters"),
        ("", "has no name"),
    ],
)
def test_it_refuses_bad_file_names(name, message):
    with pytest.raises(InvalidModel) as refused:
        check_filename(name)
    assert message in str(refused.value)


def test_it_accepts_a_plain_file_name():
    assert check_filename("model-v2.onnx") == "model-v2.onnx"


@pytest.mark.parametrize("name", ["gerät.onnx", "モデル.onnx", "<script>.onnx", "a b (2).zip"])
def test_it_accepts_names_in_any_script(name):
    assert check_filename(name) == name


def test_it_keeps_a_decomposed_name_in_its_composed_form():
    assert check_filename("gera\u0308t.onnx") == "gerät.onnx"


@pytest.mark.parametrize(
    "name", ["model.pt", "model.pth", "model.pkl", "m.pickle", "m.ckpt", "m.bin", "m.joblib"]
)
def test_it_refuses_pickle_extensions_with_the_export_recipe(name):
    with pytest.raises(InvalidModel) as refused:
        sniff(name, b"PK\x03\x04" + bytes(60))
    assert "runs arbitrary code" in str(refused.value)
    assert "torch.export" in str(refused.value) and "torch.onnx.export" in str(refused.value)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_it_refuses_pickled_content_under_any_name(protocol):
    head = b"\x80" + bytes([protocol]) + bytes(62)
    for name in ("model.zip", "model.pt2", "model.weights"):
        with pytest.raises(InvalidModel, match="runs arbitrary code"):
            sniff(name, head)


def test_it_refuses_unknown_extensions_naming_the_accepted_ones():
    with pytest.raises(
        InvalidModel, match=r"does not accept \.h5 files: upload a \.onnx"
    ) as refused:
        sniff("model.h5", b"\x89HDF")
    assert ".zip of an ONNX model with its external data" in str(refused.value)
    assert ".pt2" in str(refused.value)


def test_it_refuses_a_zip_named_onnx_as_not_an_onnx_model():
    with pytest.raises(InvalidModel, match="This is not an ONNX model: it is a zip archive"):
        sniff("model.onnx", b"PK\x03\x04" + bytes(60))


def test_it_refuses_a_zip_or_pt2_that_is_not_a_zip():
    with pytest.raises(InvalidModel, match=r"This \.pt2 file is not a zip archive"):
        sniff("model.pt2", b"\x08\x08\x12")


def test_it_sniffs_the_accepted_kinds():
    onnx_head = corpus.DEMO_MODEL.read_bytes()[:64]
    assert sniff("model.onnx", onnx_head) == "onnx"
    assert sniff("Model.ONNX", onnx_head) == "onnx"
    assert sniff("model.zip", b"PK\x03\x04" + bytes(60)) == "onnx-zip"
    assert sniff("model.pt2", b"PK\x03\x04" + bytes(60)) == "pt2"


def test_it_reads_a_pt2_signature_without_loading_it(folders):
    given, work = folders
    info = inspect_pt2(corpus.write_good_pt2(given), work, cap=corpus.default_cap())
    assert info["format"] == "pt2"
    assert info["inputs"] == [{"name": "image", "dtype": "float", "shape": [1, 3, 16, 16]}]
    assert info["outputs"][0]["shape"] == [1, 4] and info["outputs"][0]["dtype"] == "float"
    assert info["torch_version"].startswith("2.13")
    assert list(work.iterdir()) == []


def test_it_reads_a_symbolic_pt2_batch_dim(folders):
    given, work = folders
    path = corpus.write_good_pt2(given, dynamic_batch=True)
    shape = inspect_pt2(path, work, cap=corpus.default_cap())["inputs"][0]["shape"]
    sizes = corpus.program_json(path)["graph_module"]["graph"]["tensor_values"]["image"]["sizes"]
    assert isinstance(shape[0], str) and f"'{shape[0]}'" in sizes[0]["as_expr"]["expr_str"]
    assert shape[1:] == [3, 16, 16]


def test_it_validates_a_pt2_without_importing_torch(folders):
    given, work = folders
    path = corpus.write_good_pt2(given)
    script = (
        "import sys\n"
        "from deployhub.registry.archives import RatioCap, inspect_pt2\n"
        "from deployhub.registry.inspect import inspect_onnx\n"
        f"inspect_pt2({str(path)!r}, {str(work)!r}, cap=RatioCap(100, 102400))\n"
        f"inspect_onnx({str(corpus.DEMO_MODEL)!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(corpus.ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


def test_it_writes_an_object_array_npz_that_plain_numpy_refuses(tmp_path):
    path = corpus.write_object_array_npz(tmp_path)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        np.load(path, allow_pickle=False)["inputs"]
