"""The Celery settings every DeployHub process shares (docs/design.md, Architecture)."""

import json
from queue import Empty

from celery import Celery
from kombu.transport import filesystem

from workers import fs_transport
from workers.broker import VISIBILITY_TIMEOUT, celery_config, filesystem_folder


def test_it_uses_json_late_acks_and_prefetch_one():
    config = celery_config("redis://127.0.0.1:6379/0")
    assert config["accept_content"] == ["json"] and config["task_serializer"] == "json"
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]
    assert config["worker_prefetch_multiplier"] == 1 and config["task_ignore_result"]
    assert config["broker_transport_options"]["visibility_timeout"] == VISIBILITY_TIMEOUT


def test_the_filesystem_broker_polls_at_least_every_tenth_of_a_second(tmp_path):
    config = celery_config(f"filesystem://{tmp_path / 'broker'}")
    options = config["broker_transport_options"]
    assert config["broker_url"] == "filesystem://"
    assert options["polling_interval"] <= 0.1
    assert options["data_folder_in"] == options["data_folder_out"]
    assert (tmp_path / "broker" / "queue").is_dir()
    assert not config["worker_enable_remote_control"]


def test_only_filesystem_urls_name_a_folder():
    assert filesystem_folder("redis://127.0.0.1:6379/0") is None
    assert filesystem_folder("filesystem:///srv/broker").as_posix() == "/srv/broker"


def test_the_filesystem_broker_carries_a_message_through_deployhubs_transport(tmp_path):
    app = Celery("broker-test")
    app.conf.update(celery_config(f"filesystem://{tmp_path / 'broker'}"))

    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, fs_transport.Transport)
        queue = connection.SimpleQueue("jobs")
        queue.put({"job": 12})
        message = queue.get(timeout=2)
        message.ack()
        queue.close()

    assert message.payload == {"job": 12}


def test_a_consumer_polling_while_a_message_is_written_sees_nothing_yet(tmp_path, monkeypatch):
    app = Celery("broker-test")
    app.conf.update(celery_config(f"filesystem://{tmp_path / 'broker'}"))
    polls = []

    with app.connection_for_write() as connection:
        channel = connection.default_channel

        def dumps_then_poll(payload):
            """Serialise the message, and poll the queue right then, as a consumer might."""
            try:
                polls.append(channel._get("jobs"))
            except Empty:
                polls.append("nothing")
            except ValueError as exc:  # kombu's own transport: the file is there, still empty
                polls.append(f"broken: {exc}")
            return json.dumps(payload)

        for module in (filesystem, fs_transport):
            monkeypatch.setattr(module, "dumps", dumps_then_poll)
        channel._put("jobs", {"body": "whole"})

        assert polls == ["nothing"]
        assert channel._get("jobs") == {"body": "whole"}
