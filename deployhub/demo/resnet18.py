"""A ResNet-18-shaped ONNX model with random weights, written with onnx and numpy alone.

The network is ResNet-18 as torchvision defines it (BasicBlock, [2, 2, 2, 2],
64..512 channels, 224x224 RGB in, 1000 logits out). Its convolutions are
random, from a fixed seed: the model is for latency, not for images. So that
activations keep a sane scale through the 18 layers, as in a trained network,
each BatchNorm's statistics are those of its input on one batch of random
images, computed by a plain numpy forward pass.

A classifier on random features gives near-tied logits (the top two classes
of random images differ by a fraction of the logits' spread), so any rounding
flips its top-1 and no precision could ever look "within tolerance". A trained
network is decisive instead. To behave like one, the head recognises
PROTOTYPES random images: class c's row is the direction of prototype c's
features, the other outputs get small random rows, and labelled_samples()
makes noisy copies of the prototypes, labelled with their class. On those the
FP32 model is right and decisive, so top-1 accuracy, agreement and the
accuracy tolerance mean what they mean for a trained model.

No torch is needed, so the hub of `make run` can add the model (Models →
"Add the ResNet-18 sample"); `scripts/make_resnet18.py` loads the same weights
into PyTorch for the eager baseline of `make bench`.

The weights are keyed by PyTorch's state-dict names, so that loading them into
the equivalent torch module is one load_state_dict.
"""

from pathlib import Path

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

SEED = 20240618
IMAGE_SIZE = 224
NUM_CLASSES = 1000
OPSET = 17
STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, stride of the first block)
STATS_BATCH = 4
PROTOTYPES = 10  # classes the head recognises; the other 990 outputs never win
SAMPLES_PER_CLASS = 10
SAMPLE_NOISE = 0.3  # std of the noise added to a prototype (the images' std is 1)
HEAD_SCALE = 10.0  # a prototype's own logit, over the others' (about 0)
BN_EPSILON = 1e-5
NOTES = "ResNet-18 shape with random weights: for latency only, its predictions mean nothing."


def random_images(count, seed):
    """Return count random-normal float32 NCHW images."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((count, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)


def blocks():
    """Yield (state-dict prefix, in channels, channels, stride) for the eight BasicBlocks."""
    in_channels = 64
    for stage, (channels, stride) in enumerate(STAGES, start=1):
        for index in range(2):
            yield f"layer{stage}.{index}", in_channels, channels, stride if index == 0 else 1
            in_channels = channels


def random_weights(seed=SEED):
    """Return the seeded convolution and classifier weights, BatchNorms still without stats."""
    rng = np.random.default_rng(seed)
    weights = {}

    def conv_bn(conv, bn, out_channels, in_channels, kernel):
        # Kaiming normal, fan-out, for ReLU: as torchvision initialises ResNets.
        std = np.sqrt(2.0 / (out_channels * kernel * kernel))
        shape = (out_channels, in_channels, kernel, kernel)
        weights[f"{conv}.weight"] = (rng.standard_normal(shape) * std).astype(np.float32)
        weights[f"{bn}.weight"] = np.ones(out_channels, np.float32)
        weights[f"{bn}.bias"] = np.zeros(out_channels, np.float32)

    conv_bn("conv1", "bn1", 64, 3, 7)
    for prefix, in_channels, channels, stride in blocks():
        conv_bn(f"{prefix}.conv1", f"{prefix}.bn1", channels, in_channels, 3)
        conv_bn(f"{prefix}.conv2", f"{prefix}.bn2", channels, channels, 3)
        if stride != 1 or in_channels != channels:
            conv_bn(f"{prefix}.downsample.0", f"{prefix}.downsample.1", channels, in_channels, 1)
    bound = 1.0 / np.sqrt(512)  # torch.nn.Linear's default initialisation
    weights["fc.weight"] = rng.uniform(-bound, bound, (NUM_CLASSES, 512)).astype(np.float32)
    weights["fc.bias"] = rng.uniform(-bound, bound, NUM_CLASSES).astype(np.float32)
    return weights


def with_batchnorm_statistics(weights, images):
    """Run images through the network, setting each BatchNorm's statistics from its input."""
    forward = _Forward(weights, collect_statistics=True)
    forward(images)
    return forward.weights


def prototypes(seed=SEED):
    """Return the images the head recognises, one per class."""
    return random_images(PROTOTYPES, seed + 3)


def labelled_samples(seed=SEED, per_class=SAMPLES_PER_CLASS):
    """Return (images, labels): noisy copies of each prototype, labelled with its class."""
    rng = np.random.default_rng(seed + 4)
    labels = np.repeat(np.arange(PROTOTYPES), per_class)
    noise = rng.standard_normal((len(labels), 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    return (prototypes(seed)[labels] + SAMPLE_NOISE * noise).astype(np.float32), labels


def with_prototype_head(weights, images, seed=SEED):
    """Return the weights with a head whose class c points at images[c]'s features."""
    features = _Forward(weights).features(images)
    centre = features.mean(axis=0)
    directions = features - centre
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    rng = np.random.default_rng(seed + 5)
    head = rng.uniform(-0.01, 0.01, (NUM_CLASSES, features.shape[1])).astype(np.float32)
    head[: len(images)] = directions
    head *= HEAD_SCALE / np.median(np.abs(directions @ (features - centre).T))
    return {**weights, "fc.weight": head, "fc.bias": (-(head @ centre)).astype(np.float32)}


def resnet18_weights(seed=SEED):
    """Return the complete weights: random convolutions, BatchNorm statistics, prototype head."""
    weights = with_batchnorm_statistics(random_weights(seed), random_images(STATS_BATCH, seed + 1))
    return with_prototype_head(weights, prototypes(seed), seed)


def build_onnx(weights):
    """Return the ResNet-18 ONNX model (opset 17, symbolic batch, BatchNormalization kept)."""
    graph = _Graph(weights)
    x = graph.conv_bn("image", "conv1", "bn1", stride=2, pad=3, relu=True)
    x = graph.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for prefix, in_channels, channels, stride in blocks():
        x = graph.basic_block(x, prefix, stride, downsample=stride != 1 or in_channels != channels)
    x = graph.node("GlobalAveragePool", [x])
    x = graph.node("Flatten", [x], axis=1)
    graph.node("Gemm", [x, "fc.weight", "fc.bias"], "logits", transB=1)
    return graph.model()


def write_resnet18_onnx(path, weights=None):
    """Write the model (about 45 MB) to path and return the path; weights default to the seed's."""
    path = Path(path)
    model = build_onnx(weights or resnet18_weights())
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


class _Graph:
    """Collects ONNX nodes and the initializers they use."""

    def __init__(self, weights):
        self.weights, self.nodes, self.used = weights, [], []

    def node(self, op, inputs, output=None, **attributes):
        output = output or f"{op.lower()}_{len(self.nodes)}"
        for name in inputs:
            if name in self.weights and name not in self.used:
                self.used.append(name)
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attributes))
        return output

    def conv_bn(self, x, conv, bn, stride, pad, relu):
        kernel = self.weights[f"{conv}.weight"].shape[2]
        x = self.node(
            "Conv",
            [x, f"{conv}.weight"],
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
        )
        stats = [f"{bn}.{name}" for name in ("weight", "bias", "running_mean", "running_var")]
        x = self.node("BatchNormalization", [x, *stats], epsilon=BN_EPSILON)
        return self.node("Relu", [x]) if relu else x

    def basic_block(self, x, prefix, stride, downsample):
        identity = x
        if downsample:
            identity = self.conv_bn(
                x, f"{prefix}.downsample.0", f"{prefix}.downsample.1", stride, 0, relu=False
            )
        out = self.conv_bn(x, f"{prefix}.conv1", f"{prefix}.bn1", stride, 1, relu=True)
        out = self.conv_bn(out, f"{prefix}.conv2", f"{prefix}.bn2", 1, 1, relu=False)
        return self.node("Relu", [self.node("Add", [out, identity])])

    def model(self):
        image = helper.make_tensor_value_info(
            "image", TensorProto.FLOAT, ["N", 3, IMAGE_SIZE, IMAGE_SIZE]
        )
        logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NUM_CLASSES])
        initializers = [numpy_helper.from_array(self.weights[name], name) for name in self.used]
        graph = helper.make_graph(self.nodes, "resnet18", [image], [logits], initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="deployhub"
        )
        model.ir_version = 8
        model.doc_string = f"resnet18 (random weights): 224x224 RGB -> 1000 logits. {NOTES}"
        return model


class _Forward:
    """A numpy forward pass of the network, in float32, optionally setting BatchNorm stats."""

    def __init__(self, weights, collect_statistics=False):
        self.weights, self.collect = dict(weights), collect_statistics

    def __call__(self, images):
        return self.features(images) @ self.weights["fc.weight"].T + self.weights["fc.bias"]

    def features(self, images):
        """Return the pooled 512 features the classifier reads."""
        x = self.conv_bn(images, "conv1", "bn1", stride=2, pad=3, relu=True)
        x = _max_pool(x)
        for prefix, in_channels, channels, stride in blocks():
            identity = x
            if stride != 1 or in_channels != channels:
                identity = self.conv_bn(
                    x, f"{prefix}.downsample.0", f"{prefix}.downsample.1", stride, 0, relu=False
                )
            out = self.conv_bn(x, f"{prefix}.conv1", f"{prefix}.bn1", stride, 1, relu=True)
            out = self.conv_bn(out, f"{prefix}.conv2", f"{prefix}.bn2", 1, 1, relu=False)
            x = np.maximum(out + identity, 0)
        return x.mean(axis=(2, 3))

    def conv_bn(self, x, conv, bn, stride, pad, relu):
        x = _conv2d(x, self.weights[f"{conv}.weight"], stride, pad)
        if self.collect:
            self.weights[f"{bn}.running_mean"] = x.mean(axis=(0, 2, 3)).astype(np.float32)
            self.weights[f"{bn}.running_var"] = x.var(axis=(0, 2, 3), ddof=1).astype(np.float32)
        shape = (1, -1, 1, 1)
        mean = self.weights[f"{bn}.running_mean"].reshape(shape)
        scale = self.weights[f"{bn}.weight"].reshape(shape) / np.sqrt(
            self.weights[f"{bn}.running_var"].reshape(shape) + BN_EPSILON
        )
        x = (x - mean) * scale + self.weights[f"{bn}.bias"].reshape(shape)
        return np.maximum(x, 0) if relu else x


def _conv2d(x, weight, stride, pad):
    """Convolve NCHW x with OIHW weight (no bias, no groups)."""
    kernel = weight.shape[2]
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = sliding_window_view(x, (kernel, kernel), axis=(2, 3))[:, :, ::stride, ::stride]
    out = np.tensordot(windows, weight, axes=([1, 4, 5], [1, 2, 3]))  # N, H, W, O
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


def _max_pool(x, kernel=3, stride=2, pad=1):
    """Max-pool NCHW x, padding with -inf as ONNX MaxPool does."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    windows = sliding_window_view(x, (kernel, kernel), axis=(2, 3))[:, :, ::stride, ::stride]
    return windows.max(axis=(4, 5))
