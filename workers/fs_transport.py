"""kombu's filesystem transport, with messages that appear in the queue folder whole.

kombu's own `_put` creates the message file, then writes it. A consumer polling
the same folder can move the file away between the two, read it empty, and die
on the JSON ("Expecting value: line 1 column 1"): `make run`'s hub worker did,
its beat writing reaper tasks while its consumer read them. Here a message is
written under a name the consumer skips, then renamed into place, which is
atomic within one folder. The embedded broker (workers/broker.py) uses this
transport on every side.
"""

import os
import uuid
from pathlib import Path
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

# The consumer takes only files named "<time>_<uuid>.<queue>.msg"; a leading dot hides one.
STAGING_PREFIX = "."


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put a message on the queue: write it aside, then rename it into the queue folder."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = Path(self.data_folder_out) / name
        staging = final.with_name(STAGING_PREFIX + name)
        try:
            staging.write_bytes(str_to_bytes(dumps(payload)))
            os.replace(staging, final)
        except OSError as exc:
            staging.unlink(missing_ok=True)
            raise ChannelError(f"Cannot add file {str(final)!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
