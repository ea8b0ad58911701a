"""make bench-gpu: the ResNet-50 it measures, and what it says on a machine without a GPU."""

import json

import pytest
import torch
from torch import nn

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


def test_it_ranks_the_candidates_that_run_and_reports_the_one_that_crashes(monkeypatch):
    """The orchestration, on the CPU with a small network: what the GPU run does around it."""
    monkeypatch.setattr(gpu, "ROUNDS", 2)
    monkeypatch.setattr(gpu, "ROUND_SECONDS", 0.05)
    monkeypatch.setattr(gpu, "WARMUP_SECONDS", 0.05)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10)).eval()  # fmt: skip
    channels_last = model.to(memory_format=torch.channels_last)

    def crashes(x):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    candidates = [
        gpu.Candidate("eager fp32", lambda batch: model),
        gpu.Candidate("channels-last", lambda batch: channels_last),
        gpu.Candidate("broken build", lambda batch: crashes),
    ]
    images = gpu.random_images(8, 1, size=16)

    measured = gpu.measure(candidates, 1, images, device="cpu")

    names = [r["name"] for r in measured]
    assert "resnet50 b1 eager fp32" in names and "resnet50 b1 channels-last" in names
    assert "resnet50 b1 best (channels-last) vs eager fp32" in names
    [agreement] = [r for r in measured if r["name"].endswith("top-1 agreement")]
    assert agreement["figure"] == 1.0 and agreement["verdict"] == "PASS"
    [failed] = gpu.failure_rows(candidates)
    assert failed["verdict"] == "FAILED" and "illegal memory access" in failed["reason"]
