"""The compose stack and the CI entry run only commands that exist in this project."""

import re
import tomllib
from pathlib import Path

import yaml
from django.conf import settings
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
COMPOSE = (ROOT / "docker-compose.yml").read_text()


def compose_services():
    """Return every service of the compose stack, the commented GPU workers included."""
    uncommented = re.sub(r"^  # (?=[\w-]*gpu-worker:|  )", "  ", COMPOSE, flags=re.MULTILINE)
    return yaml.safe_load(uncommented)["services"]


def compose_commands():
    """Return the command lists of every service."""
    return {name: svc["command"] for name, svc in compose_services().items() if "command" in svc}


def check_command(command):
    """Return a reason when the command names something this project does not have."""
    program, args = command[0], command[1:]
    if program == "python" and args[0] == "manage.py":
        return None if args[1] in get_commands() else f"no management command {args[1]}"
    if program == "celery":
        app = args[args.index("-A") + 1]
        return None if (ROOT / app / "celery.py").exists() else f"no Celery app {app}"
    if program == "gunicorn":
        module = args[0].split(":")[0].replace(".", "/") + ".py"
        return None if (ROOT / module).exists() else f"no WSGI module {args[0]}"
    if program in PYPROJECT["project"]["scripts"]:
        target = PYPROJECT["project"]["scripts"][program].split(":")[0]
        return None if (ROOT / (target.replace(".", "/") + ".py")).exists() else f"no {target}"
    if program in ("redis-server", "pg_isready"):
        return None
    return f"unknown program {program}"


def test_every_compose_command_exists_in_the_project():
    commands = compose_commands()
    assert {"web", "hub-worker", "cpu-worker", "gpu-worker", "migrate"} <= set(commands)
    problems = {name: check_command(cmd) for name, cmd in commands.items()}
    assert {name: why for name, why in problems.items() if why} == {}


def test_every_hub_gunicorn_answers_a_url_too_long_in_json():
    """gunicorn's own 414 is an HTML page; the hub's worker class answers it in JSON."""
    from deployhub.gunicorn_worker import WORKER_CLASS

    gunicorns = {name: cmd for name, cmd in compose_commands().items() if cmd[0] == "gunicorn"}
    assert set(gunicorns) == {"web", "devices"}
    for name, command in gunicorns.items():
        assert command[command.index("--worker-class") + 1] == WORKER_CLASS, name


def test_the_check_catches_a_command_that_does_not_exist():
    assert check_command(["python", "manage.py", "no_such_command"])
    assert check_command(["deployhub-nothing", "run"])


def test_device_workers_talk_to_the_hubs_own_device_processes():
    services = compose_services()
    assert services["devices"]["command"][:2] == services["web"]["command"][:2]  # the same hub
    allowed = re.search(r"ALLOWED_HOSTS: \$\{ALLOWED_HOSTS:-([^}]*)\}", COMPOSE).group(1)
    for worker in ("cpu-worker", "gpu-worker"):
        assert services[worker]["environment"]["DEPLOYHUB_HUB_URL"] == "http://devices:8000"
        assert "devices" in services[worker]["depends_on"]
    assert "devices" in allowed.split(",")  # else the hub answers the workers 400


def test_only_the_device_api_skips_the_connection_health_check():
    """A heartbeat's third round trip was the check; pages and hub tasks keep it, so a database
    restart costs people no request. bench/stack.py runs the devices service as compose does."""
    from bench.stack import DEVICE_ENV

    services = compose_services()
    assert services["devices"]["environment"]["DATABASE_CONN_HEALTH_CHECKS"] == "false"
    assert (
        services["devices"]["environment"]["DATABASE_URL"]
        == services["web"]["environment"]["DATABASE_URL"]
    )
    for name in ("web", "hub-worker"):
        assert "DATABASE_CONN_HEALTH_CHECKS" not in services[name]["environment"]
    assert settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] is True  # the default
    for name, value in DEVICE_ENV.items():  # the bench measures the stack compose runs
        assert services["devices"]["environment"][name] == value


def test_page_renders_yield_the_cpu_to_devices_and_the_database_and_the_bench_runs_it_so():
    """Heartbeats waited behind page renders on a busy host. Compose gives the web a quarter
    of the default weight; bench/stack.py gives its gunicorn the nice of about that weight."""
    from bench.stack import NICE_WEIGHT, WEB_CPU_SHARES, WEB_NICE

    services = compose_services()
    assert services["web"]["cpu_shares"] == WEB_CPU_SHARES == 256
    for name, service in services.items():
        if name != "web":
            assert "cpu_shares" not in service, name  # the default, 1024
    share, weight = WEB_CPU_SHARES / 1024, NICE_WEIGHT[WEB_NICE] / NICE_WEIGHT[0]
    assert abs(weight - share) / share < 0.1


def test_the_bench_starts_a_process_at_the_nice_it_is_given():
    import os
    import sys
    import tempfile

    from bench.stack import Stack

    stack = Stack.__new__(Stack)  # only its start(): no hub is started
    stack.env, stack.logs = dict(os.environ), tempfile.TemporaryFile()
    code = "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"
    process = stack.start(sys.executable, "-c", code, nice=3)
    process.wait(timeout=30)
    stack.logs.seek(0)
    assert int(stack.logs.read()) == os.getpriority(os.PRIO_PROCESS, 0) + 3


def test_the_hub_worker_runs_beat_for_the_reaper():
    command = compose_commands()["hub-worker"]
    assert "--beat" in command and "hub" in command


def test_ci_runs_make_test_and_nothing_else():
    lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == ["make test"]
