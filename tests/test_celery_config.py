"""The Celery settings every DeployHub process shares (DESIGN.md, Celery settings)."""

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
