"""Check upload names, kinds and archives before anything reads them as a model.

Nothing here unpickles, imports torch or runs a model. A zip is checked member
by member before a byte is written, and its bytes are counted as they are
decompressed (Unpacking): past the size cap or the compression-ratio cap
(RatioCap, per member and for the whole archive) it stops at once, so a zip
bomb never unpacks. Every archive the hub reads goes through it: models,
datasets, golden sets, parity packs and the .npz files inside them. A `.pt2`
(torch.export.save) is read as a zip of JSON and raw tensor bytes, and refused
when loading it on a worker would unpickle anything beyond plain tensors or
evaluate anything beyond plain shape arithmetic (torch parses shape
expressions with sympy, which evaluates them).
"""

import ast
import json
import os
import pickletools
import re
import shutil
import stat
import tempfile
import unicodedata
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from deployhub.registry.inspect import InvalidModel

ZIP_MAGIC = b"PK\x03\x04"
CHUNK = 1024 * 1024
MAX_FILENAME = 255
MAX_JSON_BYTES = 256 * 1024 * 1024
MAX_PT2_BYTES = 16 * 1024**3
MAX_PT2_MEMBERS = 20_000  # torch.export.save writes one member per weight
KINDS = {".onnx": "onnx", ".zip": "onnx-zip", ".pt2": "pt2"}
PICKLE_EXTENSIONS = {".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".bin", ".joblib"}
ACCEPTED = (
    "upload a .onnx file, a .zip of an ONNX model with its external data files, "
    "or a .pt2 written by torch.export.save"
)
PICKLE_REFUSAL = (
    "Pickled checkpoints are refused: loading a pickle runs arbitrary code. "
    "Export the model instead: `torch.onnx.export(model, example, 'model.onnx')` or "
    "`ep = torch.export.export(model, (example,)); torch.export.save(ep, 'model.pt2')`, "
    "and upload the .onnx or .pt2."
)
WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Unicode categories a file name may not hold: formatting (bidi overrides, zero-width),
# surrogates, line and paragraph separators.
HIDDEN = {"Cf", "Cs", "Zl", "Zp"}


class PickledCheckpoint(InvalidModel):
    """The upload is, or holds, a pickle that DeployHub would have to unpickle."""

    def __init__(self, what=""):
        super().__init__(f"{what}{PICKLE_REFUSAL}")


class UnsafeArchive(InvalidModel):
    """A zip member would escape the extraction folder, or the archive is a bomb."""


# Names and kinds -------------------------------------------------------------


def check_filename(name):
    """Return an uploaded file's name, NFC-normalised, if it is a plain, short name; else refuse.

    Any script goes (gerät.onnx, モデル.onnx): the name is kept for display, escaped, and for
    downloads; the stored file gets a generated name. Control characters and invisible
    formatting (direction overrides, zero-width characters) are refused, because they make
    a shown name differ from the real one.
    """
    if not name:
        raise InvalidModel("The file has no name: upload it under a name such as model.onnx.")
    name = unicodedata.normalize("NFC", name)
    shown = repr(name[:60] + ("..." if len(name) > 60 else ""))
    if len(name) > MAX_FILENAME:
        raise InvalidModel(
            f"The file name {shown} is {len(name)} characters long; the limit is "
            f"{MAX_FILENAME}. Rename the file."
        )
    if CONTROL.search(name):
        raise InvalidModel(f"The file name {shown} contains control characters: rename the file.")
    if any(unicodedata.category(char) in HIDDEN for char in name):
        raise InvalidModel(
            f"The file name {shown} contains invisible formatting characters (such as a "
            "right-to-left override or a zero-width space): rename the file."
        )
    if "/" in name or "\\" in name or name in (".", ".."):
        raise InvalidModel(
            f"The file name {shown} is a path, not a plain name: upload the file under a "
            "name such as model.onnx."
        )
    return name


def _looks_pickled(head):
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def sniff(filename, head):
    """Decide from a name's extension and the file's first bytes what an upload is."""
    suffix = PurePosixPath(filename).suffix.lower()
    kind = KINDS.get(suffix)
    if suffix in PICKLE_EXTENSIONS or (_looks_pickled(head) and kind != "onnx"):
        raise PickledCheckpoint()
    if kind is None:
        raise InvalidModel(
            f"DeployHub does not accept {suffix or 'extension-less'} files: {ACCEPTED}."
        )
    if kind == "onnx" and _looks_pickled(head):
        raise PickledCheckpoint("This is not an ONNX model: it is a Python pickle. ")
    if kind == "onnx" and head.startswith(ZIP_MAGIC):
        raise InvalidModel(
            "This is not an ONNX model: it is a zip archive. A zip of an ONNX model with its "
            "external data must be uploaded with the .zip extension; a torch.save checkpoint "
            f"is refused. {PICKLE_REFUSAL}"
        )
    if kind != "onnx" and not head.startswith(ZIP_MAGIC):
        raise InvalidModel(f"This {suffix} file is not a zip archive: {ACCEPTED}.")
    return kind


# Zip members -----------------------------------------------------------------


def _member_problem(info):
    """Return why a zip member is unsafe to extract, or None."""
    name = info.orig_filename
    parts = PurePosixPath(name).parts
    mode = info.external_attr >> 16
    if not name or CONTROL.search(name):
        return "has an empty name or one with NUL or control characters"
    if "\\" in name:
        return "has a backslash in its name"
    if name.startswith("/") or WINDOWS_DRIVE.match(name):
        return "has an absolute path"
    if ".." in parts:
        return "climbs out of the archive with '..'"
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
        return "is a device, pipe or other special file"
    if info.flag_bits & 0x1:
        return "is encrypted"
    return None


@dataclass(frozen=True)
class RatioCap:
    """How far an archive may unpack: `ratio` times its compressed bytes, past `allowance`.

    Held to each member (against its compressed size) and to the whole archive
    (against the archive file's size), on the sizes it declares before a byte is
    decompressed and on the bytes really unpacked while extracting. The allowance
    lets small files that compress well (a JSON config, labels.csv) through.
    """

    ratio: int
    allowance: int

    def limit(self, packed):
        """Return how many bytes `packed` compressed bytes may unpack to."""
        return max(self.allowance, self.ratio * packed)

    def refusal(self, what, unpacked, packed, *, past=False):
        """Say that `what` unpacks `unpacked` bytes from `packed`: over the ratio cap."""
        amount = f"past {unpacked:,}" if past else f"{unpacked:,}"
        shown = "" if past else f" of {unpacked // max(packed, 1):,}:1"
        return UnsafeArchive(
            f"{what} unpacks {amount} bytes from {packed:,}: a compression ratio{shown} over the "
            f"limit of {self.ratio}:1. Refused as a possible zip bomb."
        )


def check_members(infos, *, max_total_bytes, cap, archive_size, max_members=2000):
    """Refuse a zip whose members are unsafe, duplicated, too many or too big; return them.

    archive_size is the archive file's size on disk: the whole archive's ratio is held
    to it, not to the compressed sizes its members declare.
    """
    if len(infos) > max_members:
        raise UnsafeArchive(
            f"The archive holds {len(infos):,} members; the limit is {max_members:,}."
        )
    seen = set()
    for info in infos:
        if problem := _member_problem(info):
            raise UnsafeArchive(f"The archive member {info.orig_filename!r} {problem}; refused.")
        key = info.filename.rstrip("/")
        if key in seen:
            raise UnsafeArchive(f"The archive holds {info.filename!r} twice; refused.")
        seen.add(key)
    _check_declared_size(infos, max_total_bytes)
    _check_declared_ratio(infos, cap, archive_size)
    return infos


def _check_declared_size(infos, max_total_bytes):
    declared = sum(info.file_size for info in infos)
    if declared > max_total_bytes:
        raise UnsafeArchive(
            f"The archive expands to {declared:,} bytes; the limit is {max_total_bytes:,}."
        )


def _check_declared_ratio(infos, cap, archive_size):
    """Refuse, before decompressing anything, sizes that declare a bomb."""
    for info in infos:
        if info.file_size > cap.limit(info.compress_size):
            raise cap.refusal(
                f"The archive member {info.filename!r}", info.file_size, info.compress_size
            )
    declared = sum(info.file_size for info in infos)
    if declared > cap.limit(archive_size):
        raise cap.refusal("The archive", declared, archive_size)


def open_zip(path):
    """Open a zip archive for reading; raise InvalidModel if it is not one."""
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        raise InvalidModel(f"This is not a readable zip archive ({exc}).") from exc


class Unpacking:
    """Read a checked zip's members, counting every decompressed byte against the caps.

    It stops the moment a member passes its ratio, or the archive passes its own ratio
    or the size cap: what the headers declare is checked first, what really comes out
    is what counts.
    """

    def __init__(self, archive, archive_size, *, max_total_bytes, cap):
        self.archive, self.archive_size = archive, archive_size
        self.max_total_bytes, self.cap = max_total_bytes, cap
        self.total = 0

    def chunks(self, info):
        """Yield a member's bytes as they are decompressed; refuse past a cap."""
        limit = self.cap.limit(info.compress_size)
        unpacked = 0
        try:
            with self.archive.open(info) as source:
                while chunk := source.read(CHUNK):
                    unpacked += len(chunk)
                    self.total += len(chunk)
                    if unpacked > limit:
                        what = f"The archive member {info.filename!r}"
                        raise self.cap.refusal(what, limit, info.compress_size, past=True)
                    self._check_total(info)
                    yield chunk
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
            raise InvalidModel(
                f"The archive member {info.filename!r} could not be read ({exc})."
            ) from exc

    def _check_total(self, info):
        if self.total > self.max_total_bytes:
            raise UnsafeArchive(
                f"The archive expands past the {self.max_total_bytes:,} byte limit at member "
                f"{info.filename!r}; refused."
            )
        if self.total > self.cap.limit(self.archive_size):
            limit = self.cap.limit(self.archive_size)
            what = f"The archive (at member {info.filename!r})"
            raise self.cap.refusal(what, limit, self.archive_size, past=True)

    def read(self, info):
        """Return a member's bytes (a small one: the caps bound it)."""
        return b"".join(self.chunks(info))

    def extract(self, info, dest):
        """Write a member under dest (a folder for a directory entry)."""
        target = dest.joinpath(*PurePosixPath(info.filename).parts)
        if not target.resolve().is_relative_to(dest.resolve()):
            raise UnsafeArchive(f"The archive member {info.filename!r} leaves the folder; refused.")
        try:
            (target if info.is_dir() else target.parent).mkdir(parents=True, exist_ok=True)
            if not info.is_dir():
                with open(target, "xb") as out:
                    for chunk in self.chunks(info):
                        out.write(chunk)
        except OSError as exc:
            raise InvalidModel(
                f"The archive member {info.filename!r} could not be extracted ({exc.strerror})."
            ) from exc


def safe_extract_zip(zip_path, dest, *, max_total_bytes, cap, max_members=2000):
    """Create dest and extract a checked zip into it; on any failure leave nothing behind."""
    dest = Path(dest)
    dest.mkdir()
    try:
        with open_zip(zip_path) as archive:
            size = os.path.getsize(zip_path)
            infos = check_members(
                archive.infolist(),
                max_total_bytes=max_total_bytes,
                cap=cap,
                archive_size=size,
                max_members=max_members,
            )
            unpacking = Unpacking(archive, size, max_total_bytes=max_total_bytes, cap=cap)
            for info in infos:
                unpacking.extract(info, dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return [info.filename for info in infos if not info.is_dir()]


def find_single_onnx(folder):
    """Return the one .onnx file in an extracted tree; refuse none or several."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    models = [p for p in files if p.suffix.lower() == ".onnx"]
    if not models and any(p.name == "data.pkl" for p in files):
        raise PickledCheckpoint("This zip is a torch.save checkpoint, not an ONNX model. ")
    if not models:
        raise InvalidModel(
            "The zip holds no .onnx file: put the model's .onnx file and its external data "
            "files in one zip."
        )
    if len(models) > 1:
        names = ", ".join(p.relative_to(folder).as_posix() for p in models)
        raise InvalidModel(
            f"The zip holds {len(models)} .onnx files: {names}; upload one model per zip."
        )
    return models[0]


# torch.export archives (.pt2) -------------------------------------------------

# Every member torch.export.save writes, relative to the archive's root folder.
ARCHIVE_MEMBER = re.compile(
    r"archive_format|archive_version|byteorder|\.data/(version|serialization_id)"
    r"|models/[\w.-]+\.json|data/sample_inputs/[\w.-]+\.pt|extra/[^/]+"
    r"|data/weights/([\w.-]+_weights_config\.json|weight_\d+)"
    r"|data/constants/([\w.-]+_constants_config\.json|(tensor|custom_obj|opaque_obj)_\d+)"
)
COMPILED_FOLDERS = ("data/aotinductor/", "data/executorch/", "data/mtia", "xl_model_weights/")
SCALAR_TYPES = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float",
    8: "double", 9: "complex32", 10: "complex64", 11: "complex128", 12: "bool", 13: "bfloat16",
    28: "uint16", 29: "float8e4m3fn", 30: "float8e5m2", 31: "float8e4m3fnuz",
    32: "float8e5m2fnuz", 33: "float8e8m0", 34: "uint32", 35: "uint64",
}  # fmt: skip
SCALAR_ARGS = {"as_sym_int": "int64", "as_sym_float": "double", "as_sym_bool": "bool"}
# What torch.save writes for tensors and containers of tensors; nothing that runs code.
SAFE_GLOBALS = {
    "collections OrderedDict",
    "torch Size",
    "torch device",
    "torch._utils _rebuild_tensor",
    "torch._utils _rebuild_tensor_v2",
    "torch._utils _rebuild_tensor_v3",
    "torch._utils _rebuild_parameter",
    "torch._utils _rebuild_device_tensor_from_cpu_tensor",
    "torch._utils _rebuild_meta_tensor_no_storage",
    "_codecs encode",
}
SAFE_GLOBAL = re.compile(r"^torch [A-Za-z0-9]+Storage$|^torch (u?int\d+|float\d*|bfloat16|bool)$")
STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING"}
NEUTRAL_OPS = {"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "FRAME"}
OBJECT_OPS = {"INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD", "EXT1", "EXT2", "EXT4"}
# Names sympy may meet in a shape expression: its own classes and torch's shape functions.
SYMPY_NAMES = {
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Abs",
    "floor", "ceiling", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan", "LessThan",
    "StrictGreaterThan", "GreaterThan", "Equality", "Unequality", "And", "Or", "Not",
    "Piecewise", "ExprCondPair", "true", "false", "True", "False", "oo", "zoo", "nan",
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
    "FloorToInt", "CeilDiv", "IntTrueDiv", "FloatTrueDiv", "LShift", "RShift",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt",
    "RoundDecimal", "ToFloat", "FloatPow", "PowByNatural", "Identity",
}  # fmt: skip
SYMPY_OPERATORS = {"Add": " + ", "Mul": "*", "Pow": "**"}
SYMPY_NAME = re.compile(r"^(OpaqueUnaryFn|BitwiseFn)_[a-z_]+$")
# torch writes expressions with sympy's srepr: calls, names and literals, no operators.
EXPRESSION_NODES = (ast.Expression, ast.Call, ast.Name, ast.Load, ast.Constant, ast.keyword)
EXPRESSION_NODES += (ast.UnaryOp, ast.USub)
# Strings in a shape expression: symbol names, or the digits of Float('1.5', precision=53).
EXPRESSION_STRING = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$|^[0-9.eE+-]+$")
ATEN_DUNDER_OPS = {"__and__", "__or__", "__xor__", "__lshift__", "__rshift__"}
SAFE_TARGET = re.compile(
    r"^torch\.ops\.(?!_|load_library\.|import_module\.|loaded_libraries\.)\w+\.\w+(\.\w+)?$"
    r"|^_operator\.(add|sub|mul|truediv|floordiv|mod|pow|neg|pos|abs|eq|ne|lt|le|gt|ge"
    r"|and_|or_|xor|not_|invert|lshift|rshift|getitem|truth|index)$"
    r"|^math\.[a-z]\w*$|^torch\._?sym_[a-z_]+$"
)


def _unsafe_pt2(what):
    return InvalidModel(
        f"This .pt2 {what}, which would run code when a worker loads it. Export plain tensors "
        "with `ep = torch.export.export(model, (example,)); torch.export.save(ep, 'model.pt2')`, "
        "or upload an ONNX model instead."
    )


def _archive_root(names):
    """Return the one top-level folder torch.export.save puts every member under."""
    roots = {PurePosixPath(name).parts[0] for name in names}
    if len(roots) != 1 or any(len(PurePosixPath(name).parts) < 2 for name in names):
        raise InvalidModel(f"This .pt2 is not an archive written by torch.export.save: {ACCEPTED}.")
    return roots.pop()


def _program_member(names):
    """Return the archive-relative path of the one exported program; refuse pickles."""
    programs = [n for n in names if re.fullmatch(r"models/[^/]+\.json", n)]
    if not programs and any(PurePosixPath(n).name == "data.pkl" for n in names):
        raise PickledCheckpoint("This .pt2 is a torch.save checkpoint, not an exported program. ")
    if not programs:
        raise InvalidModel(
            "This .pt2 holds no exported program (models/<name>.json): save it with "
            "torch.export.save(ep, 'model.pt2') from torch 2.6 or later."
        )
    if len(programs) > 1:
        raise InvalidModel(f"This .pt2 holds {len(programs)} exported programs; upload one.")
    return programs[0]


def _check_layout(names):
    """Refuse members torch.export.save does not write, compiled code first."""
    for name in names:
        if name.startswith(COMPILED_FOLDERS):
            raise InvalidModel(
                f"This .pt2 holds compiled code ({name!r}). Engines are built by the workers "
                "for each device: upload the exported program only (torch.export.save)."
            )
        if not ARCHIVE_MEMBER.fullmatch(name):
            raise InvalidModel(
                f"This .pt2 holds {name!r}, which torch.export.save does not write; refused."
            )


def _head(path, size=4):
    with open(path, "rb") as handle:
        return handle.read(size)


def _read_json(path, what):
    if path.stat().st_size > MAX_JSON_BYTES:
        raise InvalidModel(f"This .pt2's {what} is larger than {MAX_JSON_BYTES:,} bytes.")
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise InvalidModel(f"This .pt2's {what} is not valid JSON ({exc}).") from exc


def _check_payload_config(path):
    """Refuse weights or constants that torch would unpickle instead of reading raw bytes."""
    config = _read_json(path, path.name)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise InvalidModel(f"This .pt2's {path.name} is not a torch.export payload config.")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle", True):
            raise _unsafe_pt2(f"stores {fqn!r} as a pickle (a tensor subclass or custom object)")


def _pickle_globals(opcodes):
    """Yield every global a pickle imports; refuse what cannot be read without running it."""
    recent = []
    for opcode, arg, _ in opcodes:
        if opcode.name in NEUTRAL_OPS:
            continue
        if opcode.name in OBJECT_OPS:
            raise _unsafe_pt2(f"holds sample inputs that build objects ({opcode.name})")
        if opcode.name == "GLOBAL":
            yield arg
        elif opcode.name == "STACK_GLOBAL":
            if len(recent) < 2 or any(op.name not in STRING_OPS for op, _ in recent[-2:]):
                raise _unsafe_pt2("holds sample inputs that hide what they import")
            yield f"{recent[-2][1]} {recent[-1][1]}"
        recent = (recent + [(opcode, arg)])[-2:]


def _check_pickle(data, member):
    try:
        opcodes = list(pickletools.genops(data))
    except ValueError as exc:
        raise InvalidModel(f"This .pt2's {member} is not a readable pickle ({exc}).") from exc
    for name in _pickle_globals(opcodes):
        if name not in SAFE_GLOBALS and not SAFE_GLOBAL.match(name):
            raise _unsafe_pt2(f"holds sample inputs that import {name!r}")


def _check_sample_inputs(path, max_total_bytes, cap):
    """Check the torch.save zip of sample inputs holds tensors only, without loading it."""
    member = f"data/sample_inputs/{path.name}"
    if _head(path) != ZIP_MAGIC:
        raise _unsafe_pt2(f"holds sample inputs ({member}) in the legacy pickle format")
    size = path.stat().st_size
    with open_zip(path) as archive:
        infos = check_members(
            archive.infolist(), max_total_bytes=max_total_bytes, cap=cap, archive_size=size
        )
        pickles = [i for i in infos if PurePosixPath(i.filename).name.endswith(".pkl")]
        if len(pickles) != 1 or PurePosixPath(pickles[0].filename).name != "data.pkl":
            raise _unsafe_pt2(f"holds unexpected pickles in its sample inputs ({member})")
        unpacking = Unpacking(archive, size, max_total_bytes=max_total_bytes, cap=cap)
        data = unpacking.read(pickles[0])
    _check_pickle(data, member)


def _check_expression(text):
    """Refuse a shape expression that sympy's eval could turn into code."""
    try:
        tree = ast.parse(text, mode="eval") if len(text) <= 10_000 else None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    nodes = list(ast.walk(tree)) if tree else []
    if not nodes or any(not _safe_expression_node(node) for node in nodes):
        raise _unsafe_pt2(f"holds a shape expression that is not plain arithmetic ({text[:80]!r})")


def _safe_expression_node(node):
    if not isinstance(node, EXPRESSION_NODES):
        return False
    if isinstance(node, ast.Name):
        return node.id in SYMPY_NAMES or bool(SYMPY_NAME.match(node.id))
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name)
    if isinstance(node, ast.keyword):
        return bool(node.arg and re.fullmatch(r"[a-z]+", node.arg))
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return len(node.value) <= 64 and bool(EXPRESSION_STRING.match(node.value))
    if isinstance(node, ast.Constant):  # bounded, so sympy cannot be made to grind on it
        return isinstance(node.value, (int, float, bool)) and abs(node.value) <= 2**63
    return True


def _safe_target(target):
    """Tell whether torch resolves a node's target to an operator and nothing else."""
    parts = target.split(".")
    if not SAFE_TARGET.match(target) or any(part.startswith("__") for part in parts[4:]):
        return False
    is_dunder_op = len(parts) > 3 and parts[3].startswith("__")
    return not is_dunder_op or (parts[2] == "aten" and parts[3] in ATEN_DUNDER_OPS)


def _check_program(program):
    """Walk the program JSON; refuse unknown call targets and non-arithmetic expressions."""
    if not isinstance(program, dict):
        raise InvalidModel("This .pt2's exported program is not a JSON object.")
    stack = [program]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if isinstance(item.get("expr_str"), str):
                _check_expression(item["expr_str"])
            target = item.get("target")
            if isinstance(target, str) and "inputs" in item and not _safe_target(target):
                raise _unsafe_pt2(f"calls {target[:80]!r}, which is not a torch operator")
            stack.extend(item.values())


def _is_sum(node):
    return isinstance(node, ast.Call) and node.func.id == "Add"


def _render(node):
    """Write a checked sympy srepr tree as arithmetic: Mul(Integer(2), Symbol('s0')) -> 2*s0."""
    if not isinstance(node, ast.Call):
        return ast.unparse(node)
    name, args = node.func.id, node.args
    if name in ("Symbol", "Integer") and args:
        return ast.unparse(args[0]).strip("'")
    parts = [_render(arg) for arg in args]
    if name not in SYMPY_OPERATORS:
        return f"{name}({', '.join(parts)})"
    if name != "Add":  # a sum inside a product or a power needs brackets
        parts = [
            f"({text})" if _is_sum(arg) else text for text, arg in zip(parts, args, strict=True)
        ]
    return SYMPY_OPERATORS[name].join(parts)


def _size(size):
    """Return a dim as an int, or as a symbolic string such as 's0' or '2*s0'."""
    if "as_int" in size:
        return size["as_int"]
    return _render(ast.parse(size["as_expr"]["expr_str"], mode="eval").body)


def _argument(arg, graph):
    """Describe one user input or output of the program, or None for constants."""
    if "as_tensor" in arg:
        name = arg["as_tensor"]["name"]
        meta = graph["tensor_values"][name]
        dtype = SCALAR_TYPES.get(meta["dtype"], "unknown")
        return {"name": name, "dtype": dtype, "shape": [_size(s) for s in meta["sizes"]]}
    kind = next((key for key in SCALAR_ARGS if key in arg), None)
    if kind and "as_name" in arg[kind]:
        return {"name": arg[kind]["as_name"], "dtype": SCALAR_ARGS[kind], "shape": []}
    return None


def _signature(program):
    """Return the program's user inputs and outputs, or two empty lists if unreadable."""
    try:
        module = program["graph_module"]
        specs = module["signature"]
        found = [
            [_argument(spec[role]["arg"], module["graph"]) for spec in specs[key] if role in spec]
            for key, role in (("input_specs", "user_input"), ("output_specs", "user_output"))
        ]
    except (KeyError, TypeError, AttributeError, IndexError, SyntaxError):
        return [], []
    return [[item for item in items if item] for items in found]


def _read_pt2(folder, max_total_bytes, cap):
    """Check an extracted torch.export archive and describe its program."""
    names = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*")) if p.is_file()]
    root = _archive_root(names)
    inner = [name.split("/", 1)[1] for name in names]
    program_member = _program_member(inner)
    _check_layout(inner)
    base = folder / root
    if "archive_format" not in inner or _head(base / "archive_format").strip() != b"pt2":
        raise InvalidModel(f"This .pt2 does not declare archive_format 'pt2': {ACCEPTED}.")
    for name in inner:
        if re.fullmatch(r"data/(weights|constants)/[^/]+_config\.json", name):
            _check_payload_config(base / name)
        elif name.startswith("data/sample_inputs/"):
            _check_sample_inputs(base / name, max_total_bytes, cap)
    program = _read_json(base / program_member, program_member)
    _check_program(program)
    inputs, outputs = _signature(program)
    version = program.get("torch_version")
    return {
        "format": "pt2",
        "inputs": inputs,
        "outputs": outputs,
        "torch_version": version if isinstance(version, str) else None,
    }


def inspect_pt2(path, workdir, *, cap, max_total_bytes=MAX_PT2_BYTES):
    """Validate a torch.export archive without torch or unpickling, and describe it."""
    folder = Path(tempfile.mkdtemp(dir=workdir, prefix="pt2-"))
    try:
        safe_extract_zip(
            path,
            folder / "archive",
            max_total_bytes=max_total_bytes,
            cap=cap,
            max_members=MAX_PT2_MEMBERS,
        )
        return _read_pt2(folder / "archive", max_total_bytes, cap)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
