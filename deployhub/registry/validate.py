"""Parse uploaded files in a child process with a memory cap, never in the web process itself.

Parsing a large or hostile file (a protobuf, an .npz, a zip of images) can take
as much memory as the file declares, or crash the parser: a child process with
a memory cap keeps the web process small and alive, and the web process gets
back only a small JSON description. Run as `python -m deployhub.registry.validate
KIND PATH WORKDIR MEMORY_MB` with the kind's parameters as a JSON object on
stdin; it prints one JSON object: {"info": {...}} or {"error": "..."}. Kinds: the
model formats (onnx, onnx-zip, pt2), "dataset" and "golden". An app above the
registry serves its own kinds from its own module with `serve` (parity packs:
deployhub/parity/packs.py). Every kind gets max_total_bytes and the RatioCap
(cap: ratio and allowance) every archive unpacks under.
"""

import json
import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

from deployhub.registry.inspect import InvalidModel

logger = logging.getLogger(__name__)
MODEL_KINDS = ("onnx", "onnx-zip", "pt2")
# The checks do no linear algebra: one thread each, so no thread pool's buffers eat the cap.
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
# What each kind reads, for the messages: "Reading the dataset took longer than ...".
WHAT = {"dataset": "the dataset", "golden": "the golden set", "parity-pack": "the parity pack"}


def inspect_model(kind, path, workdir, *, max_total_bytes, cap):
    """Validate a model file of a known kind and describe it; raise InvalidModel with a reason."""
    from deployhub.registry.archives import find_single_onnx, inspect_pt2, safe_extract_zip
    from deployhub.registry.inspect import inspect_onnx

    if kind == "onnx":
        # Inspect a private link to the upload: external data must not resolve to other uploads.
        private = workdir / "model.onnx"
        os.link(path, private)
        return inspect_onnx(private)
    if kind == "onnx-zip":
        safe_extract_zip(path, workdir / "zip", max_total_bytes=max_total_bytes, cap=cap)
        return {**inspect_onnx(find_single_onnx(workdir / "zip")), "format": kind}
    return inspect_pt2(path, workdir, max_total_bytes=max_total_bytes, cap=cap)


def _model(kind):
    def check(path, workdir, params, cap):
        return inspect_model(
            kind, path, workdir, max_total_bytes=params["max_total_bytes"], cap=cap
        )

    return check


def _dataset(path, workdir, params, cap):
    from deployhub.registry.datasets import read_dataset

    return read_dataset(path, workdir, params, cap=cap)


def _golden(path, workdir, params, cap):
    from deployhub.registry.golden_pairs import read_golden_pairs

    return read_golden_pairs(path, workdir, params, cap=cap)


CHECKS = {**{kind: _model(kind) for kind in MODEL_KINDS}, "dataset": _dataset, "golden": _golden}


def validate_in_child(
    kind, path, workdir, *, params, memory_mb, timeout, refusal=InvalidModel, module=None
):
    """Run a kind's check of a file in a child process capped at memory_mb; return its answer.

    module serves the kind (`python -m module`; this one by default); a refusal, a timeout
    or a child that runs out of memory raises `refusal` with the reason.
    """
    what = WHAT.get(kind, "the model")
    command = [sys.executable, "-m", module or __name__, kind, str(path), str(workdir)]
    command.append(str(memory_mb))
    try:
        done = subprocess.run(
            command,
            input=json.dumps(params),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **ONE_THREAD},
        )
    except subprocess.TimeoutExpired as exc:
        raise refusal(f"Reading {what} took longer than {timeout} s; refused.") from exc
    answer = _answer(done, path, kind, refusal, memory_mb)
    if "error" in answer:
        raise refusal(answer["error"])
    return answer["info"]


def _answer(done, path, kind, refusal, memory_mb):
    """Return the child's JSON answer; a child that died without one is a refusal, logged."""
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        stderr = done.stderr[-2000:]
        logger.warning(
            "Reading %s (%s) ended with code %s: %s", path, kind, done.returncode, stderr
        )
        what = WHAT.get(kind, "the model")
        if done.returncode < 0 or "MemoryError" in done.stderr:
            raise refusal(out_of_memory(what, memory_mb)) from exc
        raise refusal(
            f"{what.capitalize()} could not be read: the check exited with code {done.returncode}."
        ) from exc


def out_of_memory(what, memory_mb):
    return (
        f"Reading {what} needs more memory than the {int(memory_mb):,} MB an upload may take "
        "to check; refused."
    )


def serve(checks, argv):
    """Run one check in this (child) process under the memory cap and print its JSON answer.

    argv is KIND PATH WORKDIR MEMORY_MB; the parameters come as JSON on stdin. A
    ValueError is a refusal (every refusal of the checks is one): its message is
    the answer.
    """
    from deployhub.registry.archives import RatioCap

    kind, path, workdir, memory_mb = argv
    params = json.loads(sys.stdin.read())
    limit = int(memory_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        info = checks[kind](Path(path), Path(workdir), params, RatioCap(**params["cap"]))
        print(json.dumps({"info": info}))
    except ValueError as exc:
        print(json.dumps({"error": str(exc)}))
    except MemoryError:
        print(json.dumps({"error": out_of_memory(WHAT.get(kind, "the model"), memory_mb)}))


if __name__ == "__main__":
    serve(CHECKS, sys.argv[1:])
