"""The demo's preprocessing spec, and parity packs written the way a training script writes them.

The "training" tensors come from a pipeline written here, independently of
workers/checks/preprocessing.py.
"""

import io
import zipfile

import numpy as np
from PIL import Image

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
# The demo model's spec: bilinear to 32x32, RGB, ImageNet's mean and std.
SPEC = {
    "resize": {"height": 32, "width": 32, "interpolation": "bilinear"},
    "color_order": "RGB",
    "scale": 1 / 255,
    "mean": MEAN,
    "std": STD,
    "layout": "NCHW",
    "dtype": "float32",
}
FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def synthetic_images(count=3, size=(48, 40), seed=0):
    """Colourful images larger than the resize, so every filter gives other pixels."""
    rng = np.random.default_rng(seed)
    return {
        f"img{i}": Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
        for i in range(count)
    }


def training_pipeline(
    image,
    *,
    interpolation="bilinear",
    bgr=False,
    divide=True,
    normalise=True,
    nhwc=False,
    batch=False,
):
    """Turn an image into a tensor the way a training script would (float64, then float32)."""
    x = np.asarray(image.convert("RGB").resize((32, 32), FILTERS[interpolation]), np.float64)
    if bgr:
        x = x[:, :, ::-1]
    if divide:
        x = x / 255.0
    if normalise:
        x = (x - np.array(MEAN)) / np.array(STD)
    if not nhwc:
        x = x.transpose(2, 0, 1)
    x = x.astype(np.float32)
    return x[None] if batch else x


def pack_bytes(images, tensors, fmt="PNG", prefix="", extra=None):
    """Write a parity pack: the images and tensors.npz, keyed by image name."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, image in images.items():
            data = io.BytesIO()
            image.save(data, format=fmt)
            archive.writestr(f"{prefix}{name}.{fmt.lower()}", data.getvalue())
        npz = io.BytesIO()
        np.savez(npz, **tensors)
        archive.writestr(f"{prefix}tensors.npz", npz.getvalue())
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return buffer.getvalue()
