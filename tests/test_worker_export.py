"""Exporting a torch.export program (.pt2) to ONNX on a worker."""

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from workers.checks.export import export_pt2_to_onnx
from workers.errors import JobError

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = {"image": [2, 3, 32, 32]}


class SmallNet(torch.nn.Module):
    """A small vision model: Conv + BatchNorm + ReLU + pooling + Linear."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, image):
        features = self.pool(torch.relu(self.bn(self.conv(image))))
        return self.fc(torch.flatten(features, 1))


def small_net():
    """Return SmallNet in eval mode, with BatchNorm statistics that are not the identity."""
    torch.manual_seed(0)
    model = SmallNet()
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return small_net()


@pytest.fixture(scope="module")
def pt2(model, tmp_path_factory):
    """The model exported with a dynamic batch dimension, saved as a .pt2."""
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(
        model, (torch.randn(4, 3, 32, 32),), dynamic_shapes={"image": {0: batch}}
    )
    path = tmp_path_factory.mktemp("pt2") / "small.pt2"
    torch.export.save(program, path)
    return path


@pytest.fixture(scope="module")
def exported(pt2, tmp_path_factory):
    """Export the .pt2 at the contract's fixed shape; return (onnx path, result, progress)."""
    out = tmp_path_factory.mktemp("onnx") / "small.onnx"
    reports = []
    result = export_pt2_to_onnx(pt2, out, {"input_shapes": CONTRACT}, progress=_record(reports))
    return out, result, reports


def _record(reports):
    return lambda fraction, message: reports.append((fraction, message))


def test_it_writes_an_onnx_model_that_passes_the_full_checker(exported):
    path, result, _ = exported

    onnx.checker.check_model(str(path), full_check=True)
    assert result["onnx_bytes"] == path.stat().st_size
    assert list(path.parent.iterdir()) == [path]  # no external data beside it


def test_it_fixes_the_input_shape_to_the_contract(exported):
    path, result, _ = exported

    [graph_input] = onnx.load(str(path)).graph.input
    dims = [dim.dim_value for dim in graph_input.type.tensor_type.shape.dim]
    assert graph_input.name == "image"
    assert dims == [2, 3, 32, 32]
    assert result["input_shapes"] == CONTRACT


def test_it_reports_the_comparison_with_the_program(exported):
    _, result, _ = exported

    assert result["opset"] == 17
    assert result["torch_version"] == torch.__version__
    assert result["samples"] == 4
    assert result["outputs"] == ["output"]
    assert 0 <= result["max_abs_diff"] < 1e-4
    assert 0 <= result["max_rel_diff"] < 1e-3


def test_it_reports_progress_through_its_phases(exported):
    _, _, reports = exported

    messages = [message for _, message in reports]
    for phase in ("loading", "exporting", "checking", "comparing"):
        assert any(phase in message for message in messages), messages
    fractions = [fraction for fraction, _ in reports]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_it_agrees_with_the_torch_module_on_a_fresh_input(exported, model):
    path, _, _ = exported
    image = np.random.default_rng(123).standard_normal((2, 3, 32, 32), dtype=np.float32)

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    [got] = session.run(None, {"image": image})
    with torch.no_grad():
        wanted = model(torch.from_numpy(image)).numpy()

    assert got.shape == (2, 10)
    np.testing.assert_allclose(got, wanted, rtol=0, atol=1e-4)


def test_it_names_the_onnx_input_after_the_contract_when_the_program_names_it_otherwise(
    pt2, tmp_path
):
    out = tmp_path / "renamed.onnx"

    result = export_pt2_to_onnx(pt2, out, {"input_shapes": {"input": [1, 3, 32, 32]}, "samples": 1})

    assert [graph_input.name for graph_input in onnx.load(str(out)).graph.input] == ["input"]
    assert result["input_shapes"] == {"input": [1, 3, 32, 32]}


def test_it_refuses_a_wrong_number_of_input_shapes(pt2, tmp_path):
    shapes = {"image": [1, 3, 32, 32], "mask": [1, 1, 32, 32]}

    with pytest.raises(JobError) as refused:
        export_pt2_to_onnx(pt2, tmp_path / "out.onnx", {"input_shapes": shapes})

    message = str(refused.value)
    assert "the program takes 1 input(s) (image)" in message
    assert "input_shapes gives 2 (image, mask)" in message


def test_it_refuses_a_shape_outside_the_program_s_range(pt2, tmp_path):
    with pytest.raises(JobError, match=r"refuses inputs of shapes \[65, 3, 32, 32\]"):
        export_pt2_to_onnx(pt2, tmp_path / "out.onnx", {"input_shapes": {"image": [65, 3, 32, 32]}})


def test_it_refuses_a_file_that_is_not_a_pt2(tmp_path):
    junk = tmp_path / "model.pt2"
    junk.write_bytes(b"this is not a torch.export program")

    with pytest.raises(JobError) as refused:
        export_pt2_to_onnx(junk, tmp_path / "out.onnx", {"input_shapes": CONTRACT})

    assert str(refused.value) == (
        "model.pt2 is not a PyTorch export program (.pt2 from torch.export.save): "
        "it is not a zip archive"
    )
    assert not (tmp_path / "out.onnx").exists()


def test_it_refuses_a_zip_that_is_not_a_pt2(tmp_path):
    archive = tmp_path / "model.pt2"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("readme.txt", "hello")

    with pytest.raises(JobError) as refused:
        export_pt2_to_onnx(archive, tmp_path / "out.onnx", {"input_shapes": CONTRACT})

    message = str(refused.value)
    assert message.startswith("model.pt2 is not a PyTorch export program")
    assert "\n" not in message and "Traceback" not in message


def test_it_refuses_params_without_fixed_input_shapes(pt2, tmp_path):
    with pytest.raises(JobError, match="params.input_shapes"):
        export_pt2_to_onnx(pt2, tmp_path / "out.onnx", {})
    with pytest.raises(JobError, match="list of positive integers"):
        export_pt2_to_onnx(pt2, tmp_path / "out.onnx", {"input_shapes": {"image": [-1, 3, 32]}})


def test_it_says_how_to_install_torch_when_the_worker_has_none(pt2, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError

    with pytest.raises(JobError, match=r"install deployhub\[torch\] to run export jobs"):
        export_pt2_to_onnx(pt2, tmp_path / "out.onnx", {"input_shapes": CONTRACT})


def test_it_imports_the_worker_without_importing_torch():
    code = (
        "import sys, workers.checks.export, workers.runner; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )

    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )

    assert completed.returncode == 0, completed.stderr
