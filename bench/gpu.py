#!/usr/bin/env python
"""make bench-gpu: ResNet-50 on an NVIDIA GPU, PyTorch eager FP32 against the best build.

At batch 1 and 8, side by side in one run: PyTorch eager FP32 (the baseline),
eager FP16, FP16 CUDA-graph replay of eager, `torch.compile` FP16, and the
builds DeployHub's own backends make (AOTInductor FP16 from a torch.export
program; TensorRT FP16 when `tensorrt` imports; ONNX Runtime CUDA when its
provider is installed). Every build compiles and first loads in a child
process (workers/backends/isolate.py), so one that crashes (AOTInductor on
ResNet-50 segfaults on an H200 with torch 2.11) is reported as a classified
failure and the others are still ranked.

Rows: the best build's speed-up over eager FP32 at each batch size (targets
from figures measured on an H200: eager FP32 4.1 ms, FP16 CUDA-graph replay
0.88 ms at batch 1), its top-1 agreement with eager FP32 on random inputs, and
each build's latency for context. Torch-native candidates are timed on inputs
already on the GPU; DeployHub's builds are timed through their backends'
`infer`, which takes and returns host arrays, so their figures include the
host-device copies (about 0.6 MB in at batch 1). Weights are random (seeded):
the model is for latency only.

Without a CUDA GPU it says so, writes a NOT RUN row and exits 0. Rows go to
bench/results.json beside `make bench`'s (bench "bench_gpu").
"""

import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rows import note, print_rows, row, write_results  # noqa: E402

BENCH = "bench_gpu"
BATCH_SIZES = (1, 8)
SPEEDUP_TARGETS = {1: 4.0, 8: 3.0}  # best build vs eager FP32
AGREEMENT_TARGET = 0.99
AGREEMENT_SAMPLES = 64
ROUNDS, ROUND_SECONDS, WARMUP_SECONDS = 5, 1.0, 2.0
BUILD_TIMEOUT = 900  # seconds per child build: AOTInductor on ResNet-50 takes minutes
SEED = 20240618
IMAGE_SIZE = 224


def resnet50():
    """Return ResNet-50 as torchvision defines it (Bottleneck, [3, 4, 6, 3]), random weights."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, in_channels, channels, stride):
            super().__init__()
            out = channels * 4
            self.body = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, bias=False),
                nn.BatchNorm2d(channels),
                nn.ReLU(inplace=True),
                nn.Conv2d(channels, channels, 3, stride, padding=1, bias=False),
                nn.BatchNorm2d(channels),
                nn.ReLU(inplace=True),
                nn.Conv2d(channels, out, 1, bias=False),
                nn.BatchNorm2d(out),
            )
            self.downsample = None
            if stride != 1 or in_channels != out:
                self.downsample = nn.Sequential(
                    nn.Conv2d(in_channels, out, 1, stride, bias=False), nn.BatchNorm2d(out)
                )
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(self.body(x) + identity)

    def stage(in_channels, channels, blocks, stride):
        layers = [Bottleneck(in_channels, channels, stride)]
        layers += [Bottleneck(channels * 4, channels, 1) for _ in range(blocks - 1)]
        return nn.Sequential(*layers)

    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, padding=1),
        stage(64, 64, 3, 1),
        stage(256, 128, 4, 2),
        stage(512, 256, 6, 2),
        stage(1024, 512, 3, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2048, 1000),
    )
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    return _with_batchnorm_statistics(model)


def _with_batchnorm_statistics(model):
    """Set every BatchNorm's statistics from one batch of random images; return it in eval."""
    import torch
    from torch import nn

    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for norm in norms:
        norm.momentum = None  # a cumulative average: one batch gives its own statistics
    model.train()
    with torch.no_grad():
        model(random_images(8, SEED + 1))
    return model.eval()


def random_images(count, seed, size=IMAGE_SIZE):
    """Return count random-normal float32 images on the CPU."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, size, size, generator=generator)


class Candidate:
    """One way of running the model: how to prepare it for a batch size, and its name."""

    def __init__(self, name, prepare):
        self.name, self.prepare = name, prepare
        self.failure = None  # the reason it could not run, once it failed


def torch_candidates(model):
    """Eager FP32 and FP16, FP16 CUDA-graph replay and torch.compile FP16, on device inputs."""
    import torch

    fp32 = model.cuda()
    fp16 = _half_copy(model)

    def eager(net, dtype):
        return lambda x: net(x.to(dtype))

    def compiled(batch):
        net = torch.compile(fp16)
        return lambda x: net(x.half())

    return [
        Candidate("eager fp32", lambda batch: eager(fp32, torch.float32)),
        Candidate("eager fp16", lambda batch: eager(fp16, torch.float16)),
        Candidate("eager fp16 cuda-graph", lambda batch: _cuda_graph(fp16, batch)),
        Candidate("torch.compile fp16", compiled),
    ]


def _half_copy(model):
    import copy

    return copy.deepcopy(model).half().cuda().eval()


def _cuda_graph(net, batch):
    """Capture one FP16 forward pass as a CUDA graph; return a runner that replays it."""
    import torch

    static_in = torch.zeros(batch, 3, IMAGE_SIZE, IMAGE_SIZE, device="cuda", dtype=torch.half)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up on a side stream, as capture requires
            net(static_in)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = net(static_in)

    def replay(x):
        static_in.copy_(x)
        graph.replay()
        return static_out

    return replay


def backend_candidates(model, work):
    """DeployHub's builds: AOTInductor FP16, TensorRT FP16, ONNX Runtime CUDA (when present)."""
    import importlib.util

    candidates = [Candidate("aoti fp16", lambda b: _aoti(model, work, b))]
    if importlib.util.find_spec("tensorrt"):
        candidates.append(Candidate("tensorrt fp16", lambda b: _tensorrt(model, work, b)))
    if _ort_has_cuda():
        candidates.append(Candidate("onnxruntime cuda fp32", lambda b: _ort_cuda(model, work, b)))
    return candidates


def _aoti(model, work, batch):
    import torch

    source = work / f"resnet50-b{batch}.pt2"
    if not source.exists():
        program = torch.export.export(model.cpu().float(), (random_images(batch, 0),))
        torch.export.save(program, str(source))
        model.cuda()
    config = {"device": "cuda", "precision": "fp16"}
    return _built_runner("torch-aoti", source, config, work / f"aoti-b{batch}")


def _tensorrt(model, work, batch):
    config = {"precision": "fp16"}
    return _built_runner("tensorrt", _onnx(model, work, batch), config, work / f"trt-b{batch}")


def _ort_cuda(model, work, batch):
    import onnxruntime

    session = onnxruntime.InferenceSession(
        str(_onnx(model, work, batch)), providers=["CUDAExecutionProvider"]
    )
    return lambda x: session.run(None, {"image": x.cpu().numpy()})


def _ort_has_cuda():
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def _onnx(model, work, batch):
    """Export the model at a fixed batch size (no profiles needed) once; return the file."""
    import torch

    path = work / f"resnet50-b{batch}.onnx"
    if not path.exists():
        example = random_images(batch, 0).cuda()
        torch.onnx.export(
            model, (example,), str(path), dynamo=False, opset_version=17,
            input_names=["image"], output_names=["logits"],
        )  # fmt: skip
    return path


def _built_runner(backend_name, source, config, folder):
    """Build and smoke-test in child processes (a crash is classified), then load here."""
    from workers.backends.isolate import (
        compile_result_from_json,
        run_isolated,
    )
    from workers.backends.known import require

    folder = Path(folder) / backend_name
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {"backend": backend_name, "source": str(source), "build_config": config}
    answer = run_isolated(
        "workers.backends.isolate.compile_backend",
        kwargs | {"workdir": str(folder)},
        timeout=BUILD_TIMEOUT,
    )
    built = compile_result_from_json(answer)
    run_isolated(
        "workers.backends.isolate.smoke_test",
        kwargs | {"artifact": str(built.artifact)},
        timeout=BUILD_TIMEOUT,
    )
    backend = require(backend_name)()
    handle = backend.load(built.artifact, config)
    return lambda x: backend.infer(handle, {"image": x.cpu().numpy()})


def prepare_all(candidates, batch):
    """Return {name: runner} of the candidates that prepare; record why the others do not."""
    runners = {}
    for candidate in candidates:
        if candidate.failure:
            continue
        try:
            runners[candidate.name] = candidate.prepare(batch)
        except Exception as exc:  # noqa: BLE001 - each failure is reported, the rest still run
            candidate.failure = _describe_failure(exc)
            print(f"bench-gpu: {candidate.name} at batch {batch} failed: {candidate.failure}")
    return runners


def _describe_failure(exc):
    from workers.backends.isolate import CompileFailure

    if isinstance(exc, CompileFailure):
        return f"{exc.category}: {exc.message.splitlines()[0][:160]}"
    return "".join(traceback.format_exception_only(exc)).strip().splitlines()[-1][:200]


def _synchronize(device):
    """Return what waits for the device's queued work (nothing to wait for on the CPU)."""
    import torch

    return torch.cuda.synchronize if device == "cuda" else lambda: None


def drop_failing(candidates, runners, x):
    """Run each runner once (torch.compile compiles then); drop and record the ones that fail."""
    import torch

    by_name = {candidate.name: candidate for candidate in candidates}
    for name, run in list(runners.items()):
        try:
            with torch.inference_mode():
                run(x)
        except Exception as exc:  # noqa: BLE001 - reported as the candidate's failure
            by_name[name].failure = _describe_failure(exc)
            print(f"bench-gpu: {name} failed on its first run: {by_name[name].failure}")
            del runners[name]
    return runners


def time_side_by_side(runners, x, device="cuda"):
    """Time the runners in turn, round after round; return each one's best round median in ms."""
    import torch

    synchronize = _synchronize(device)

    def timed(run):
        synchronize()
        started = time.perf_counter()
        run(x)
        synchronize()
        return time.perf_counter() - started

    counts = {}
    for name, run in runners.items():
        started, done = time.perf_counter(), 0
        while time.perf_counter() - started < WARMUP_SECONDS / len(runners) or done < 10:
            timed(run)
            done += 1
        counts[name] = max(10, int(done * ROUND_SECONDS / (time.perf_counter() - started)))
    medians = {name: [] for name in runners}
    with torch.inference_mode():
        for _ in range(ROUNDS):
            for name, run in runners.items():
                samples = [timed(run) for _ in range(counts[name])]
                medians[name].append(statistics.median(samples))
    return {name: min(values) * 1000 for name, values in medians.items()}


def top1(run, images, batch, device="cuda"):
    """Return the top-1 classes run gives on the images, batch by batch."""
    import torch

    classes = []
    with torch.inference_mode():
        for start in range(0, len(images), batch):
            out = run(images[start : start + batch].to(device))
            out = out[0] if isinstance(out, list | tuple) else out
            classes.append(torch.as_tensor(out).float().argmax(dim=1).cpu())
    return torch.cat(classes)


def measure(candidates, batch, images, device="cuda"):
    """Return the rows for one batch size."""
    x = random_images(batch, SEED + 2, images.shape[-1]).to(device)
    runners = drop_failing(candidates, prepare_all(candidates, batch), x)
    if "eager fp32" not in runners:
        return [note(f"resnet50 b{batch}", None, "ms", "NOT RUN", "eager FP32 did not run")]
    timings = time_side_by_side(runners, x, device)
    reference = top1(runners["eager fp32"], images, batch, device)
    rows = [note(f"resnet50 b{batch} {name}", ms, "ms", "INFO") for name, ms in timings.items()]
    best = min((n for n in timings if n != "eager fp32"), key=timings.get, default=None)
    if best is None:
        return rows
    speedup = timings["eager fp32"] / timings[best]
    agreement = float((top1(runners[best], images, batch, device) == reference).float().mean())
    rows.append(row(f"resnet50 b{batch} best ({best}) vs eager fp32", speedup, "x",
                    SPEEDUP_TARGETS[batch], lower_is_better=False))  # fmt: skip
    rows.append(row(f"resnet50 b{batch} {best} top-1 agreement", agreement, "",
                    AGREEMENT_TARGET, lower_is_better=False))  # fmt: skip
    return rows


def failure_rows(candidates):
    return [
        note(f"resnet50 {c.name}", None, "", "FAILED", c.failure) for c in candidates if c.failure
    ]


def gpu_facts():
    import torch

    properties = torch.cuda.get_device_properties(0)
    return {
        "gpu": properties.name,
        "compute_capability": f"{properties.major}.{properties.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def main():
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        reason = "torch is not installed" if torch is None else "torch sees no CUDA GPU"
        print(f"bench-gpu: nothing measured: {reason}. Run it on a machine with an NVIDIA GPU.")
        rows = [{**note("resnet50 on the GPU", None, "", "NOT RUN", reason), "bench": BENCH}]
        print_rows(rows)
        write_results(rows)
        return
    torch.backends.cudnn.benchmark = True
    model = resnet50()
    images = random_images(AGREEMENT_SAMPLES, SEED + 3)
    with tempfile.TemporaryDirectory(prefix="deployhub-bench-gpu-") as folder:
        candidates = torch_candidates(model) + backend_candidates(model, Path(folder))
        rows = [r for batch in BATCH_SIZES for r in measure(candidates, batch, images)]
        rows += failure_rows(candidates)
    rows = [{**r, "bench": BENCH} for r in rows]
    print_rows(rows)
    write_results(rows, machine_extra=gpu_facts())


if __name__ == "__main__":
    main()
