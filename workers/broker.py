"""Celery settings shared by the hub and the device workers.

Both sides talk to the same broker, so both build their configuration here.
This module imports nothing but the standard library.
"""

from pathlib import Path

FILESYSTEM_SCHEME = "filesystem://"
# kombu's filesystem transport, writing each message whole before the consumer can see it.
FILESYSTEM_TRANSPORT = "workers.fs_transport:Transport"
# Embedded mode polls folders; keep delivery well under the 15 ms budget.
FILESYSTEM_POLLING_INTERVAL = 0.05
# Longer than the longest build: an unacked message is redelivered after it.
VISIBILITY_TIMEOUT = 6 * 3600


def filesystem_folder(broker_url: str) -> Path | None:
    """Return the folder of a `filesystem://<folder>` broker URL, else None."""
    if not broker_url.startswith(FILESYSTEM_SCHEME):
        return None
    folder = broker_url[len(FILESYSTEM_SCHEME) :] or "var/broker"
    return Path(folder).resolve()


def transport_options(broker_url: str) -> dict:
    """Return the kombu transport options for a broker URL."""
    folder = filesystem_folder(broker_url)
    if folder is None:
        return {"visibility_timeout": VISIBILITY_TIMEOUT}
    # Messages carry job ids and the hub's work: for this user only, like the rest of var/.
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for sub in ("queue", "processed", "control"):
        (folder / sub).mkdir(mode=0o700, exist_ok=True)
    return {
        "data_folder_in": str(folder / "queue"),
        "data_folder_out": str(folder / "queue"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
        "polling_interval": FILESYSTEM_POLLING_INTERVAL,
    }


def celery_config(broker_url: str) -> dict:
    """Return the Celery settings every DeployHub process uses."""
    is_filesystem = filesystem_folder(broker_url) is not None
    return {
        "broker_url": FILESYSTEM_SCHEME if is_filesystem else broker_url,
        "broker_transport": FILESYSTEM_TRANSPORT if is_filesystem else None,
        "broker_transport_options": transport_options(broker_url),
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,
        "result_backend": None,
        # The filesystem transport has no broadcast worth relying on.
        "worker_enable_remote_control": not is_filesystem,
        "worker_hijack_root_logger": False,
    }
