"""Validate an uploaded model file in a child process, never in the web process itself.

Parsing a large or hostile protobuf can take as much memory as the file is
big, or crash the parser: a child process with a memory cap keeps the web
process small and alive. Run as `python -m deployhub.registry.validate KIND PATH
WORKDIR MEMORY_MB` with the kind's parameters as a JSON object on stdin
(max_total_bytes, and cap: the RatioCap's ratio and allowance); it prints one JSON
object: {"info": {...}} or {"error": "..."}.
"""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from deployhub.registry.inspect import InvalidModel

KINDS = ("onnx", "onnx-zip", "pt2")


def inspect_kind(kind, path, workdir, *, max_total_bytes, cap):
    """Validate a file of a known kind and describe it; raise InvalidModel with a reason."""
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


def validate_in_child(kind, path, workdir, *, params, memory_mb, timeout):
    """Run inspect_kind in a child process capped at memory_mb; return its info dict.

    params is JSON: max_total_bytes, and cap: {"ratio": ..., "allowance": ...}.
    """
    command = [
        sys.executable,
        "-m",
        "deployhub.registry.validate",
        kind,
        str(path),
        str(workdir),
        str(memory_mb),
    ]
    try:
        done = subprocess.run(
            command, input=json.dumps(params), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise InvalidModel(f"Validating the model took longer than {timeout} s.") from exc
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        reason = (
            "it ran out of memory"
            if done.returncode < 0 or "MemoryError" in done.stderr
            else f"it exited with code {done.returncode}"
        )
        raise InvalidModel(f"The model could not be validated: {reason}.") from exc
    if "error" in answer:
        raise InvalidModel(answer["error"])
    return answer["info"]


def main(argv):
    from deployhub.registry.archives import RatioCap

    kind, path, workdir, memory_mb = argv
    params = json.loads(sys.stdin.read())
    limit = int(memory_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        info = inspect_kind(
            kind,
            Path(path),
            Path(workdir),
            max_total_bytes=params["max_total_bytes"],
            cap=RatioCap(**params["cap"]),
        )
        print(json.dumps({"info": info}))
    except InvalidModel as exc:
        print(json.dumps({"error": str(exc)}))
    except MemoryError:
        print(json.dumps({"error": "The model needs more memory to validate than allowed."}))


if __name__ == "__main__":
    main(sys.argv[1:])
