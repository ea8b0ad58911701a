"""Where the client finds its hub and token: arguments, then the environment
(DEPLOYHUB_URL, DEPLOYHUB_TOKEN), then the file `deployhub login` writes.

The file is ~/.config/deployhub/client.json ($XDG_CONFIG_HOME/deployhub/client.json when
that is set), mode 0600 in a folder of mode 0700: it holds a personal token.
"""

import json
import os
from pathlib import Path

URL_VARIABLE = "DEPLOYHUB_URL"
TOKEN_VARIABLE = "DEPLOYHUB_TOKEN"


def config_path() -> Path:
    """The file `deployhub login` writes and every command reads."""
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "deployhub" / "client.json"


def load() -> dict:
    """The stored {"url", "token"}, or {} when nobody has logged in (or the file is unreadable)."""
    try:
        stored = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def save(url: str, token: str) -> Path:
    """Store the hub's URL and the token for later commands, readable by this user only."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    # Created 0600 before the token is written: never readable by others, even for a moment.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump({"url": url, "token": token}, file)
    path.chmod(0o600)
    return path


def resolve(url: str | None = None, token: str | None = None) -> tuple[str | None, str | None]:
    """The URL and token to use: those given, else the environment's, else the stored ones."""
    stored = load()
    url = url or os.environ.get(URL_VARIABLE) or stored.get("url")
    token = token or os.environ.get(TOKEN_VARIABLE) or stored.get("token")
    return url, token
