"""Write a ResNet-18-shaped model in ONNX and random inputs to calibrate and evaluate it.

Run from anywhere:

    python scripts/make_resnet18.py [--out DIR]

DIR defaults to a new temporary folder. The bench (`bench/run.py bench_auto_mode`)
imports write_resnet18() and generates the files at run time instead of keeping
the ~45 MB ONNX file in the repository.

The ONNX model is written by deployhub/demo/resnet18.py with onnx and numpy
alone (the hub's "Add the ResNet-18 sample" uses the same code): ResNet-18 as
torchvision defines it, random weights from a fixed seed, BatchNorm statistics
from one batch of random images, BatchNormalization nodes kept. This script
also loads those weights into the same network written in plain torch
(torchvision does not work with this torch), the PyTorch eager baseline the
bench compares against; `--check` runs both on the same images.

Writes resnet18.onnx (input `image` [N, 3, 224, 224], output `logits`
[N, 1000], opset 17) and resnet18_inputs.npz (`inputs`: noisy copies of the
images the head recognises, `labels`: their classes; see deployhub/demo/resnet18.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for deployhub
from deployhub.demo import resnet18 as pure  # noqa: E402

SEED = pure.SEED
IMAGE_SIZE = pure.IMAGE_SIZE
NUM_CLASSES = pure.NUM_CLASSES
NOTES = pure.NOTES


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
    return pure.random_images(count, seed)


def eager_model(weights: dict) -> nn.Module:
    """Return the torch ResNet-18 holding these weights, in eval mode."""
    model = ResNet18()
    state = {name: torch.from_numpy(array) for name, array in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not name.endswith("num_batches_tracked") for name in missing):
        raise RuntimeError(f"weights do not fit the network: {missing=} {unexpected=}")
    return model.eval()


def write_resnet18(folder) -> tuple[Path, Path, nn.Module]:
    """Write resnet18.onnx and resnet18_inputs.npz into folder; return both paths and the model."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = pure.resnet18_weights(SEED)
    onnx_path, npz_path = folder / "resnet18.onnx", folder / "resnet18_inputs.npz"
    pure.write_resnet18_onnx(onnx_path, weights)
    images, labels = pure.labelled_samples(SEED)
    np.savez(npz_path, inputs=images, labels=labels)
    return onnx_path, npz_path, eager_model(weights)


def max_difference(onnx_path: Path, model: nn.Module, images: np.ndarray) -> float:
    """Return the largest |ONNX Runtime - PyTorch eager| logit on the images."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ours = session.run(None, {"image": images})[0]
    with torch.no_grad():
        eager = model(torch.from_numpy(images)).numpy()
    return float(np.abs(ours - eager).max())


def main() -> None:
    """Write the model and its inputs, and print where they are."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output folder (default: a new temporary one)")
    parser.add_argument("--check", action="store_true", help="compare ONNX and eager outputs")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="resnet18-"))
    onnx_path, npz_path, model = write_resnet18(out)
    print(onnx_path)
    print(npz_path)
    if args.check:
        images = random_images(4, SEED + 3)
        print(f"max |ONNX Runtime - eager| logit: {max_difference(onnx_path, model, images):.2e}")


if __name__ == "__main__":
    main()
