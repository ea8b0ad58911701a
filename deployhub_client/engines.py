"""A hub's engines, and downloading one safely (hub.engines).

An engine is executable: loading a crafted one can run code. download() keeps a file only
when its bytes have the sha256 the hub stored and that sha256 carries the hub's Ed25519
signature, checked with the same code a device worker runs (workers/signing.py, no Django),
and, for_this_machine, only when this machine's toolchain is the one it was built for.
"""

import hashlib
import os
import re
from pathlib import Path

from deployhub_client import operations as ops
from deployhub_client.hub import HubError, path_of
from deployhub_client.operations import calls

SIGNING_KEY_VARIABLE = "DEPLOYHUB_SIGNING_KEY"
CHUNK_BYTES = 1024 * 1024


class EngineRefused(HubError):
    """A downloaded engine failed its checks (sha256, signature or toolchain): not kept."""

    def __init__(self, message: str):
        super().__init__(0, message)


class Engines:
    """hub.engines: the engines of the caller's teams."""

    def __init__(self, hub):
        self.hub = hub

    @calls(ops.ENGINE_DETAIL)
    def get(self, engine: int) -> dict:
        """An engine: its build, compatibility key, sha256, signature, gates and status."""
        return self.hub.call(ops.ENGINE_DETAIL, engine)

    @calls(ops.ENGINE_DETAIL, ops.ENGINE_FILE)
    def download(
        self,
        engine_id: int,
        dest: str | Path = ".",
        for_this_machine: bool = True,
        public_key: str | None = None,
    ) -> Path:
        """Download an engine to dest (a folder, or a file path) and answer where it is.

        The file is kept only when its sha256 is the hub's and the hub's signature of it
        verifies with public_key (else $DEPLOYHUB_SIGNING_KEY, else the key the hub names
        in the engine's JSON: pin one to trust the hub's key less). for_this_machine also
        refuses an engine built for another toolchain than this machine's (it needs the
        worker's runtimes installed); EngineRefused says which check failed."""
        info = self.get(engine_id)
        if for_this_machine:
            check_this_machine(info)
        key = public_key or os.environ.get(SIGNING_KEY_VARIABLE) or info.get("signing_public_key")
        response = self.hub.send("GET", path_of(ops.ENGINE_FILE, engine_id), stream=True)
        target = target_path(Path(dest), engine_id, response.headers)
        partial = target.with_name(target.name + ".part")
        with response, partial.open("wb") as file:
            for chunk in response.iter_content(CHUNK_BYTES):
                file.write(chunk)
        try:
            verify_file(partial, info.get("sha256") or "", info.get("signature") or "", key)
        except EngineRefused:
            partial.unlink()
            raise
        partial.replace(target)
        return target


def target_path(dest: Path, engine_id: int, headers) -> Path:
    """dest itself, or in a folder dest the file name the hub gave (engine-<id> without one)."""
    if not dest.is_dir():
        return dest
    named = re.search(r'filename="?([^";/\\]+)"?', headers.get("Content-Disposition", ""))
    return dest / (named.group(1) if named else f"engine-{engine_id}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: Path, sha256: str, signature: str, public_key: str | None) -> None:
    """Return when the file's sha256 is the one given and the hub signed it; else raise
    EngineRefused (the worker's own check, workers.signing.verify)."""
    from workers.signing import TamperedEngine, verify

    actual = sha256_of(path)
    if actual != sha256:
        raise EngineRefused(f"The file's sha256 is {actual}, not the hub's {sha256}: refused.")
    if not public_key:
        raise EngineRefused("No signing key to check the engine with: refused.")
    try:
        verify(sha256, signature, public_key)
    except TamperedEngine as exc:
        raise EngineRefused(f"{exc}.") from exc


def check_this_machine(info: dict) -> None:
    """Raise EngineRefused unless this machine's toolchain gives the engine's compatibility
    key (the fields a device worker reports, computed here with the worker's code)."""
    try:
        from workers import fingerprint
        from workers.backends import known
        from workers.backends.base import compat_key, differences
    except ImportError as exc:
        raise EngineRefused(
            f"Cannot read this machine's toolchain ({exc}): install the worker "
            '(pip install "deployhub[worker]") or download with for_this_machine=False.'
        ) from exc
    backend = known.get(info["backend"])
    fields = backend.compat_fields(fingerprint.collect(), info.get("build_config") or {})
    if compat_key(backend.name, fields) != info.get("compat_key"):
        changed = ", ".join(sorted(differences(info.get("compat_fields") or {}, fields)))
        raise EngineRefused(
            f"Engine #{info['id']} was built for another toolchain ({changed or 'its key'} "
            "differ): it would not load here. Download with for_this_machine=False to keep it."
        )
