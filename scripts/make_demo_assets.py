"""Build the DeployHub demo assets: two small digit CNNs in ONNX plus their data.

Run from anywhere:

    python scripts/make_demo_assets.py [--out DIR]

DIR defaults to deployhub/demo/assets/ in the repository this script lives in.
Needs torch, scikit-learn, onnx, onnxruntime, pillow and numpy; no network is
used at run time (the digits data set ships inside scikit-learn). Every seed is
fixed and torch runs on one thread, so re-running with the same package versions
gives byte-identical files. It takes about 15 seconds on two CPU cores.

Writes digits_cnn_v1.onnx, digits_cnn_v2.onnx, validation.npz, calibration.npz,
samples/ (8 raw PNGs and the tensors fed to the model for them) and
manifest.json.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn

SEED = 20240601
IMAGE_SIZE = 32
NUM_CLASSES = 10
NUM_VALIDATION = 300
NUM_CALIBRATION = 100
NUM_SAMPLES = 8
NOISE_STD = 6.0
OPSET = 17
MAX_ABS_DIFF = 1e-4
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "deployhub" / "demo" / "assets"

PREPROCESSING = {
    "resize": {"height": IMAGE_SIZE, "width": IMAGE_SIZE, "interpolation": "bilinear"},
    "color_order": "RGB",
    "scale": 1.0 / 255.0,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "layout": "NCHW",
    "dtype": "float32",
}

# Warm foregrounds on cool backgrounds: the channels differ strongly, so an
# RGB<->BGR mix-up turns the images into cool-on-warm ones the model never saw.
FOREGROUNDS = [(250, 200, 40), (240, 90, 30), (255, 150, 110), (220, 60, 90)]
BACKGROUNDS = [(20, 40, 110), (10, 90, 120), (40, 30, 80), (30, 60, 160)]

VERSIONS = {
    1: {
        "widths": (8, 16, 32),
        "epochs": 4,
        "notes": "Narrow baseline: 8/16/32 channels, 4 epochs.",
    },
    2: {"widths": (16, 32, 64), "epochs": 12, "notes": "Full width: 16/32/64 channels, 12 epochs."},
}


def parse_args() -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"output folder (default: {DEFAULT_OUT.relative_to(REPO_ROOT)})",
    )
    return parser.parse_args()


def render_digits(digits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Render 8x8 digit intensities as coloured 32x32 uint8 RGB images."""
    images = np.empty((len(digits), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    fg_idx = rng.integers(len(FOREGROUNDS), size=len(digits))
    bg_idx = rng.integers(len(BACKGROUNDS), size=len(digits))
    noise = rng.normal(0.0, NOISE_STD, size=images.shape)
    for i, digit in enumerate(digits):
        alpha = upscale(digit / 16.0)[..., None]
        fg = np.array(FOREGROUNDS[fg_idx[i]], dtype=np.float64)
        bg = np.array(BACKGROUNDS[bg_idx[i]], dtype=np.float64)
        pixels = bg * (1.0 - alpha) + fg * alpha + noise[i]
        images[i] = np.clip(np.rint(pixels), 0, 255).astype(np.uint8)
    return images


def upscale(intensity: np.ndarray) -> np.ndarray:
    """Upscale one 8x8 intensity map to 32x32 with bilinear filtering."""
    image = Image.fromarray(intensity.astype(np.float32), mode="F")
    resized = image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)
    return np.clip(np.asarray(resized, dtype=np.float64), 0.0, 1.0)


def preprocess(images: np.ndarray, spec: dict = PREPROCESSING) -> np.ndarray:
    """Turn uint8 NHWC RGB images into the float32 NCHW tensors the model expects."""
    assert images.shape[1:] == (spec["resize"]["height"], spec["resize"]["width"], 3)
    mean = np.asarray(spec["mean"], dtype=np.float32)
    std = np.asarray(spec["std"], dtype=np.float32)
    scaled = images.astype(np.float32) * np.float32(spec["scale"])
    normalized = (scaled - mean) / std
    return np.ascontiguousarray(normalized.transpose(0, 3, 1, 2), dtype=np.float32)


def split_indices(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split sample indices into training and held-out validation sets."""
    order = rng.permutation(count)
    return np.sort(order[NUM_VALIDATION:]), np.sort(order[:NUM_VALIDATION])


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    """Build one Conv2d+BatchNorm2d+ReLU block followed by 2x2 max pooling."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class DigitsCNN(nn.Module):
    """Three conv blocks, global average pooling and a linear classifier."""

    def __init__(self, widths: tuple[int, int, int]):
        super().__init__()
        channels = (3, *widths)
        self.features = nn.Sequential(
            *(conv_block(channels[i], channels[i + 1]) for i in range(len(widths)))
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(widths[-1], NUM_CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Map a normalized NCHW batch to class logits."""
        return self.classifier(torch.flatten(self.pool(self.features(image)), 1))


def train_model(widths, epochs, inputs, labels) -> nn.Module:
    """Train one DigitsCNN with Adam and a one-cycle schedule, return it in eval mode."""
    torch.manual_seed(SEED)
    model = DigitsCNN(widths)
    x, y = torch.from_numpy(inputs), torch.from_numpy(labels)
    batch_size = 64
    steps = epochs * ((len(x) + batch_size - 1) // batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=steps)
    generator = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()


def torch_logits(model: nn.Module, inputs: np.ndarray) -> np.ndarray:
    """Run the torch model on a float32 NCHW batch."""
    with torch.no_grad():
        return model(torch.from_numpy(inputs)).numpy()


def export_keeping_batchnorm(model: nn.Module, path: Path, image_size: int, opset: int) -> None:
    """Export NCHW RGB -> logits with a symbolic batch dim, BatchNormalization nodes kept."""
    example = torch.zeros(2, 3, image_size, image_size)
    # The legacy TorchScript exporter (dynamo=False, deprecated but still in
    # torch 2.13) is used on purpose: the dynamo exporter (needs onnxscript)
    # folds BatchNorm into Conv and cannot emit opset 17 for this graph.
    # Constant folding off skips the legacy Conv+BN fusion, so inference-mode
    # BatchNormalization nodes stay in the graph for the compiler to fuse.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (example,),
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "N"}, "logits": {0: "N"}},
            training=torch.onnx.TrainingMode.EVAL,
            do_constant_folding=False,
            external_data=False,
        )


def export_onnx(model: nn.Module, path: Path, version: int) -> None:
    """Export the model to a self-contained ONNX file with a symbolic batch dim."""
    export_keeping_batchnorm(model, path, IMAGE_SIZE, OPSET)
    proto = onnx.load(str(path))
    proto.doc_string = f"digits-cnn v{version}: 32x32 RGB digits -> 10 logits"
    onnx.helper.set_model_props(proto, {"name": "digits-cnn", "version": str(version)})
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))


def onnx_logits(path: Path, inputs: np.ndarray) -> np.ndarray:
    """Run the ONNX file with onnxruntime on a float32 NCHW batch."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"image": inputs})[0]


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Return the top-1 accuracy of logits against labels."""
    return float((logits.argmax(axis=1) == labels).mean())


def op_counts(path: Path) -> dict[str, int]:
    """Count the ONNX graph's nodes by op type."""
    return dict(collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node))


def save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write a compressed .npz with fixed zip timestamps so reruns are byte-identical."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, buffer.getvalue())


def pick_samples(labels: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """Pick, for labels 0..NUM_SAMPLES-1, the first validation sample predicted right."""
    return np.array(
        [
            int(np.flatnonzero((labels == label) & (predictions == label))[0])
            for label in range(NUM_SAMPLES)
        ]
    )


def write_samples(out: Path, images: np.ndarray, inputs: np.ndarray, labels: np.ndarray) -> None:
    """Write the sample PNGs and the tensors the model was fed for them."""
    folder = out / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("digit_*.png"):
        stale.unlink()
    names = [f"digit_{i}_{int(label)}.png" for i, label in enumerate(labels)]
    for name, image in zip(names, images, strict=True):
        Image.fromarray(image, mode="RGB").save(folder / name)
    save_npz(
        folder / "tensors.npz",
        inputs=inputs,
        names=np.array(names, dtype=str),
        labels=labels.astype(np.int64),
    )


def build_manifest(results: dict[int, dict]) -> dict:
    """Assemble manifest.json's content from the per-version results."""
    return {
        "model": {
            "name": "digits-cnn",
            "description": (
                "Small CNN (Conv+BatchNorm+ReLU blocks) classifying 32x32 "
                "RGB renderings of scikit-learn's 8x8 handwritten digits "
                "into 10 classes."
            ),
        },
        "preprocessing": PREPROCESSING,
        "versions": [
            {
                "file": f"digits_cnn_v{v}.onnx",
                "version": v,
                "notes": VERSIONS[v]["notes"],
                "val_accuracy": round(r["val_accuracy"], 4),
                "parameters": r["parameters"],
            }
            for v, r in sorted(results.items())
        ],
        "datasets": {"validation": "validation.npz", "calibration": "calibration.npz"},
        "samples": "samples/",
    }


def build_version(version: int, out: Path, data: dict) -> dict:
    """Train, export and verify one model version, returning its figures."""
    config = VERSIONS[version]
    model = train_model(config["widths"], config["epochs"], data["train_x"], data["train_y"])
    path = out / f"digits_cnn_v{version}.onnx"
    export_onnx(model, path, version)
    expected = torch_logits(model, data["val_x"])
    actual = onnx_logits(path, data["val_x"])
    diff = float(np.abs(expected - actual).max())
    assert diff < MAX_ABS_DIFF, f"v{version}: ONNX differs from torch by {diff}"
    result = {
        "val_accuracy": accuracy(actual, data["val_y"]),
        "torch_accuracy": accuracy(expected, data["val_y"]),
        "parameters": sum(p.numel() for p in model.parameters()),
        "max_abs_diff": diff,
        "ops": op_counts(path),
        "predictions": actual.argmax(axis=1),
    }
    swapped = onnx_logits(path, data["val_x_bgr"])
    result["bgr_accuracy"] = accuracy(swapped, data["val_y"])
    result["bgr_mean_abs_logit_change"] = float(np.abs(swapped - actual).mean())
    return result


def prepare_data(rng: np.random.Generator) -> dict:
    """Render the digits, split them and preprocess every split."""
    digits = load_digits()
    images = render_digits(digits.images, rng)
    labels = digits.target.astype(np.int64)
    train_idx, val_idx = split_indices(len(images), rng)
    calib_idx = np.sort(rng.choice(train_idx, size=NUM_CALIBRATION, replace=False))
    return {
        "train_x": preprocess(images[train_idx]),
        "train_y": labels[train_idx],
        "val_images": images[val_idx],
        "val_x": preprocess(images[val_idx]),
        "val_y": labels[val_idx],
        "val_x_bgr": preprocess(images[val_idx][..., ::-1]),
        "calib_x": preprocess(images[calib_idx]),
    }


def report(version: int, result: dict) -> None:
    """Print one version's figures."""
    print(
        f"v{version}: val_accuracy={result['val_accuracy']:.4f} "
        f"(torch {result['torch_accuracy']:.4f}) parameters={result['parameters']} "
        f"max_abs_diff(onnx vs torch)={result['max_abs_diff']:.3g}"
    )
    print(
        f"v{version}: fed BGR instead of RGB -> accuracy={result['bgr_accuracy']:.4f}, "
        f"mean |logit change|={result['bgr_mean_abs_logit_change']:.3f}"
    )
    print(f"v{version}: ops {result['ops']}")


def main() -> None:
    """Build every demo asset into the output folder."""
    args = parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(SEED)
    data = prepare_data(rng)
    print(
        f"train={len(data['train_x'])} validation={len(data['val_x'])} "
        f"calibration={len(data['calib_x'])}"
    )
    results = {}
    for version in sorted(VERSIONS):
        results[version] = build_version(version, out, data)
        report(version, results[version])
    save_npz(out / "validation.npz", inputs=data["val_x"], labels=data["val_y"])
    save_npz(out / "calibration.npz", inputs=data["calib_x"])
    picks = pick_samples(data["val_y"], results[max(results)]["predictions"])
    write_samples(out, data["val_images"][picks], data["val_x"][picks], data["val_y"][picks])
    manifest = build_manifest(results)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote assets to {out}")


if __name__ == "__main__":
    main()
