"""A multipart/form-data body read as it is sent, so a large model never sits in memory
and a progress bar can follow the bytes going out (requests reads it chunk by chunk)."""

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

Progress = Callable[[int, int], None]


class MultipartStream:
    """Form fields and one file as a readable body of known length; on_progress(sent, total)
    is called as each chunk goes out."""

    def __init__(
        self, fields: dict, file_field: str, path: Path, on_progress: Progress | None = None
    ) -> None:
        self.boundary = uuid.uuid4().hex
        self.path = Path(path)
        head = b"".join(self._field(name, value) for name, value in fields.items())
        head += self._file_header(file_field, self.path.name)
        tail = f"\r\n--{self.boundary}--\r\n".encode()
        self.parts: list[bytes | None] = [head, None, tail]  # None: the file, read as sent
        self.total = len(head) + os.path.getsize(self.path) + len(tail)
        self.sent, self.on_progress = 0, on_progress
        self._file: BinaryIO | None = None
        self._index = 0
        self._offset = 0

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def __len__(self) -> int:
        return self.total

    def _field(self, name: str, value: object) -> bytes:
        disposition = f'Content-Disposition: form-data; name="{name}"'
        return f"--{self.boundary}\r\n{disposition}\r\n\r\n{value}\r\n".encode()

    def _file_header(self, name: str, filename: str) -> bytes:
        safe = filename.replace('"', "_").replace("\r", "_").replace("\n", "_")
        disposition = f'Content-Disposition: form-data; name="{name}"; filename="{safe}"'
        kind = "Content-Type: application/octet-stream"
        return f"--{self.boundary}\r\n{disposition}\r\n{kind}\r\n\r\n".encode()

    def read(self, size: int | None = -1) -> bytes:
        """The next bytes of the body (at most size), b"" at its end."""
        size = 64 * 1024 if size is None or size < 0 else size
        chunk = self._next(size)
        self.sent += len(chunk)
        if chunk and self.on_progress:
            self.on_progress(self.sent, self.total)
        return chunk

    def _next(self, size: int) -> bytes:
        while self._index < len(self.parts):
            part = self.parts[self._index]
            if part is None:
                self._file = self._file or self.path.open("rb")
                chunk = self._file.read(size)
                if chunk:
                    return chunk
                self._file.close()
            else:
                chunk = part[self._offset : self._offset + size]
                self._offset += len(chunk)
                if chunk:
                    return chunk
            self._index, self._offset = self._index + 1, 0
        return b""
