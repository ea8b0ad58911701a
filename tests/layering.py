"""The hub's layers as pyproject.toml's import-linter contract lists them, lowest first."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layers():
    """Return the hub's apps by layer, lowest first, as the layer contract lists them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    split = [layer.replace("|", ":").split(":") for layer in reversed(contract["layers"])]
    return [[name.strip() for name in layer] for layer in split]
