"""A hub's engines, and downloading one safely (hub.engines).

An engine is executable: loading a crafted one can run code. download() keeps a file only
when its bytes have the sha256 the hub stored and that sha256 carries the hub's Ed25519
signature, checked with the same code a device worker runs (workers/signing.py, no Django),
and, for_this_machine, only when the hub finds this machine's toolchain runs it.
"""

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from deployhub_client import operations as ops
from deployhub_client.hub import HubError, path_of
from deployhub_client.operations import calls

if TYPE_CHECKING:
    from deployhub_client.hub import Hub

SIGNING_KEY_VARIABLE = "DEPLOYHUB_SIGNING_KEY"
CHUNK_BYTES = 1024 * 1024


class EngineRefused(HubError):
    """A downloaded engine failed its checks (sha256, signature or toolchain): not kept."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class Engines:
    """hub.engines: the engines of the caller's teams."""

    def __init__(self, hub: "Hub") -> None:
        self.hub = hub

    @calls(ops.ENGINE_DETAIL)
    def get(self, engine: int) -> dict:
        """An engine: its build, compatibility key, sha256, signature, gates and status."""
        return self.hub.call(ops.ENGINE_DETAIL, engine)

    @calls(ops.ENGINE_COMPATIBILITY)
    def compatibility(self, engine: int, fingerprint: dict) -> dict:
        """Whether a machine with this fingerprint runs the engine: {"runs", "reason",
        "differences"} (the hub's own check; nothing is stored)."""
        return self.hub.call(ops.ENGINE_COMPATIBILITY, engine, json={"fingerprint": fingerprint})

    @calls(ops.ENGINE_COMPATIBILITY)
    def check_this_machine(self, engine: int) -> None:
        """Raise EngineRefused unless the hub finds this machine's toolchain runs the engine."""
        answer = self.compatibility(engine, this_machine())
        if not answer["runs"]:
            raise EngineRefused(
                f"Engine #{engine} would not load here: {answer['reason']} Download with "
                "for_this_machine=False (--any-machine) to keep it anyway."
            )

    @calls(ops.ENGINE_DETAIL, ops.ENGINE_COMPATIBILITY, ops.ENGINE_FILE)
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
            self.check_this_machine(engine_id)
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


def target_path(dest: Path, engine_id: int, headers: Mapping[str, str]) -> Path:
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


def this_machine() -> dict:
    """This machine's fingerprint, as a device worker reports it (workers/fingerprint.py)."""
    try:
        from workers import fingerprint

        return fingerprint.collect()
    except ImportError as exc:
        raise EngineRefused(
            f"Cannot read this machine's toolchain ({exc}): install the worker "
            '(pip install "deployhub[worker]") or download with for_this_machine=False.'
        ) from exc
