"""Describe this device's hardware and toolchain (its fingerprint).

The hub keys compiled engines on these fields, so a field that cannot be read
is reported as None, never guessed.
"""

import copy
import json
import os
import platform
import socket
from pathlib import Path

import psutil

SCHEMA = 1
CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
CPUINFO = Path("/proc/cpuinfo")


def collect():
    """Return this device's fingerprint as a JSON-able dict."""
    return {
        "schema": SCHEMA,
        "os": _os(),
        "python": platform.python_version(),
        "hostname": socket.gethostname() or None,
        "cpu": _cpu(),
        "memory_mb": psutil.virtual_memory().total // 2**20,
        "onnxruntime": _onnxruntime(),
    }


def load_override(path, fingerprint=None):
    """Return the fingerprint (collected when not given) with a JSON file merged over it.

    The override lets tests pretend to be another device and lets an operator
    rehearse a driver or runtime upgrade before doing it.
    """
    override = json.loads(Path(path).read_text())
    if not isinstance(override, dict):
        raise ValueError(f"fingerprint override {path} must hold a JSON object")
    return deep_merge(collect() if fingerprint is None else fingerprint, override)


def deep_merge(base, override):
    """Return a copy of base with override merged in, dict by dict."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _os():
    """Return the operating system's name, release and machine type."""
    return {
        "system": platform.system() or None,
        "release": platform.release() or None,
        "machine": platform.machine() or None,
    }


def _cpu():
    """Return the CPU model, logical core count and the ISA flags we care about."""
    info = _cpuinfo_fields()
    flags = info.get("flags")
    return {
        "model": info.get("model name") or platform.processor() or None,
        "count": os.cpu_count(),
        "flags": None if flags is None else [f for f in CPU_FLAGS if f in flags.split()],
    }


def _cpuinfo_fields():
    """Return the fields of the first processor in /proc/cpuinfo ({} if unreadable)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def _onnxruntime():
    """Return ONNX Runtime's version and execution providers, or None if absent."""
    try:
        import onnxruntime
    except (ImportError, OSError):
        return None
    return {
        "version": onnxruntime.__version__,
        "providers": onnxruntime.get_available_providers(),
    }
