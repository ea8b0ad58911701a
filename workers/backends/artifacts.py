"""Is this file what a backend builds? Format checks of an engine's bytes that load nothing.

The hub runs them before it signs an engine a device uploaded: bytes that are
not the backend's artifact at all (a script, another format, an archive that
reaches outside itself) fail the build. A format check cannot prove a build
honest: a TensorRT plan is opaque past its header and an AOTInductor package
carries native code by design. The trust boundary is the device class: an
engine serves its own class, and another only when an admin said so.
Nothing here deserialises into a runtime; ONNX files are parsed as protobuf
only, OpenVINO IR as XML. Run as `python -m workers.backends.artifacts BACKEND
PATH MEMORY_MB` it prints {"problem": "..."} ("" when the file is sound) from a
process capped at MEMORY_MB, as the hub runs it.
"""

import json
import resource
import sys
import zipfile
from pathlib import PurePosixPath
from xml.etree import ElementTree

MAX_RATIO = 200  # an engine archive is stored uncompressed; a larger ratio is a bomb


def zip_problem(path, required=(), allowed=None):
    """Say what is wrong with a zip archive ("" when nothing): names, members, sizes."""
    if not zipfile.is_zipfile(path):
        return "it is not a zip archive"
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            names = [member.filename for member in members]
            for member in members:
                if problem := _member_problem(member, allowed):
                    return problem
            missing = [name for name in required if name not in names]
            if missing:
                return f"it lacks {', '.join(missing)}"
            if archive.testzip() is not None:
                return "a member's checksum does not match"
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        return f"it is not a readable zip archive ({exc})"
    return ""


def _member_problem(member, allowed):
    name = PurePosixPath(member.filename)
    if name.is_absolute() or ".." in name.parts or "\\" in member.filename:
        return f"member {member.filename!r} points outside the archive"
    if member.external_attr >> 28 == 0o12:
        return f"member {member.filename!r} is a link"
    if allowed is not None and member.filename not in allowed:
        return f"member {member.filename!r} is not one this backend writes"
    if member.compress_size and member.file_size > MAX_RATIO * member.compress_size:
        return f"member {member.filename!r} unpacks {member.file_size // member.compress_size}×"
    return ""


def onnx_problem(data, weights=()):
    """Say what is wrong with bytes meant to be an ONNX model ("" when they parse as one).

    External weights may only be in the files named in weights (beside it in its archive).
    """
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        return f"it does not parse as an ONNX model ({exc.__class__.__name__})"
    if not model.graph.node or not model.graph.output:
        return "it parses, but as an ONNX model with no graph"
    for tensor in model.graph.initializer:
        location = next((e.value for e in tensor.external_data if e.key == "location"), None)
        if location is not None and location not in weights:
            return f"its tensor {tensor.name!r} points at weights outside it ({location!r})"
    return ""


def onnx_in_zip_problem(path, model_name, allowed):
    """Check an archive of an ONNX model and its external weights."""
    if problem := zip_problem(path, required=(model_name,), allowed=allowed):
        return problem
    with zipfile.ZipFile(path) as archive:
        return onnx_problem(archive.read(model_name), weights=allowed)


def ir_problem(path, xml_name, required, allowed):
    """Check an archive holding an OpenVINO IR: its XML must be a <net> with layers."""
    if problem := zip_problem(path, required=required, allowed=allowed):
        return problem
    with zipfile.ZipFile(path) as archive:
        try:
            root = ElementTree.fromstring(archive.read(xml_name))
        except ElementTree.ParseError as exc:
            return f"{xml_name} is not XML ({exc})"
    if root.tag != "net" or root.find("layers") is None:
        return f"{xml_name} is XML but not an OpenVINO IR (no <net> with <layers>)"
    return ""


def pt2_package_problem(path, aoti_dir, format_file, format_value):
    """Check an AOTInductor package: a PT2 archive that carries compiled AOTInductor code."""
    if problem := zip_problem(path):
        return problem
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        root = names[0].split("/")[0] if names else ""
        if f"{root}/{format_file}" not in names:
            return "it is a zip archive but not a PT2 package (no archive_format)"
        if archive.read(f"{root}/{format_file}") != format_value:
            return "its archive_format is not a PT2 package's"
        if not any(name.startswith(f"{root}/{aoti_dir}") for name in names):
            return "it is a PT2 package without AOTInductor code"
    return ""


def main(argv):
    from workers.backends.known import get

    backend, path, memory_mb = argv
    limit = int(memory_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        problem = get(backend).artifact_problem(path)
    except MemoryError:
        problem = "checking it needs more memory than allowed"
    print(json.dumps({"problem": problem}))


if __name__ == "__main__":
    main(sys.argv[1:])
