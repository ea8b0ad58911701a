"""Loading a job's model and engine inputs, shared by the kinds that run them."""

import zipfile

from workers.backends import known
from workers.errors import JobError
from workers.kinds import ENGINE_INPUT, MODEL_INPUT, is_engine_input


def harness_runs(engine):
    """True when the harness runs this engine in its own ONNX Runtime session (an ONNX file)."""
    backend = known.BACKENDS.get(engine.get("backend"))
    return backend is not None and backend.harness_runs_engine


class LoadedEngine:
    """Another backend's engine, run by the benchmark harness like an ONNX Runtime session."""

    def __init__(self, backend, handle, input_metas):
        self.backend, self.handle, self.input_metas = backend, handle, input_metas
        # Tells the harness to read the GPU's state (NVML) and device memory around the run.
        self.on_cuda = backend.needs_gpu or getattr(handle, "device", None) == "cuda"

    def run(self, _output_names, feeds):
        return self.backend.infer(self.handle, feeds)

    def get_inputs(self):
        return self.input_metas

    def get_providers(self):
        return [self.backend.name]


def load_engine(job_run, inputs, engine, path=None):
    """Load an engine (the input `engine`, or path) with its backend; input names and
    shapes come from the source model."""
    import onnxruntime

    if MODEL_INPUT not in inputs:
        raise JobError(f"a {engine['backend']} engine job needs the source model as input 'model'")
    if inputs[MODEL_INPUT].suffix == ".pt2":  # a torch.export program (AOTInductor's source)
        from workers.backends.torch_aoti import input_metas_from_pt2

        metas = input_metas_from_pt2(inputs[MODEL_INPUT])
    else:
        source = onnx_model_path(inputs[MODEL_INPUT], job_run.workdir / "source")
        session = onnxruntime.InferenceSession(str(source), providers=["CPUExecutionProvider"])
        metas = session.get_inputs()
    backend = known.require(engine["backend"])()
    handle = backend.load(path or inputs[ENGINE_INPUT], engine.get("build_config") or {})
    job_run.log.add(f"{backend.name} engine loaded ({getattr(handle, 'source', 'engine')})")
    return LoadedEngine(backend, handle, metas)


def check_engines(job_run):
    """Refuse, before downloading, an engine this worker cannot run."""
    for name, engine in (job_run.job.get("inputs") or {}).items():
        if is_engine_input(name):
            known.require(engine.get("backend"))


def onnx_model_path(path, folder):
    """Return the ONNX file to load: the input itself, or the one inside an uploaded zip.

    An ONNX model with external data arrives as the zip it was uploaded in. The hub
    validated that zip member by member, and the download matched its sha256.
    """
    if path.suffix != ".zip":
        return path
    with zipfile.ZipFile(path) as archive:
        archive.extractall(folder)
    models = sorted(folder.rglob("*.onnx"))
    if len(models) != 1:
        raise JobError(f"the model zip should hold one .onnx file, it holds {len(models)}")
    return models[0]
