"""make bench-gpu: the ResNet-50 it measures, and what it says on a machine without a GPU."""

import json

import pytest
import torch

from bench import gpu, rows


def test_its_model_has_resnet50s_shape():
    model = gpu.resnet50()

    parameters = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        logits = model(gpu.random_images(2, 0))

    assert parameters == 25_557_032  # torchvision's resnet50
    assert logits.shape == (2, 1000) and torch.isfinite(logits).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the bench runs")
def test_without_a_gpu_it_says_nothing_was_measured(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rows, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(rows, "ROOT", tmp_path)

    gpu.main()

    written = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["bench"], r["verdict"]) for r in written] == [("bench_gpu", "NOT RUN")]
    assert "torch sees no CUDA GPU" in capsys.readouterr().out
