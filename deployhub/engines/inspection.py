"""Is an uploaded engine what its backend builds? Asked before the hub signs it.

A device uploads its build's bytes; the hub signs only a file its backend's
check accepts (workers/backends/artifacts.py: an ONNX file parses, an IR is
XML, a plan has TensorRT's header, a package is a PT2 archive). The check runs
in a child process with a memory cap, as uploaded models are validated: a
hostile file cannot take the web process's memory.
"""

import json
import subprocess
import sys

from django.conf import settings

from deployhub.core.store import local_copy


def artifact_problem(backend, stored_name):
    """Say why the stored file is not an engine of the backend ("" when it is one)."""
    with local_copy(stored_name) as path:
        command = [
            sys.executable,
            "-m",
            "workers.backends.artifacts",
            backend,
            str(path),
            str(settings.DEPLOYHUB_VALIDATION_MEMORY_MB),
        ]
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=settings.DEPLOYHUB_VALIDATION_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            return f"checking it took longer than {settings.DEPLOYHUB_VALIDATION_TIMEOUT} s"
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])["problem"]
    except (IndexError, KeyError, json.JSONDecodeError):
        return f"the check could not read it (exit code {done.returncode})"
