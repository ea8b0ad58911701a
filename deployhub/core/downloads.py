"""Name a download in its Content-Disposition header, in whatever script the name is written.

Names people really use (gerät.onnx, モデル.onnx) travel as RFC 6266's
`filename*=UTF-8''...`, percent-encoded (RFC 8187), next to a plain ASCII
`filename="..."` for clients that read only that one. Every download the hub
serves is named here; a neutral module, so every app may use it.
"""

import re
import unicodedata
from typing import IO
from urllib.parse import quote

from django.http import FileResponse

# What may stand in a quoted ASCII filename as it is: printable ASCII but the quote and backslash.
PLAIN = re.compile(r'[^\x20-\x7e]|["\\]')


def ascii_fallback(filename: str) -> str:
    """Return an ASCII stand-in for a name: accents dropped, other characters as '_'."""
    decomposed = unicodedata.normalize("NFKD", filename)
    text = "".join(char for char in decomposed if not unicodedata.combining(char))
    text = re.sub(r"_+", "_", PLAIN.sub("_", text))
    stem, dot, suffix = text.rpartition(".")
    if not dot:
        stem, suffix = suffix, ""
    if not re.search(r"[A-Za-z0-9]", stem):  # nothing left of the name but its extension
        stem = "download"
    return f"{stem}{dot}{suffix}"


def content_disposition(filename: str, disposition: str = "attachment") -> str:
    """Return the Content-Disposition value naming filename: both parameters when not ASCII."""
    fallback = ascii_fallback(filename)
    header = f'{disposition}; filename="{fallback}"'
    if fallback != filename:
        header += f"; filename*=UTF-8''{quote(filename, safe='')}"
    return header


def file_download(handle: IO[bytes], filename: str) -> FileResponse:
    """Stream an open file as an attachment named filename."""
    response = FileResponse(handle, as_attachment=True, filename=filename)
    response["Content-Disposition"] = content_disposition(filename)
    return response
