"""Builds and first loads run in a child process: a crash costs the build, never the worker."""

import os
import signal
import threading
import time

import pytest

from workers.backends import forkserver
from workers.backends.isolate import (
    CATEGORIES,
    CompileFailure,
    classify,
    compile_result_from_json,
    run_isolated,
)
from workers.errors import Cancelled, JobError
from workers.selftest import write_tiny_model

HERE = __name__  # the children below run as f"{HERE}.<function>"

ORT_NOT_IMPLEMENTED = (
    "onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented: [ONNXRuntimeError] : 9 : "
    "NOT_IMPLEMENTED : Could not find an implementation for ConvInteger(10) node with name "
    "'conv1_quant'"
)
ORT_UNREGISTERED = (
    "[ONNXRuntimeError] : 1 : FAIL : Fatal error: com.example:Foo(-1) is not a registered "
    "function/op"
)
ORT_SHAPE_INFERENCE = (
    "[ONNXRuntimeError] : 1 : FAIL : Load model from /tmp/job-3/model/m.onnx failed:Node "
    "(/layer1/Reshape) Op (Reshape) [ShapeInferenceError] Dimension could not be inferred: "
    "incompatible shapes"
)
ORT_BAD_INPUT = (
    "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: image for "
    "the following indices\n index: 2 Got: 224 Expected: 32\n Please fix either the "
    "inputs/outputs or the model."
)
ORT_ARENA_OOM = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running "
    "Conv node. Name:'/backbone/conv1/Conv' Status Message: /onnxruntime_src/onnxruntime/core/"
    "framework/bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, "
    "onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Failed to allocate memory "
    "for requested buffer of size 3221225472"
)
ORT_TYPE_ERROR = (
    "[ONNXRuntimeError] : 10 : INVALID_GRAPH : This is an invalid model. Type Error: Type "
    "'tensor(uint8)' of input parameter (x) of operator (Relu) in node (relu_0) is invalid."
)
ORT_NO_CUDA = (
    "[ONNXRuntimeError] : 1 : FAIL : Failed to load library libonnxruntime_providers_cuda.so "
    "with error: libcublasLt.so.12: cannot open shared object file: No such file or directory"
)
TRT_UNSUPPORTED = (
    "[E] [TRT] ModelImporter.cpp:914: ERROR: ModelImporter.cpp:773: While parsing node "
    'number 42 [RoiAlign -> "/model/roi/RoiAlign_output_0"]:\n[E] [TRT] In node 42 with '
    "name: /model/roi/RoiAlign and operator: RoiAlign (parseGraph): UNSUPPORTED_NODE: "
    'Assertion failed: creator && "Plugin not found, are the plugin name, version, and '
    'namespace correct?"'
)
TRT_OLD_IMPORTER = (
    'While parsing node number 7 [GridSample -> "/head/GridSample_output_0"]:\n'
    "No importer registered for op: GridSample. Attempting to import as plugin."
)
TRT_OOM = (
    "[TRT] [E] 1: [defaultAllocator.cpp::allocate::20] Error Code 1: Cuda Runtime (out of memory)"
)
TRT_NO_PROFILE = (
    "[TRT] [E] 4: [network.cpp::validate::3162] Error Code 4: Internal Error (Network has "
    "dynamic or shape inputs, but no optimization profile has been defined.)"
)
OV_LAYER = (
    "Exception from src/inference/src/cpp/core.cpp:107:\nException from src/plugins/intel_cpu/"
    "src/node.cpp:1598:\nCannot create Interpolate layer /neck/Resize id:57 from unsupported "
    "opset: opset11"
)
OV_FRONTEND = (
    "Check 'unknown_operators.empty()' failed at src/frontends/onnx/frontend/src/core/"
    "graph.cpp:201:\nOpenVINO does not support the following ONNX operations: "
    "custom_domain.MyOp"
)
TORCH_CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.65 GiB "
    "total capacity; 21.10 GiB already allocated)"
)
BAD_ALLOC = (
    "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc"
)
SEGFAULT = (
    "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):"
    '\n  File "x.py", line 4'
)
WARNING_THEN_OOM = (
    "[W] UNSUPPORTED_NODE: GridSample falls back to a plugin\n...\nCUDA error: out of memory"
)

CLASSIFY_CASES = [
    # (name, text, exit code, timed out, category, node)
    ("ort not implemented", ORT_NOT_IMPLEMENTED, 1, False, "unsupported_operator", "conv1_quant"),
    ("ort unregistered op", ORT_UNREGISTERED, 1, False, "unsupported_operator", None),
    ("ort shape inference", ORT_SHAPE_INFERENCE, 1, False, "shape_or_contract", "/layer1/Reshape"),
    ("ort bad input dims", ORT_BAD_INPUT, 1, False, "shape_or_contract", None),
    ("ort arena oom", ORT_ARENA_OOM, 1, False, "out_of_memory", "/backbone/conv1/Conv"),
    ("ort type error", ORT_TYPE_ERROR, 1, False, "shape_or_contract", "relu_0"),
    ("ort cuda libraries missing", ORT_NO_CUDA, 1, False, "runtime_missing", None),
    ("trt unsupported node", TRT_UNSUPPORTED, 1, False, "unsupported_operator",
     "/model/roi/RoiAlign"),
    ("trt no importer", TRT_OLD_IMPORTER, 1, False, "unsupported_operator",
     "/head/GridSample_output_0"),
    ("trt out of memory", TRT_OOM, 1, False, "out_of_memory", None),
    ("trt no profile", TRT_NO_PROFILE, 1, False, "shape_or_contract", None),
    ("openvino layer", OV_LAYER, 1, False, "unsupported_operator", "/neck/Resize"),
    ("openvino frontend", OV_FRONTEND, 1, False, "unsupported_operator", None),
    ("torch cuda oom", TORCH_CUDA_OOM, 1, False, "out_of_memory", None),
    ("std::bad_alloc abort", BAD_ALLOC, -6, False, "out_of_memory", None),
    ("python MemoryError", "Traceback ...\nMemoryError", 1, False, "out_of_memory", None),
    ("segfault", SEGFAULT, -11, False, "internal", None),
    ("killed from outside", "", -9, False, "out_of_memory", None),
    ("timeout wins", ORT_NOT_IMPLEMENTED, -9, True, "timeout", "conv1_quant"),
    ("missing module", "ModuleNotFoundError: No module named 'tensorrt'", 1, False,
     "runtime_missing", None),
    ("anything else", "ValueError: something odd", 1, False, "internal", None),
    ("the last error wins", WARNING_THEN_OOM, 1, False, "out_of_memory", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "exit_code", "timed_out", "category", "node"),
    [case[1:] for case in CLASSIFY_CASES],
    ids=[case[0] for case in CLASSIFY_CASES],
)
def test_it_classifies_what_runtimes_print(text, exit_code, timed_out, category, node):
    assert classify(text, exit_code, timed_out) == (category, node)
    assert category in CATEGORIES


# Children: top-level functions run_isolated imports by dotted path in the child process.
def child_doubles(x, progress=None):
    if progress is not None:
        progress(0.5, "halfway")
    print("a library talking on stdout")  # must not break the reply channel
    return {"double": x * 2}


def child_raises():
    raise RuntimeError(ORT_NOT_IMPLEMENTED)


def child_segfaults():
    os.kill(os.getpid(), signal.SIGSEGV)


def child_aborts():
    os.abort()


def child_sleeps():
    time.sleep(60)


def child_runs_out_of_memory():
    raise MemoryError


def child_refuses():
    raise JobError("int8 needs the version's calibration dataset")


def test_it_returns_the_childs_result_and_forwards_its_progress():
    reports = []

    result = run_isolated(
        f"{HERE}.child_doubles",
        {"x": 21},
        timeout=30,
        progress=lambda fraction, message: reports.append((fraction, message)),
    )

    assert result == {"double": 42}
    assert reports == [(0.5, "halfway")]


def test_it_reports_an_exception_with_its_category_node_and_traceback():
    with pytest.raises(CompileFailure) as raised:
        run_isolated(f"{HERE}.child_raises", {}, timeout=30)

    failure = raised.value
    assert failure.category == "unsupported_operator" and failure.node == "conv1_quant"
    assert str(failure).startswith("unsupported_operator: RuntimeError: ")
    assert str(failure).endswith("node with name 'conv1_quant'")
    assert "\n" not in str(failure)
    assert "Traceback (most recent call last)" in failure.log and "child_raises" in failure.log
    assert isinstance(failure, JobError)


@pytest.mark.parametrize(
    ("child", "signal_name"),
    [("child_segfaults", "SIGSEGV"), ("child_aborts", "SIGABRT")],
)
def test_it_survives_a_child_that_crashes(child, signal_name):
    with pytest.raises(CompileFailure) as raised:
        run_isolated(f"{HERE}.{child}", {}, timeout=30)

    assert raised.value.category == "internal"
    assert signal_name in str(raised.value)
    assert child in raised.value.log  # faulthandler's stack of the child
    assert run_isolated(f"{HERE}.child_doubles", {"x": 1}, timeout=30) == {"double": 2}


def test_it_kills_a_child_that_runs_past_its_time():
    started = time.monotonic()

    with pytest.raises(CompileFailure) as raised:
        run_isolated(f"{HERE}.child_sleeps", {}, timeout=1)

    assert raised.value.category == "timeout"
    assert str(raised.value) == "timeout: no result within 1 s, so the child process was killed"
    assert time.monotonic() - started < 10


def test_it_reports_a_memory_error_as_out_of_memory():
    with pytest.raises(CompileFailure) as raised:
        run_isolated(f"{HERE}.child_runs_out_of_memory", {}, timeout=30)

    assert raised.value.category == "out_of_memory"


def test_it_passes_a_refusal_on_as_a_job_error_with_its_message():
    with pytest.raises(JobError) as raised:
        run_isolated(f"{HERE}.child_refuses", {}, timeout=30)

    assert not isinstance(raised.value, CompileFailure)
    assert str(raised.value) == "int8 needs the version's calibration dataset"


def test_it_kills_the_child_when_the_job_is_cancelled():
    started = time.monotonic()

    with pytest.raises(Cancelled):
        run_isolated(f"{HERE}.child_sleeps", {}, timeout=60, should_stop=lambda: True)

    assert time.monotonic() - started < 10


def test_it_compiles_and_smoke_tests_an_onnxruntime_model_in_children(tmp_path):
    source = write_tiny_model(tmp_path / "tiny.onnx")
    build = tmp_path / "build"
    build.mkdir()
    kwargs = {"backend": "onnxruntime", "source": str(source), "build_config": {}}

    answer = run_isolated(
        "workers.backends.isolate.compile_backend", kwargs | {"workdir": str(build)}, timeout=60
    )
    built = compile_result_from_json(answer)
    ran = run_isolated(
        "workers.backends.isolate.smoke_test",
        kwargs | {"artifact": str(built.artifact)},
        timeout=60,
    )

    assert built.artifact == build / "engine.onnx" and built.artifact.is_file()
    assert built.graph_report["before"]["nodes"] >= built.graph_report["after"]["nodes"]
    assert answer["seconds"] > 0
    assert ran["inputs"] == {"x": [1, 16]} and len(ran["outputs"]) == 1


def test_a_failure_the_backend_already_classified_is_not_prefixed_twice():
    from workers.backends.isolate import CompileFailure

    failure = CompileFailure("out_of_memory", "out_of_memory: the builder ran out of memory")
    assert str(failure) == "out_of_memory: the builder ran out of memory"


def test_a_calibration_cache_survives_the_trip_out_of_the_child(tmp_path):
    from workers.backends.base import CompileResult
    from workers.backends.isolate import compile_result_json

    built = CompileResult(
        artifact=tmp_path / "engine.plan", calibration_cache=tmp_path / "calibration.cache"
    )

    back = compile_result_from_json(compile_result_json(built))

    assert back.calibration_cache == tmp_path / "calibration.cache"
    assert back.timing_cache is None


def child_says_where_it_runs():
    import sys

    return {
        "pid": os.getpid(),
        "session": os.getsid(0),
        "parent": os.getppid(),
        "preloaded": "onnxruntime" in sys.modules,
    }


def test_it_forks_each_child_from_a_warm_server_into_a_session_of_its_own():
    first = run_isolated(f"{HERE}.child_says_where_it_runs", {}, timeout=60)
    second = run_isolated(f"{HERE}.child_says_where_it_runs", {}, timeout=60)

    server = forkserver._server.process.pid
    assert first["parent"] == second["parent"] == server != os.getpid()
    assert first["pid"] != second["pid"]
    assert first["session"] == first["pid"] and second["session"] == second["pid"]
    assert first["preloaded"] and second["preloaded"]


def test_it_starts_a_new_server_when_the_old_one_died():
    run_isolated(f"{HERE}.child_doubles", {"x": 1}, timeout=60)
    old = forkserver._server.process
    old.kill()
    old.wait()

    assert run_isolated(f"{HERE}.child_doubles", {"x": 2}, timeout=60) == {"double": 4}
    assert forkserver._server.process.pid != old.pid


def test_the_server_exits_when_its_caller_closes_it():
    run_isolated(f"{HERE}.child_doubles", {"x": 1}, timeout=60)
    server = forkserver._server

    server.close()

    assert server.process.wait(timeout=10) is not None


def test_without_the_fork_server_each_child_is_a_fresh_python(monkeypatch):
    monkeypatch.setenv("DEPLOYHUB_FORK_SERVER", "0")

    ran = run_isolated(f"{HERE}.child_says_where_it_runs", {}, timeout=60)

    assert ran["parent"] == os.getpid() and ran["session"] == ran["pid"]
    assert not ran["preloaded"]


def child_outlives_its_server():
    time.sleep(1.5)
    return {"done": True}


def test_a_build_whose_fork_server_dies_meanwhile_still_returns_its_result():
    run_isolated(f"{HERE}.child_doubles", {"x": 1}, timeout=60)  # the server is warm
    server = forkserver._server.process
    killer = threading.Timer(0.5, server.kill)
    killer.start()

    result = run_isolated(f"{HERE}.child_outlives_its_server", {}, timeout=60)

    killer.join()
    assert result == {"done": True}
    assert run_isolated(f"{HERE}.child_doubles", {"x": 2}, timeout=60) == {"double": 4}
