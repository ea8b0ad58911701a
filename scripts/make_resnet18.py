"""Write a ResNet-18-shaped model in ONNX and random inputs to calibrate and evaluate it.

Run from anywhere:

    python scripts/make_resnet18.py [--out DIR]

DIR defaults to a new temporary folder. The bench (`bench/run.py bench_auto_mode`)
imports write_resnet18() and generates the files at run time instead of keeping
the ~45 MB ONNX file in the repository.

The network is ResNet-18 as torchvision defines it (BasicBlock, [2, 2, 2, 2],
64..512 channels, 224x224 RGB in, 1000 logits out), written here in plain torch
because torchvision does not work with this torch. Its weights are random, from
a fixed seed: the model is for latency only, its logits mean nothing. So that
activations keep a sane scale through the 18 layers, as in a trained network,
the BatchNorm running statistics are taken from one batch of random inputs;
the model is then exported in eval mode, BatchNormalization nodes kept.

Writes resnet18.onnx (input `image` [N, 3, 224, 224], output `logits`
[N, 1000], opset 17) and resnet18_inputs.npz (`inputs`: random-normal float32
images, no labels).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

SEED = 20240618
IMAGE_SIZE = 224
NUM_CLASSES = 1000
OPSET = 17
# 100 samples: at the 99% agreement threshold one disagreement is allowed, none with 64.
NUM_INPUTS = 100
STATS_BATCH = 16
NOTES = "ResNet-18 shape with random weights: for latency only, its predictions mean nothing."


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual connection."""

    def __init__(self, in_channels: int, channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Add the block's two convolutions to its (downsampled) input."""
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18(nn.Module):
    """ResNet-18: a 7x7 stem, four stages of two BasicBlocks, pooling and a classifier."""

    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, padding=1)
        self.layer1 = self._stage(64, 64, 1)
        self.layer2 = self._stage(64, 128, 2)
        self.layer3 = self._stage(128, 256, 2)
        self.layer4 = self._stage(256, 512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    @staticmethod
    def _stage(in_channels: int, channels: int, stride: int) -> nn.Sequential:
        return nn.Sequential(
            BasicBlock(in_channels, channels, stride), BasicBlock(channels, channels, 1)
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Map a normalized NCHW batch to class logits."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(image))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def random_images(count: int, seed: int) -> np.ndarray:
    """Return count random-normal float32 NCHW images."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((count, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)


def build_model() -> nn.Module:
    """Return ResNet-18 with seeded random weights and BatchNorm statistics, in eval mode."""
    torch.manual_seed(SEED)
    model = ResNet18()
    batch_norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in batch_norms:
        bn.momentum = None  # a cumulative average: one batch gives its own statistics
    model.train()
    with torch.no_grad():
        model(torch.from_numpy(random_images(STATS_BATCH, SEED + 1)))
    for bn in batch_norms:
        bn.momentum = 0.1
    return model.eval()


def export_onnx(model: nn.Module, path: Path) -> None:
    """Export to ONNX opset 17 with a symbolic batch, BatchNormalization nodes kept."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # when loaded by bench/run.py
    from make_demo_assets import export_keeping_batchnorm

    export_keeping_batchnorm(model, path, IMAGE_SIZE, OPSET)
    proto = onnx.load(str(path))
    proto.doc_string = f"resnet18 (random weights): 224x224 RGB -> 1000 logits. {NOTES}"
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))


def write_resnet18(folder) -> tuple[Path, Path, nn.Module]:
    """Write resnet18.onnx and resnet18_inputs.npz into folder; return both paths and the model."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = build_model()
    onnx_path, npz_path = folder / "resnet18.onnx", folder / "resnet18_inputs.npz"
    export_onnx(model, onnx_path)
    np.savez(npz_path, inputs=random_images(NUM_INPUTS, SEED + 2))
    return onnx_path, npz_path, model


def main() -> None:
    """Write the model and its inputs, and print where they are."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output folder (default: a new temporary one)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="resnet18-"))
    onnx_path, npz_path, _ = write_resnet18(out)
    print(onnx_path)
    print(npz_path)


if __name__ == "__main__":
    main()
