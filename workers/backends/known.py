"""Every backend DeployHub knows, by name, and which of them can run on this machine.

BACKENDS lists every known backend whether or not its runtime is installed:
the hub computes compatibility keys with them and has no runtime at all. A
backend *runs* here only when its runtime imports, which `runnable()` lists
and `require()` checks before a job uses it.
"""

from workers.backends.base import Backend
from workers.backends.onnxruntime import OnnxRuntimeBackend
from workers.backends.openvino import OpenVinoBackend
from workers.backends.tensorrt import TensorRTBackend
from workers.backends.torch_aoti import TorchAotiBackend
from workers.errors import JobError

BACKENDS: dict[str, type[Backend]] = {}
# The backend a build uses when the request names none: it runs on every machine.
DEFAULT_BACKEND = OnnxRuntimeBackend.name


class UnknownBackend(JobError):
    """No backend of that name exists."""


class MissingRuntime(JobError):
    """The backend exists, but its runtime is not installed on this worker."""


def register(backend_cls):
    """Add a backend class under its name; raise ValueError when the name is taken."""
    if backend_cls.name in BACKENDS:
        taken = BACKENDS[backend_cls.name].__qualname__
        raise ValueError(f"a backend named {backend_cls.name!r} is registered already ({taken})")
    BACKENDS[backend_cls.name] = backend_cls
    return backend_cls


def get(name):
    """Return the backend class of that name; raise UnknownBackend for another name."""
    if name not in BACKENDS:
        raise UnknownBackend(f"there is no backend named {name!r}; known: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def require(name):
    """Return the backend class of that name; raise MissingRuntime when it cannot run here."""
    backend = get(name)
    if not backend.available():
        raise MissingRuntime(
            f"this worker has no {backend.runtime}: pip install deployhub[{backend.extra}]"
        )
    return backend


def runnable():
    """Return the names of the backends whose runtime imports on this machine."""
    return [name for name, backend in BACKENDS.items() if backend.available()]


for _backend in (OnnxRuntimeBackend, TensorRTBackend, OpenVinoBackend, TorchAotiBackend):
    register(_backend)
