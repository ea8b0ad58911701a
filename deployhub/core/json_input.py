"""Read the JSON and text that people and devices send, as the hub can keep them.

One parser for API bodies and for the JSON fields of forms: finite numbers only (NaN,
Infinity and 1e400 are not JSON numbers, and PostgreSQL's jsonb refuses them), nested at
most MAX_DEPTH levels (100,000 levels overflowed Python's stack), and text PostgreSQL can
store (no NUL character, no lone surrogate). And how long a text, how big a value the hub
keeps. Imports no app: API views and forms share it.
"""

import json
import math
import re
from typing import Any, NoReturn

from django.conf import settings

# What PostgreSQL cannot store in text: NUL, and surrogates (UTF-8 has none).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# No JSON the hub takes nests deeper (a fingerprint or a benchmark result is about 5 levels).
MAX_DEPTH = 32


class JSONInputError(ValueError):
    """The JSON cannot be read or kept; the message says why, for the person who sent it."""


def parse(raw: str | bytes, what: str = "The body", scrub: bool = False) -> Any:
    """Return the JSON value of raw (str or UTF-8 bytes); raise JSONInputError otherwise.

    Bytes are UTF-8 (RFC 8259): json.loads alone would also take UTF-16 and UTF-32, and
    their lone surrogates. With scrub, a string value's NUL characters and lone surrogates
    become U+FFFD instead of a refusal (see check).
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError as exc:
        raise JSONInputError(f"{what} is nested too deep: at most {MAX_DEPTH} levels.") from exc
    except UnicodeDecodeError as exc:
        raise JSONInputError(f"{what} is not valid JSON: it is not UTF-8 ({exc}).") from exc
    except JSONInputError:
        raise
    except ValueError as exc:  # JSONDecodeError, or an integer of over 4300 digits
        raise JSONInputError(f"{what} is not valid JSON: {exc}") from exc
    check(value, what, scrub)
    return value


def _no_constant(name: str) -> NoReturn:
    raise JSONInputError(f"{name} is not a JSON number: send a finite number.")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise JSONInputError(f"The number {literal[:40]} is out of range: send a finite number.")
    return value


def check(value: Any, what: str = "The body", scrub: bool = False) -> None:
    """Raise JSONInputError when a parsed value nests over MAX_DEPTH or holds text not to keep.

    With scrub, text inside a list or an object is made storable in place instead (a NUL or
    a lone surrogate becomes U+FFFD): for what machines write, such as a device's build
    log, where refusing the whole call (a job's heartbeat) would lose more than one sign.
    """
    pending: list[tuple[Any, str, int, Any, Any]] = [(value, what, 1, None, None)]
    while pending:
        value, where, depth, parent, slot = pending.pop()
        if isinstance(value, str):
            if scrub and parent is not None:
                parent[slot] = scrubbed(value)
            else:
                check_text(value, where)
            continue
        if isinstance(value, dict | list) and depth > MAX_DEPTH:
            raise JSONInputError(f"{what} is nested too deep: at most {MAX_DEPTH} levels.")
        if isinstance(value, float) and not math.isfinite(value):
            raise JSONInputError(f"{where} is {value}, which is not a JSON number.")
        if isinstance(value, list):
            pending.extend(
                (item, f"{where}[{i}]", depth + 1, value, i) for i, item in enumerate(value)
            )
        elif isinstance(value, dict):
            for key, item in value.items():
                check_text(str(key), f"A key of {where}")
                name = repr(key) if where == "The body" else f"{where}.{key}"
                pending.append((item, name, depth + 1, value, key))


def text_problem(value: str) -> str:
    """Say why PostgreSQL cannot store this text (a NUL, a lone surrogate), or return ""."""
    if "\x00" in value:
        return "contains a NUL character (\\u0000), which the hub does not store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (it holds a lone surrogate such as \\ud800)"
    return ""


def scrubbed(value: str) -> str:
    """Return text PostgreSQL can store: NUL characters and lone surrogates as U+FFFD."""
    return UNSTORABLE.sub("\ufffd", value)


def length_problem(value: object, what: str, limit: int | None = None) -> str:
    """Say why a person's text is longer than the hub keeps ("" when it is not).

    Refused, never cut: the person still has their text and can shorten it. The limit is
    DEPLOYHUB_MAX_TEXT_CHARS unless given.
    """
    limit = limit or settings.DEPLOYHUB_MAX_TEXT_CHARS
    if not isinstance(value, str) or len(value) <= limit:
        return ""
    return f"{what} is {len(value):,} characters long: at most {limit:,} are kept."


def tail(value: str, limit: int) -> str:
    """Return a device's text as the hub keeps it: at most its last `limit` characters.

    The end of a log or an error says why a build failed, so the start goes, and a first
    line says how much of it went.
    """
    if len(value) <= limit:
        return value
    kept = value[-limit:]
    kept = kept[kept.find("\n") + 1 :] if "\n" in kept[: limit // 2] else kept
    return f"[{len(value) - len(kept):,} earlier characters cut]\n{kept}"


def size_problem(value: Any, what: str, limit: int) -> str:
    """Say why a JSON value is bigger than the hub keeps ("" when it is not)."""
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size <= limit:
        return ""
    return f"{what} is {size:,} bytes of JSON: at most {limit:,} are kept."


def check_text(value: str, where: object) -> None:
    """Raise JSONInputError naming `where` when the text cannot be stored."""
    if problem := text_problem(value):
        raise JSONInputError(f"{str(where)[:100]} {problem}.")
