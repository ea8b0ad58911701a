"""The demo model, its validation set, and a runner on a real ONNX Runtime session."""

import onnxruntime

from tests.conftest import ASSETS

MODEL = ASSETS / "digits_cnn_v2.onnx"
VALIDATION = ASSETS / "validation.npz"


def session_runner(path):
    """Return a runner as the evaluate job takes it: feeds in, the session's outputs out."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)
