"""The TensorRT backend: every decision that needs no GPU, and what compile does without one.

The real builder only runs where TensorRT and a GPU are: there,
`deployhub-worker selftest --backend tensorrt` proves it. Here the pure
decisions (tensorrt_plan) are tested in tables, compile is shown to refuse
with the extra to install, and one test runs compile() against
FakeTensorRTForCallOrderTest, a stand-in module that records calls: it checks
the order and arguments of our calls, never that TensorRT accepts them.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from workers.backends import tensorrt as trt_backend
from workers.backends import tensorrt_plan as plan
from workers.backends.base import compat_key
from workers.backends.known import MissingRuntime
from workers.backends.tensorrt import TensorRTBackend
from workers.errors import JobError
from workers.selftest import TINY_CONTRACT, write_tiny_model

TRT_INSTALLED = TensorRTBackend.available()
KEY = "tensorrt:" + "ab" * 32

# check_config


@pytest.mark.parametrize(
    "config",
    [
        None,
        {},
        {"precision": "fp32"},
        {"precision": "bf16", "workspace_mb": 512, "optimization_level": 5},
        {"precision": "int8", "int8_mode": "qdq", "optimization_level": 0},
        {"precision": "int8", "calibration_samples": 64},
        {"hardware_compatibility": "ampere_plus", "version_compatible": True},
        {"hardware_compatibility": "same_compute_capability"},
        {"contract": TINY_CONTRACT},
    ],
)
def test_it_accepts_the_configs_it_can_build(config):
    plan.check_config(config)
    TensorRTBackend.check_config(config)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"precision": "fp8"}, "precision 'fp8' is not one of"),
        ({"precison": "fp16"}, r"unknown keys \['precison'\]"),
        ({"precision": "int8", "int8_mode": "ptq"}, "int8_mode 'ptq'"),
        ({"precision": "fp16", "int8_mode": "qdq"}, "int8_mode applies to precision int8 only"),
        ({"workspace_mb": 0}, "workspace_mb must be a whole number of at least 1"),
        ({"workspace_mb": "4GB"}, "workspace_mb must be a whole number"),
        ({"optimization_level": 6}, "optimization_level 6 is not 0 to 5"),
        ({"optimization_level": True}, "optimization_level must be a whole number"),
        ({"hardware_compatibility": "turing_plus"}, "hardware_compatibility 'turing_plus'"),
        ({"version_compatible": "yes"}, "version_compatible must be true or false"),
        ({"precision": "int8", "calibration_samples": 0}, "calibration_samples must be"),
        ({"contract": ["x"]}, "contract in a tensorrt build config must be a JSON object"),
    ],
)
def test_it_refuses_configs_it_cannot_build(config, message):
    with pytest.raises(JobError, match=message):
        TensorRTBackend.check_config(config)


def test_it_fills_the_defaults_of_a_config():
    assert plan.resolved({}) == {
        "precision": "fp16",
        "int8_mode": "calibration",
        "workspace_mb": 4096,
        "optimization_level": 3,
        "hardware_compatibility": "none",
        "version_compatible": False,
        "calibration_samples": 512,
    }
    assert plan.resolved({"precision": None})["precision"] == "fp16"
    assert plan.workspace_bytes({"workspace_mb": 512}) == 512 * 2**20


# builder flags, cleared flags, hardware level


@pytest.mark.parametrize(
    ("config", "flags", "cleared"),
    [
        ({}, ["FP16"], []),
        ({"precision": "fp32"}, [], ["TF32"]),
        ({"precision": "fp16"}, ["FP16"], []),
        ({"precision": "bf16"}, ["BF16"], []),
        ({"precision": "int8"}, ["INT8", "FP16"], []),
        ({"precision": "int8", "int8_mode": "qdq"}, ["INT8", "FP16"], []),
        ({"version_compatible": True}, ["FP16", "VERSION_COMPATIBLE"], []),
        ({"precision": "fp32", "version_compatible": True}, ["VERSION_COMPATIBLE"], ["TF32"]),
        ({"hardware_compatibility": "ampere_plus"}, ["FP16"], []),
    ],
)
def test_it_sets_the_builder_flags_the_config_asks_for(config, flags, cleared):
    assert plan.builder_flags(config) == flags
    assert plan.cleared_flags(config) == cleared


@pytest.mark.parametrize(
    ("config", "level"),
    [
        ({}, None),
        ({"hardware_compatibility": "none"}, None),
        ({"hardware_compatibility": "ampere_plus"}, "AMPERE_PLUS"),
        ({"hardware_compatibility": "same_compute_capability"}, "SAME_COMPUTE_CAPABILITY"),
    ],
)
def test_it_names_the_hardware_compatibility_level(config, level):
    assert plan.hardware_level(config) == level


@pytest.mark.parametrize(
    ("config", "calibrates"),
    [
        ({}, False),
        ({"precision": "int8"}, True),
        ({"precision": "int8", "int8_mode": "calibration"}, True),
        ({"precision": "int8", "int8_mode": "qdq"}, False),
    ],
)
def test_it_calibrates_only_implicit_int8(config, calibrates):
    assert plan.needs_calibration(config) is calibrates


def test_it_describes_the_settings_in_one_log_line():
    line = plan.describe_settings({"precision": "fp32", "workspace_mb": 1024}, "10.16.1.11")

    assert line == (
        "tensorrt 10.16.1.11, precision fp32, flags none, cleared TF32, workspace 1024 MiB, "
        "optimisation level 3, hardware compatibility none, version compatible false"
    )
    assert "precision int8 (qdq), flags INT8, FP16" in plan.describe_settings(
        {"precision": "int8", "int8_mode": "qdq"}, "10.16.1.11"
    )


# optimisation profiles from the contract


def entry(shape, batch, dynamic=None):
    return {"shape": shape, "batch": batch, "dynamic": dynamic or {}}


IMAGE = ["batch", 3, 224, 224]
RANGE = {"min": 1, "opt": 4, "max": 8}
HW = {"2": {"min": 224, "opt": 320, "max": 640}, "3": {"min": 224, "opt": 480, "max": 640}}

PROFILE_CASES = [
    (
        "static model, static contract: no profile",
        {"inputs": {"image": entry(IMAGE, {"sizes": [1]})}},
        [{"name": "image", "shape": [1, 3, 224, 224]}],
        [],
    ),
    (
        "static model needs no contract",
        None,
        [{"name": "image", "shape": [8, 3, 224, 224]}],
        [],
    ),
    (
        "batch sizes: min the smallest, opt and max the largest",
        {"inputs": {"image": entry(IMAGE, {"sizes": [1, 8, 16]})}},
        [{"name": "image", "shape": [-1, 3, 224, 224]}],
        [{"image": ((1, 3, 224, 224), (16, 3, 224, 224), (16, 3, 224, 224))}],
    ),
    (
        "one batch size on a symbolic batch: min = opt = max",
        {"inputs": {"image": entry(IMAGE, {"sizes": [8]})}},
        [{"name": "image", "shape": ["N", 3, 224, 224]}],
        [{"image": ((8, 3, 224, 224),) * 3}],
    ),
    (
        "batch min/opt/max as written",
        {"inputs": {"image": entry(IMAGE, RANGE)}},
        [{"name": "image", "shape": [None, 3, 224, 224]}],
        [{"image": ((1, 3, 224, 224), (4, 3, 224, 224), (8, 3, 224, 224))}],
    ),
    (
        "dynamic height and width from the dynamic ranges",
        {"inputs": {"image": entry(["batch", 3, "h", "w"], RANGE, HW)}},
        [{"name": "image", "shape": [-1, 3, -1, -1]}],
        [{"image": ((1, 3, 224, 224), (4, 3, 320, 480), (8, 3, 640, 640))}],
    ),
    (
        "fixed batch in the model, dynamic height and width",
        {"inputs": {"image": entry(["batch", 3, "h", "w"], {"sizes": [1]}, HW)}},
        [{"name": "image", "shape": [1, 3, -1, -1]}],
        [{"image": ((1, 3, 224, 224), (1, 3, 320, 480), (1, 3, 640, 640))}],
    ),
    (
        "an axis the contract fixes though the model leaves it symbolic",
        {"inputs": {"image": entry(IMAGE, {"sizes": [2]})}},
        [{"name": "image", "shape": [-1, 3, "height", "width"]}],
        [{"image": ((2, 3, 224, 224),) * 3}],
    ),
    (
        "only the dynamic inputs get shapes",
        {
            "inputs": {
                "image": entry(IMAGE, {"sizes": [1, 4]}),
                "scale": entry(["batch", 2], {"sizes": [1]}),
            }
        },
        [{"name": "image", "shape": [-1, 3, 224, 224]}, {"name": "scale", "shape": [1, 2]}],
        [{"image": ((1, 3, 224, 224), (4, 3, 224, 224), (4, 3, 224, 224))}],
    ),
    (
        "the selftest's tiny model",
        TINY_CONTRACT,
        [{"name": "x", "shape": [-1, 16]}],
        [{"x": ((1, 16), (2, 16), (2, 16))}],
    ),
]


@pytest.mark.parametrize(
    ("contract", "model_inputs", "profiles"),
    [case[1:] for case in PROFILE_CASES],
    ids=[case[0] for case in PROFILE_CASES],
)
def test_it_builds_optimisation_profiles_from_the_contract(contract, model_inputs, profiles):
    assert plan.profiles_from_contract(contract, model_inputs) == profiles


@pytest.mark.parametrize(
    ("contract", "model_inputs", "message"),
    [
        (None, [{"name": "x", "shape": [-1, 16]}], r"needs the input-shape contract.*'x'"),
        ({"inputs": {}}, [{"name": "x", "shape": [-1, 16]}], "no entry for the input 'x'"),
        (
            {"inputs": {"image": entry(["batch", 3, "h", "w"], RANGE)}},
            [{"name": "image", "shape": [-1, 3, -1, -1]}],
            "axis 2 of 'image' is dynamic and the contract gives it no min, opt and max",
        ),
        (
            {"inputs": {"x": entry(["batch", 16, 4], {"sizes": [1]})}},
            [{"name": "x", "shape": [-1, 16]}],
            "the network's 'x' has 2 axes; the contract's shape has 3",
        ),
        (
            {"inputs": {"x": entry(["batch", 16], None)}},
            [{"name": "x", "shape": [-1, 16]}],
            "gives the batch of 'x' no sizes or range",
        ),
    ],
)
def test_it_refuses_to_guess_a_profile_the_contract_does_not_give(contract, model_inputs, message):
    with pytest.raises(JobError, match=message) as raised:
        plan.profiles_from_contract(contract, model_inputs)
    assert str(raised.value).startswith("shape_or_contract: ")


def test_it_describes_profiles_for_the_build_log():
    profiles = [{"x": ((1, 16), (2, 16), (2, 16))}]

    assert plan.describe_profiles(profiles) == ["profile 0: x min 1x16 opt 2x16 max 2x16"]
    assert plan.describe_profiles([]) == []


# caches


@pytest.mark.parametrize(
    ("kind", "key", "name"),
    [
        ("timing", KEY, f"tensorrt-timing-{'ab' * 32}.cache"),
        ("calibration", KEY, f"tensorrt-calibration-{'ab' * 32}.cache"),
    ],
)
def test_it_names_caches_by_kind_and_compatibility_key(kind, key, name):
    assert plan.cache_name(kind, key) == name


@pytest.mark.parametrize(
    ("kind", "key", "message"),
    [
        ("engine", KEY, "cache kind 'engine'"),
        ("timing", "tensorrt:abc", "is not a compatibility key"),
        ("timing", "ab" * 32, "is not a compatibility key"),
        ("timing", "tensorrt:../../" + "ab" * 31, "is not a compatibility key"),
    ],
)
def test_it_refuses_to_name_a_cache_from_anything_else(kind, key, message):
    with pytest.raises(ValueError, match=message):
        plan.cache_name(kind, key)


def test_it_ties_a_calibration_cache_to_the_tensorrt_release_not_the_gpu():
    fields = plan.calibration_fields("10.16.1.11", "m" * 64, "d" * 64, 512)

    assert fields == {
        "tensorrt": "10.16.1",
        "model_sha256": "m" * 64,
        "dataset_sha256": "d" * 64,
        "calibration_samples": 512,
    }
    same_release = plan.calibration_fields("10.16.1.12", "m" * 64, "d" * 64, 512)
    next_release = plan.calibration_fields("10.17.0.3", "m" * 64, "d" * 64, 512)
    assert compat_key("tensorrt", fields) == compat_key("tensorrt", same_release)
    assert compat_key("tensorrt", fields) != compat_key("tensorrt", next_release)
    assert plan.cache_name("calibration", compat_key("tensorrt", fields)).endswith(".cache")


@pytest.mark.parametrize(
    ("samples", "limit", "fixed", "planned"),
    [
        (1000, 512, None, (8, 64)),
        (20, 512, None, (8, 2)),
        (5, 512, None, (5, 1)),
        (100, 10, None, (8, 1)),
        (100, 512, 1, (1, 100)),
        (100, 512, 32, (32, 3)),
    ],
)
def test_it_plans_calibration_batches(samples, limit, fixed, planned):
    assert plan.calibration_plan(samples, limit, fixed) == planned


def test_it_refuses_to_calibrate_with_fewer_samples_than_the_fixed_batch():
    with pytest.raises(JobError, match="needs at least 32 samples"):
        plan.calibration_plan(10, 512, 32)


# errors


CLASSIFIED = [
    (
        "parser: no importer (TensorRT 8 wording)",
        ["In node 12 (parseGraph): UNSUPPORTED_NODE: No importer registered for op: Foo"],
        ("unsupported_operator", "#12"),
    ),
    (
        "parser: no importer, node named (TensorRT 10 wording)",
        [
            'ModelImporter.cpp:949: While parsing node number 3 [Foo -> "/head/foo_out"]:',
            "In node 3 with name: /head/Foo and operator: Foo (checkFallbackPluginImporter): "
            'INVALID_NODE: creator && "Plugin not found, are the plugin name, version, and '
            'namespace correct?"',
        ],
        ("unsupported_operator", "/head/Foo"),
    ),
    (
        "builder: shape error with a layer",
        [
            "[shapeCompiler.cpp::evaluateShapeChecks::1276] Error Code 4: Internal Error "
            "(kOPT values for profile 0 violate shape constraints: IShuffleLayer /Reshape: "
            "reshaping failed for tensor: /Flatten_output_0)"
        ],
        ("shape_or_contract", "/Reshape"),
    ),
    (
        "builder: no profile for dynamic inputs",
        [
            "[network.cpp::validate::3162] Error Code 4: Internal Error (Network has dynamic or "
            "shape inputs, but no optimization profile has been defined.)"
        ],
        ("shape_or_contract", None),
    ),
    (
        "builder: dimensions",
        ["Error Code 4: Internal Error (input: dynamic input is missing dimensions in profile 0.)"],
        ("shape_or_contract", None),
    ),
    (
        "builder: out of GPU memory",
        [
            "[virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: OutOfMemory "
            "(Requested size was 8589934592 bytes.)"
        ],
        ("out_of_memory", None),
    ),
    (
        "allocator: CUDA out of memory",
        [
            "[defaultAllocator.cpp::allocate::31] Error Code 1: Cuda Runtime (out of memory)",
            "Error Code 4: Internal Error (dimensions too large for the workspace)",
        ],
        ("out_of_memory", None),
    ),
    (
        "no GPU",
        ["CUDA initialization failure with error: 100. Please check your CUDA installation"],
        ("runtime_missing", None),
    ),
    (
        "missing library",
        ["libnvinfer.so.10: cannot open shared object file: No such file or directory"],
        ("runtime_missing", None),
    ),
    ("build killed at its time limit", ["the build timed out after 3600 s"], ("timeout", None)),
    (
        "no implementation",
        [
            "[optimizer.cpp::computeCosts::4040] Error Code 10: Internal Error (Could not find "
            "any implementation for node /layer1/layer1.0/conv1/Conv.)"
        ],
        ("internal", "/layer1/layer1.0/conv1/Conv"),
    ),
    ("nothing said", [], ("internal", None)),
]


@pytest.mark.parametrize(
    ("messages", "classified"),
    [case[1:] for case in CLASSIFIED],
    ids=[case[0] for case in CLASSIFIED],
)
def test_it_classifies_a_failed_build_and_finds_the_node(messages, classified):
    assert plan.classify_build_error(messages) == classified


def parser_error(**fields):
    return {"node": -1, "node_name": None, "operator": None, "code": None, "desc": ""} | fields


PARSER_TEXTS = [
    (
        [
            parser_error(
                node=12,
                node_name="/head/Foo",
                operator="Foo",
                code="ErrorCode.UNSUPPORTED_NODE",
                desc="No importer registered for op: Foo. Attempting to import as plugin.",
            )
        ],
        "TensorRT's ONNX parser refused the model: node /head/Foo (#12, Foo): "
        "UNSUPPORTED_NODE: No importer registered for op: Foo. Attempting to import as plugin.",
    ),
    (
        [parser_error(node=4, code="ErrorCode.INVALID_NODE", desc="bad attribute")],
        "TensorRT's ONNX parser refused the model: node #4: INVALID_NODE: bad attribute",
    ),
    (
        [
            parser_error(code="ErrorCode.MODEL_DESERIALIZE_FAILED", desc="not an ONNX file"),
            parser_error(node=0, node_name="a", operator="Conv", desc="second"),
        ],
        "TensorRT's ONNX parser refused the model: the graph: MODEL_DESERIALIZE_FAILED: "
        "not an ONNX file; node a (#0, Conv): second",
    ),
    ([], "TensorRT's ONNX parser refused the model without saying why"),
]


@pytest.mark.parametrize(("errors", "text"), PARSER_TEXTS)
def test_it_reports_parser_errors_with_the_failing_node(errors, text):
    assert plan.parser_error_text(errors) == text


def test_it_raises_parser_errors_with_the_category_first_as_the_hub_reads_it():
    errors = [PARSER_TEXTS[0][0][0]]

    error = plan.parser_error(errors)

    assert isinstance(error, JobError)
    assert (error.category, error.node) == ("unsupported_operator", "/head/Foo")
    assert str(error).split(":", 1)[0] == "unsupported_operator"
    assert "node /head/Foo (#12, Foo)" in str(error)


def test_it_raises_build_errors_with_the_category_and_the_last_messages():
    error = plan.build_error(["Error Code 2: OutOfMemory (Requested size was 8 GiB.)"])

    assert str(error) == (
        "out_of_memory: TensorRT could not build the engine: "
        "Error Code 2: OutOfMemory (Requested size was 8 GiB.)"
    )
    assert str(plan.build_error([], doing="run the engine")) == (
        "internal: TensorRT could not run the engine: it said nothing more"
    )


@pytest.mark.parametrize(
    ("version", "accepted"),
    [("10.0.1.6", True), ("10.16.1.11", True), ("8.6.1", False), ("11.0.0", False)],
)
def test_it_builds_with_tensorrt_10_only(version, accepted):
    if accepted:
        plan.check_tensorrt_version(version)
    else:
        with pytest.raises(JobError, match=rf"written for TensorRT 10.x; found {version}"):
            plan.check_tensorrt_version(version)


# the engine inspector's per-layer information


def test_it_counts_layers_and_their_types_from_the_detailed_inspector_json():
    info = json.dumps(
        {
            "Layers": [
                {"Name": "/conv1/Conv + /relu/Relu", "LayerType": "CaskConvolution"},
                {"Name": "/conv2/Conv", "LayerType": "CaskConvolution"},
                {"Name": "Reformatting CopyNode for Input Tensor 0", "LayerType": "Reformat"},
                {"Name": "/fc/Gemm"},
            ],
            "Bindings": ["image", "logits"],
        }
    )

    assert plan.layer_summary(info) == {
        "layers": 4,
        "layer_types": {"CaskConvolution": 2, "Reformat": 1, "unknown": 1},
    }


def test_it_counts_layers_without_types_when_the_engine_lists_names_only():
    info = json.dumps({"Layers": ["/conv1/Conv + /relu/Relu", "/fc/Gemm"], "Bindings": []})

    assert plan.layer_summary(info) == {"layers": 2, "layer_types": {"unknown": 2}}


# what a host lacks


GPU_HOST = {
    "gpus": [{"index": 0, "name": "NVIDIA A10", "compute_capability": "8.6"}],
    "nvidia_driver": "550.54.15",
    "cuda": {"driver_api": "12.4", "runtime": "12.4"},
    "torch": {"version": "2.13.0+cu124", "cuda": "12.4"},
}


@pytest.mark.parametrize(
    ("fingerprint", "problems"),
    [
        (GPU_HOST, []),
        (
            {"gpus": None, "nvidia_driver": None, "cuda": None, "torch": None},
            [
                "no NVIDIA driver found (NVML could not initialise)",
                "torch is not installed: TensorRT's input and output buffers are torch CUDA "
                "tensors: pip install deployhub[torch] (a CUDA build)",
            ],
        ),
        (GPU_HOST | {"gpus": []}, ["the NVIDIA driver reports no GPU"]),
        (GPU_HOST | {"cuda": None}, ["the NVIDIA driver reports no CUDA version"]),
        (
            GPU_HOST | {"torch": {"version": "2.13.0+cpu", "cuda": None}},
            [
                "torch 2.13.0+cpu is a CPU build: TensorRT's input and output buffers are torch "
                "CUDA tensors; install a CUDA build of torch"
            ],
        ),
    ],
    ids=["gpu host", "nothing", "no gpu", "no cuda", "cpu torch"],
)
def test_it_says_what_a_host_lacks_for_tensorrt(fingerprint, problems):
    assert plan.gpu_problems(fingerprint) == problems


# compile on this machine


@pytest.mark.skipif(TRT_INSTALLED, reason="TensorRT is installed here")
def test_it_refuses_to_compile_without_tensorrt_naming_the_extra(tmp_path):
    source = write_tiny_model(tmp_path / "tiny.onnx")

    with pytest.raises(MissingRuntime, match=r"pip install deployhub\[tensorrt\]") as raised:
        TensorRTBackend().compile(source, {"contract": TINY_CONTRACT}, tmp_path)
    assert isinstance(raised.value, JobError)
    assert not (tmp_path / "engine.plan").exists()


@pytest.mark.skipif(TRT_INSTALLED, reason="TensorRT is installed here")
def test_it_refuses_to_load_an_engine_without_tensorrt(tmp_path):
    with pytest.raises(MissingRuntime, match=r"pip install deployhub\[tensorrt\]"):
        TensorRTBackend().load(tmp_path / "engine.plan", {})


def test_it_refuses_int8_calibration_without_a_dataset_before_anything_else(tmp_path):
    source = write_tiny_model(tmp_path / "tiny.onnx")

    with pytest.raises(JobError, match="int8 calibration needs the version's calibration dataset"):
        TensorRTBackend().compile(source, {"precision": "int8"}, tmp_path)


def test_it_refuses_a_bad_config_before_looking_for_tensorrt(tmp_path):
    with pytest.raises(JobError, match="precision 'int4'"):
        TensorRTBackend().compile(tmp_path / "tiny.onnx", {"precision": "int4"}, tmp_path)


# compile() against a recording stand-in for the tensorrt module


class FakeTensorRTForCallOrderTest:
    """A stand-in for the tensorrt module that records the calls compile() makes.

    It accepts anything and builds nothing: it shows the order and arguments of
    our calls, never that real TensorRT accepts them. The real path is proven
    on a GPU with `deployhub-worker selftest --backend tensorrt`.
    """

    __version__ = "10.16.1.11"

    def __init__(self, parse_errors=(), build_messages=None):
        self.calls = []
        self.parse_errors, self.build_messages = list(parse_errors), build_messages
        fake = self

        def enum(*names):
            return SimpleNamespace(**{name: _Member(name) for name in names})

        self.BuilderFlag = enum("FP16", "BF16", "INT8", "TF32", "VERSION_COMPATIBLE")
        self.HardwareCompatibilityLevel = enum("NONE", "AMPERE_PLUS", "SAME_COMPUTE_CAPABILITY")
        self.MemoryPoolType = enum("WORKSPACE")
        self.ProfilingVerbosity = enum("DETAILED")
        self.LayerInformationFormat = enum("JSON")

        class ILogger:
            Severity = enum("INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE")

            def __init__(self):
                fake.logger = self

        self.ILogger = ILogger
        self.Builder = lambda logger: _Recorder(fake, "builder")
        self.OnnxParser = lambda network, logger: _Recorder(fake, "parser")
        self.Runtime = lambda logger: _Recorder(fake, "runtime")

    def record(self, name, *args):
        self.calls.append((name, *args))


class _Member:
    """An enum member of the fake module: hashable, with a name, like pybind11's."""

    def __init__(self, name):
        self.name = name


class _Recorder:
    """One object of the fake module: each method records its call and answers plausibly."""

    def __init__(self, fake, kind):
        self.fake, self.kind = fake, kind

    def __setattr__(self, name, value):
        if name not in ("fake", "kind"):
            self.fake.record(f"{self.kind}.{name} =", getattr(value, "name", value))
        object.__setattr__(self, name, value)

    # builder
    def create_network(self, flags):
        self.fake.record("builder.create_network", flags)
        network = _Recorder(self.fake, "network")
        tensor = SimpleNamespace(name="x", shape=[-1, 16], dtype="FLOAT")
        object.__setattr__(network, "get_input", lambda i: tensor)
        for name, value in (("num_inputs", 1), ("num_layers", 2), ("num_outputs", 1)):
            object.__setattr__(network, name, value)
        return network

    def create_builder_config(self):
        return _Recorder(self.fake, "config")

    def create_optimization_profile(self):
        return _Recorder(self.fake, "profile")

    def build_serialized_network(self, network, config):
        self.fake.record("builder.build_serialized_network")
        if self.fake.build_messages is not None:
            for message in self.fake.build_messages:
                self.fake.logger.log(self.fake.ILogger.Severity.ERROR, message)
            return None
        return b"PLAN"

    # parser
    def parse_from_file(self, path):
        self.fake.record("parser.parse_from_file", Path(path).name)
        object.__setattr__(self, "num_errors", len(self.fake.parse_errors))
        return not self.fake.parse_errors

    def get_error(self, index):
        error = self.fake.parse_errors[index]
        return SimpleNamespace(**{key: (lambda v=value: v) for key, value in error.items()})

    # config and profile
    def set_memory_pool_limit(self, pool, size):
        self.fake.record("config.set_memory_pool_limit", pool.name, size)

    def set_flag(self, flag):
        self.fake.record("config.set_flag", flag.name)

    def clear_flag(self, flag):
        self.fake.record("config.clear_flag", flag.name)

    def set_shape(self, name, low, opt, high):
        self.fake.record("profile.set_shape", name, low, opt, high)

    def add_optimization_profile(self, profile):
        self.fake.record("config.add_optimization_profile")
        return 0

    def create_timing_cache(self, data):
        self.fake.record("config.create_timing_cache", bytes(data))
        return "cache"

    def set_timing_cache(self, cache, ignore_mismatch):
        self.fake.record("config.set_timing_cache", ignore_mismatch)
        return True

    def get_timing_cache(self):
        return SimpleNamespace(serialize=lambda: b"TIMINGS")

    # runtime, engine, inspector
    def deserialize_cuda_engine(self, data):
        self.fake.record("runtime.deserialize_cuda_engine", bytes(data))
        return self

    def create_engine_inspector(self):
        return self

    def get_engine_information(self, fmt):
        self.fake.record("inspector.get_engine_information", fmt.name)
        layers = [{"Name": "/MatMul", "LayerType": "CaskGemmMatMul"}, {"Name": "/Relu"}]
        return json.dumps({"Layers": layers})


def compile_with(fake, monkeypatch, tmp_path, config, timing_cache=None):
    monkeypatch.setattr(trt_backend, "_import_tensorrt", lambda: fake)
    source = write_tiny_model(tmp_path / "tiny.onnx")
    workdir = tmp_path / "build"
    workdir.mkdir()
    return TensorRTBackend().compile(source, config, workdir, timing_cache=timing_cache)


def test_it_calls_tensorrt_in_order_against_FakeTensorRTForCallOrderTest(monkeypatch, tmp_path):
    fake = FakeTensorRTForCallOrderTest()
    cache_in = tmp_path / "earlier.cache"
    cache_in.write_bytes(b"EARLIER")
    config = {
        "contract": TINY_CONTRACT,
        "precision": "fp32",
        "hardware_compatibility": "ampere_plus",
    }

    built = compile_with(fake, monkeypatch, tmp_path, config, timing_cache=cache_in)

    assert fake.calls == [
        ("builder.create_network", 0),
        ("parser.parse_from_file", "tiny.onnx"),
        ("config.set_memory_pool_limit", "WORKSPACE", 4096 * 2**20),
        ("config.builder_optimization_level =", 3),
        ("config.clear_flag", "TF32"),
        ("config.hardware_compatibility_level =", "AMPERE_PLUS"),
        ("config.profiling_verbosity =", "DETAILED"),
        ("profile.set_shape", "x", (1, 16), (2, 16), (2, 16)),
        ("config.add_optimization_profile",),
        ("config.create_timing_cache", b"EARLIER"),
        ("config.set_timing_cache", False),
        ("builder.build_serialized_network",),
        ("runtime.deserialize_cuda_engine", b"PLAN"),
        ("inspector.get_engine_information", "JSON"),
    ]
    assert built.artifact.read_bytes() == b"PLAN" and built.artifact.name == "engine.plan"
    assert built.timing_cache.read_bytes() == b"TIMINGS"
    assert built.tool_versions == {"tensorrt": "10.16.1.11"}
    assert built.graph_report["after"] == {
        "layers": 2,
        "layer_types": {"CaskGemmMatMul": 1, "unknown": 1},
    }
    assert built.graph_report["before"] == {"nodes": 2, "operators": {"MatMul": 1, "Relu": 1}}
    assert "profile 0: x min 1x16 opt 2x16 max 2x16" in built.log
    assert "timing cache in: 7 bytes" in built.log


def test_it_sets_int8_qdq_and_version_compatible_flags_against_the_fake(monkeypatch, tmp_path):
    fake = FakeTensorRTForCallOrderTest()
    config = {
        "contract": TINY_CONTRACT,
        "precision": "int8",
        "int8_mode": "qdq",
        "version_compatible": True,
    }

    compile_with(fake, monkeypatch, tmp_path, config)

    flags = [call[1] for call in fake.calls if call[0] == "config.set_flag"]
    assert flags == ["INT8", "FP16", "VERSION_COMPATIBLE"]
    assert ("runtime.engine_host_code_allowed =", True) in fake.calls
    assert ("config.create_timing_cache", b"") in fake.calls


def test_it_raises_parser_errors_naming_the_node_against_the_fake(monkeypatch, tmp_path):
    error = {
        "node": 1,
        "node_name": "/Relu",
        "node_operator": "Relu",
        "code": "ErrorCode.UNSUPPORTED_NODE",
        "desc": "No importer registered for op: Relu",
    }
    fake = FakeTensorRTForCallOrderTest(parse_errors=[error])

    with pytest.raises(JobError) as raised:
        compile_with(fake, monkeypatch, tmp_path, {"contract": TINY_CONTRACT})

    assert str(raised.value) == (
        "unsupported_operator: TensorRT's ONNX parser refused the model: "
        "node /Relu (#1, Relu): UNSUPPORTED_NODE: No importer registered for op: Relu"
    )
    assert fake.calls[-1] == ("parser.parse_from_file", "tiny.onnx")


def test_it_raises_the_classified_build_error_against_the_fake(monkeypatch, tmp_path):
    messages = ["[defaultAllocator.cpp::allocate::31] Error Code 1: Cuda Runtime (out of memory)"]
    fake = FakeTensorRTForCallOrderTest(build_messages=messages)

    with pytest.raises(JobError, match=r"^out_of_memory: TensorRT could not build the engine"):
        compile_with(fake, monkeypatch, tmp_path, {"contract": TINY_CONTRACT})
    assert not (tmp_path / "build" / "engine.plan").exists()


def test_it_needs_the_contract_for_a_dynamic_network_against_the_fake(monkeypatch, tmp_path):
    fake = FakeTensorRTForCallOrderTest()

    with pytest.raises(JobError, match=r"^shape_or_contract: TensorRT needs the input-shape"):
        compile_with(fake, monkeypatch, tmp_path, {})
    assert ("builder.build_serialized_network",) not in fake.calls
