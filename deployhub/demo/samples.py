"""Sample models a team can add in one click, made on the spot from code in the repository."""

import tempfile
from pathlib import Path

import numpy as np
from django.core.files import File
from django.db import transaction

from deployhub.demo import resnet18
from deployhub.registry.contract import batch_range_contract
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_dataset, create_version

RESNET18_NAME = "resnet18-random"
RESNET18_DESCRIPTION = (
    "ResNet-18-shaped image classifier (224x224 RGB in, 1000 logits out) with RANDOM WEIGHTS, "
    "made by deployhub/demo/resnet18.py: for latency, not for real images. Its head recognises "
    "10 random 'prototype' images; its datasets are noisy copies of them, labelled, so top-1 "
    "accuracy and agreement show what a precision costs, as they would for a trained model."
)
# ImageNet's usual spec; it only matters for parity checks, the weights being random.
RESNET18_PREPROCESSING = {
    "resize": {"height": 224, "width": 224, "interpolation": "bilinear"},
    "color_order": "RGB",
    "scale": 1 / 255,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "layout": "NCHW",
    "dtype": "float32",
}


class SampleExists(ValueError):
    """The team has the sample already."""


def add_resnet18(team, user):
    """Add the ResNet-18-shaped model with its labelled samples (calibration, validation)."""
    if team.models.filter(name=RESNET18_NAME).exists():
        raise SampleExists(f"{team} has the {RESNET18_NAME} sample already.")
    with tempfile.TemporaryDirectory(prefix="deployhub-sample-") as folder:
        onnx_path = resnet18.write_resnet18_onnx(Path(folder) / "resnet18.onnx")
        inputs = Path(folder) / "prototype-samples.npz"
        images, labels = resnet18.labelled_samples()
        np.savez(inputs, inputs=images, labels=labels)
        with transaction.atomic():
            model = Model.objects.create(
                team=team, name=RESNET18_NAME, description=RESNET18_DESCRIPTION, created_by=user
            )
            with open(onnx_path, "rb") as handle:
                version = create_version(
                    model,
                    File(handle, name="resnet18.onnx"),
                    user,
                    notes=resnet18.NOTES,
                    preprocessing=RESNET18_PREPROCESSING,
                    contract=batch_range_contract("image", (3, 224, 224)),
                )
            for kind in ("calibration", "validation"):
                with open(inputs, "rb") as handle:
                    create_dataset(
                        version, File(handle, name=inputs.name), user, kind=kind, name=kind
                    )
    return model
