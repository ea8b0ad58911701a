"""Run a build or a first load in a child process, and say why it failed.

Compilers crash: a segfault in TensorRT, an abort in ONNX Runtime, the kernel's
OOM killer. In a child process such a crash costs the build, not the worker.
`run_isolated` runs a top-level function in `python -m workers.backends.isolate`
under a time limit and returns its JSON result; any failure comes back as a
`CompileFailure` whose category (`classify`) tells the user what kind of
problem it is, naming the node when the runtime's message names one.

The child speaks JSON lines on its own copy of stdout ({"progress": [f, m]},
then {"result": ..} or {"error": ..}); everything else it or its libraries
print, native code included, goes to stderr, which is the failure's log.
"""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path

from workers.backends import forkserver
from workers.backends.base import CompileResult
from workers.errors import Cancelled, JobError, one_line

CATEGORIES = (
    "unsupported_operator",
    "shape_or_contract",
    "out_of_memory",
    "timeout",
    "runtime_missing",
    "internal",
)
# What runtimes print, by category. The last match in a log decides: the failure is
# the last thing said, and earlier lines are often warnings.
PATTERNS = {
    "out_of_memory": [
        r"out[ _-]?of[ _-]?memory",
        r"\bMemoryError\b",
        r"std::bad_alloc",
        r"cudaErrorMemoryAllocation",
        r"Failed to allocate memory",
        r"Cannot allocate memory",
        r"could not be allocated",
    ],
    "runtime_missing": [
        r"\bno CUDA GPU\b",
        r"No module named",
        r"cannot open shared object file",
        r"Failed to load library",
        r"Could not load library",
        r"undefined symbol",
        r"install deployhub\[",
        r"has no \w+ExecutionProvider",
        r"is not in available provider names",
        r"CUDA driver version is insufficient",
    ],
    "unsupported_operator": [
        r"Could not find an implementation for",
        r"\bNOT_IMPLEMENTED\b",
        r"UNSUPPORTED_NODE",
        r"No importer registered for op",
        r"No Op registered for",
        r"is not a registered function/op",
        r"Cannot create \S+ layer",
        r"does not support the following ONNX operations",
        r"Unsupported (?:operator|operation|op|layer|node)\b",
    ],
    "shape_or_contract": [
        r"ShapeInferenceError",
        r"TypeInferenceError",
        r"Type Error",
        r"\bINVALID_ARGUMENT\b",
        r"Got invalid dimensions for input",
        r"Invalid rank",
        r"Incompatible dimensions",
        r"(?:shape|dimension)s? mismatch",
        r"Invalid input name",
        r"Unexpected input data type",
        r"cannot reshape",
        r"optimization profile",
        r"\bValidationError\b",
    ],
}
# Where runtimes name the node they failed on (ONNX Runtime, TensorRT, OpenVINO).
NODE_PATTERNS = [
    r"Node \(([^)]+)\) Op \(",
    r"node with name '([^']+)'",
    r"node\. Name:'([^']+)'",
    r'In Node, \("([^"]+)"',
    r"in node \(([^)]+)\)",
    r"In node -?\d+ with name: (\S+) and operator",
    r'While parsing node number \d+ \[\w+ -> "([^"]+)"\]',
    r"Cannot create \S+ layer (\S+) id:",
    r"any implementation for node ([^\s)]+?)\.?(?:\)|\s|$)",
]
COMPILED = {
    category: [re.compile(pattern, re.IGNORECASE) for pattern in patterns]
    for category, patterns in PATTERNS.items()
}
COMPILED_NODES = [re.compile(pattern) for pattern in NODE_PATTERNS]
logger = logging.getLogger(__name__)
MODULE = "workers.backends.isolate"
ROOT = Path(__file__).resolve().parents[2]  # the folder holding the workers package
LOG_MAX_CHARS = 2_000_000
MESSAGE_MAX_CHARS = 300
POLL_SECONDS = 0.1


class CompileFailure(JobError):
    """A build or first load that failed in its child process, with its category and log."""

    def __init__(self, category, message, *, node=None, log=""):
        if message.startswith(f"{category}: "):  # the backend already classified it
            message = message[len(category) + 2 :]
        super().__init__(f"{category}: {message}")
        self.category, self.message, self.node, self.log = category, message, node, log


def classify(text, exit_code, timed_out):
    """Return (category, node or None) for a failed child from its log and exit code."""
    node = _last_match(COMPILED_NODES, text or "")
    if timed_out:
        return "timeout", node
    found = {
        category: position
        for category, patterns in COMPILED.items()
        if (position := _last_position(patterns, text or "")) is not None
    }
    if found:
        return max(found, key=found.get), node
    if exit_code == -signal.SIGKILL:
        return "out_of_memory", node  # killed by someone else than us: the OOM killer
    return "internal", node


def run_isolated(fn_path, kwargs, *, timeout, progress=None, should_stop=None):
    """Run fn_path(**kwargs) in a child process; return its result or raise CompileFailure.

    progress, when given, is passed to the function and called here as it
    reports; should_stop, when it returns True, kills the child and raises
    Cancelled. A JobError the function raises comes back as a JobError with its
    message when no category fits it: it is a refusal meant for the user.
    """
    request = {"function": fn_path, "kwargs": kwargs, "progress": progress is not None}
    child = _Child(request, progress)
    outcome = child.wait(timeout, should_stop)
    if outcome == "cancelled":
        raise Cancelled(f"stopped {fn_path}: the job was cancelled")
    exited_well = child.exit_code == 0 or getattr(child.process, "exit_lost", False)
    if outcome == "done" and exited_well and "result" in child.reply:
        return child.reply["result"]
    raise _failure(child, timeout, timed_out=outcome == "timed_out")


def compile_backend(
    backend,
    source,
    build_config,
    workdir,
    timing_cache=None,
    calibration=None,
    progress=None,
    model_io=None,
):
    """Compile with the named backend (in the child); return the CompileResult as JSON.

    model_io (the job's signature and contract) goes with the calibration data: the
    backends that calibrate feed it through workers/measure/feeds.py.
    """
    from workers.backends import known

    files = {"timing_cache": timing_cache, "calibration": calibration}
    # Only the files there are: a backend written before one of them need not accept it.
    extra = {name: Path(path) for name, path in files.items() if path}
    if calibration and model_io:
        extra["model_io"] = model_io
    started = time.monotonic()
    built = known.require(backend)().compile(
        Path(source), build_config, Path(workdir), progress=progress, **extra
    )
    return {**compile_result_json(built), "seconds": round(time.monotonic() - started, 3)}


def smoke_test(backend, artifact, build_config, source, model_io=None):
    """Load a built artifact and run one inference (in the child); return what ran.

    The feeds are synthetic (workers/measure/feeds.py), from model_io when the job has one,
    else from the source's declared inputs.
    """
    from workers.backends import known

    runner = known.require(backend)()
    feeds = smoke_feeds(source, model_io)
    started = time.monotonic()
    handle = runner.load(Path(artifact), build_config)
    loaded = time.monotonic()
    outputs = runner.infer(handle, feeds)
    return {
        "load_seconds": round(loaded - started, 3),
        "infer_seconds": round(time.monotonic() - loaded, 3),
        "fed": "synthetic inputs",
        "inputs": {name: list(array.shape) for name, array in feeds.items()},
        "outputs": [list(getattr(output, "shape", ())) for output in outputs],
    }


def smoke_feeds(source, model_io=None):
    """Return the synthetic feeds of a smoke test, at the model's default batch; a symbolic
    axis without a range in the contract is fed at size 1."""
    from workers.measure import feeds

    if not model_io and Path(source).suffix == ".pt2":
        from workers.backends.torch_aoti import input_metas_from_pt2

        model_io = input_metas_from_pt2(source)
    return feeds.synthetic_feeds(model_io or feeds.model_io_from_onnx(source), unsized=1)


def compile_result_json(built):
    """Return a CompileResult as JSON-able values (paths as strings)."""
    data = asdict(built)
    data["artifact"] = str(built.artifact)
    for name in ("timing_cache", "calibration_cache"):
        path = getattr(built, name)
        data[name] = str(path) if path else None
    return data


def compile_result_from_json(data):
    """Return the CompileResult compile_result_json wrote (extra keys ignored)."""
    return CompileResult(
        artifact=Path(data["artifact"]),
        timing_cache=Path(data["timing_cache"]) if data.get("timing_cache") else None,
        calibration_cache=(
            Path(data["calibration_cache"]) if data.get("calibration_cache") else None
        ),
        log=data.get("log") or "",
        tool_versions=data.get("tool_versions") or {},
        graph_report=data.get("graph_report"),
    )


class _Child:
    """One child process: its request, its replies on stdout and its log on stderr."""

    def __init__(self, request, progress):
        self.progress = progress
        self.reply = {}
        self.exit_code = None
        self._log, self._log_chars, self._cut = [], 0, 0
        self.process = _start(_child_env())
        self._readers = [
            threading.Thread(target=self._read_replies, daemon=True),
            threading.Thread(target=self._read_log, daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self._send(request)

    def wait(self, timeout, should_stop):
        """Wait for the child; return "done", "timed_out" or "cancelled" (killed then)."""
        deadline = time.monotonic() + timeout
        outcome = "done"
        while self.process.poll() is None:
            if should_stop is not None and should_stop():
                outcome = "cancelled"
            elif time.monotonic() >= deadline:
                outcome = "timed_out"
            else:
                time.sleep(POLL_SECONDS)
                continue
            break
        self._kill()  # also ends what a finished child left running, holding its pipes
        self.exit_code = self.process.wait()
        for reader in self._readers:
            reader.join()
        self.process.stdout.close()
        self.process.stderr.close()
        return outcome

    def log(self):
        """Return what the child wrote to stderr (its head cut when it was very long)."""
        text = "".join(self._log)
        return f"[{self._cut} characters cut]\n{text}" if self._cut else text

    def _send(self, request):
        """Write the request to the child's stdin and close it."""
        try:
            self.process.stdin.write(json.dumps(request).encode())
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # the child died at start; its exit code and log say why

    def _kill(self):
        """Kill the child's process group (the child and anything it started)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            if self.process.poll() is None:  # forked a moment ago: not yet leading its group
                with suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGKILL)

    def _read_replies(self):
        """Read the child's JSON lines: forward progress, keep the result or error."""
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "progress" in message:
                self._report(*message["progress"])
            else:
                self.reply.update(message)

    def _report(self, fraction, message):
        """Pass a progress report on; a failing callback must not stop the reading."""
        if self.progress is None:
            return
        try:
            self.progress(fraction, message)
        except Exception:
            logger.exception("progress callback failed")

    def _read_log(self):
        """Keep the child's stderr, dropping its oldest text past LOG_MAX_CHARS."""
        for line in self.process.stderr:
            text = line.decode(errors="replace")
            self._log.append(text)
            self._log_chars += len(text)
            while self._log_chars > LOG_MAX_CHARS and len(self._log) > 1:
                dropped = self._log.pop(0)
                self._log_chars -= len(dropped)
                self._cut += len(dropped)


def _failure(child, timeout, timed_out):
    """Return the CompileFailure (or JobError) that says how the child failed."""
    log, error = child.log(), child.reply.get("error")
    message = _message(error, log, child.exit_code, timed_out, timeout)
    category, node = classify(f"{log}\n{message}", child.exit_code, timed_out)
    if error and error.get("job_error") and category == "internal":
        return JobError(message)
    if node and node not in message:
        message = f"{message} (node {node})"
    return CompileFailure(category, message, node=node, log=log)


def _message(error, log, exit_code, timed_out, timeout):
    """Return one line saying what went wrong."""
    if timed_out:
        return f"no result within {timeout:g} s, so the child process was killed"
    if error:
        text = (
            error["message"] if error.get("job_error") else f"{error['type']}: {error['message']}"
        )
        return one_line(text)  # ONNX Runtime's indices follow its first line
    if exit_code is not None and exit_code < 0:
        return f"the child process crashed: {_signal_name(-exit_code)}"
    last = _first_line(log.strip().splitlines()[-1]) if log.strip() else ""
    return f"the child process exited with code {exit_code}" + (f": {last}" if last else "")


def _signal_name(number):
    """Return a signal as "SIGSEGV (Segmentation fault)", or its number when unknown."""
    try:
        return f"{signal.Signals(number).name} ({signal.strsignal(number)})"
    except ValueError:
        return f"signal {number}"


def _first_line(text):
    """Return the first non-empty line of text, shortened to MESSAGE_MAX_CHARS."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return (lines[0] if lines else "")[:MESSAGE_MAX_CHARS]


def _last_position(patterns, text):
    """Return where the last match of any pattern starts in text, None without one."""
    ends = [match.start() for pattern in patterns for match in pattern.finditer(text)]
    return max(ends) if ends else None


def _last_match(patterns, text):
    """Return the first group of the match of any pattern that starts last in text."""
    matches = [match for pattern in patterns for match in pattern.finditer(text)]
    return max(matches, key=lambda match: match.start()).group(1) if matches else None


def _start(env):
    """Start a child running this module: forked from the warm fork server where it can be,
    else a fresh Python."""
    if forkserver.enabled():
        try:
            return forkserver.start_child(env)
        except OSError as error:
            logger.warning("starting a fresh Python for the build: %s", error)
    return subprocess.Popen(
        [sys.executable, "-m", MODULE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own process group: a kill reaches its children
    )


def _child_env():
    """Return the child's environment: this one, with the workers package importable."""
    env = dict(os.environ)
    paths = [str(ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env


def _import(dotted):
    """Return the function at a dotted path ("workers.backends.isolate.smoke_test")."""
    import importlib

    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def main():
    """Run one request from stdin in this (child) process; answer on the original stdout.

    Return the exit code: 0 with a result, 1 with an error.
    """
    import faulthandler

    from workers.isolation import keep_django_out

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what libraries print, native code included, joins the log on stderr
    faulthandler.enable()  # a segfault or abort prints the Python stack to the log
    keep_django_out()
    request = json.loads(sys.stdin.read())
    kwargs = dict(request["kwargs"])
    if request.get("progress"):
        kwargs["progress"] = _progress_to(replies)
    try:
        line = json.dumps({"result": _import(request["function"])(**kwargs)})
    except BaseException as error:  # every failure goes back, MemoryError included
        traceback.print_exc()
        _reply(replies, {"error": _error_json(error)})
        return 1
    replies.write(line + "\n")
    replies.flush()
    return 0


def _progress_to(replies):
    """Return a progress callback that sends each report to the parent."""

    def report(fraction, message):
        _reply(replies, {"progress": [fraction, message]})

    return report


def _reply(replies, message):
    """Write one JSON line to the parent."""
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def _error_json(error):
    """Return an exception as the parent reads it."""
    return {
        "type": type(error).__name__,
        "message": str(error),
        "job_error": isinstance(error, JobError),
    }


if __name__ == "__main__":
    forkserver.exit_now(main())
