"""The `deployhub` command: the hub's API v1 from a terminal or a CI job (docs/cli.md).

Human output by default, --json on every command for scripts. Exit codes (EXIT below):
0 done, 1 what was asked ran and failed (a failed job, an auto run with no recommendation,
a refused engine, a 409), 2 usage or a request the hub refused as wrong (400), 3 no or a
refused token (401/403), 4 not found (404), 5 the hub could not answer (unreachable, 429, 5xx).
"""

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from deployhub_client import config
from deployhub_client.hub import Hub, HubError, Unreachable

OK, FAILED, USAGE, AUTH, NOT_FOUND, UNAVAILABLE = 0, 1, 2, 3, 4, 5
EXIT = {
    OK: "done",
    FAILED: "ran and failed: a failed job, no recommendation, a refused engine, a 409",
    USAGE: "wrong arguments, or the hub refused the request as wrong (400, 413)",
    AUTH: "no token, an unknown one (401) or not allowed (403)",
    NOT_FOUND: "no such object, or another team's (404)",
    UNAVAILABLE: "the hub could not be reached or could not answer (429, 5xx)",
}
NO_RECOMMENDATION = ("nothing_eligible", "all_failed", "nothing_tried")

# operationId -> the command line that calls it (read by the docs' generator).
COMMANDS_BY_OPERATION = {
    "models": "deployhub models list",
    "create_model_with_its_file": "deployhub models upload FILE --model NEW-NAME",
    "upload_version": "deployhub models upload FILE --model NAME",
    "model_detail": "deployhub models show MODEL",
    "attach_dataset": "deployhub datasets add FILE --version MODEL[:VERSION] --kind validation",
    "version_auto": "deployhub auto MODEL[:VERSION] --class SLUG",
    "auto_run_detail": "deployhub auto MODEL[:VERSION] --class SLUG --wait",
    "version_auto_runs": "deployhub gate MODEL:VERSION --class SLUG",
    "model_results_json": "deployhub results MODEL",
    "model_results_csv": "deployhub results MODEL --csv",
    "jobs_submit": "deployhub jobs submit KIND --version MODEL[:VERSION] --class SLUG",
    "jobs_list": "deployhub jobs list",
    "job_detail": "deployhub jobs watch JOB",
    "job_cancel": "deployhub jobs cancel JOB",
    "job_log": "deployhub jobs log JOB",
    "device_classes": "deployhub classes",
    "devices_list": "deployhub devices",
    "engine_detail": "deployhub engines show ENGINE",
    "engine_compatibility": "deployhub engines download ENGINE",
    "engine_file": "deployhub engines download ENGINE --any-machine",
    "engine_releases": "deployhub releases propose ENGINE",
    "release_detail": "deployhub releases show RELEASE",
    "release_submit": "deployhub releases submit RELEASE",
    "release_reviews": "deployhub releases review RELEASE --decision approve",
    "release_promote": "deployhub releases promote RELEASE",
    "release_rollback": "deployhub releases rollback RELEASE --reason TEXT",
    "model_releases": "deployhub releases list MODEL",
}


def exit_code_of(error: HubError) -> int:
    """The exit code a refused call ends the command with."""
    if isinstance(error, Unreachable) or error.status == 429 or error.status >= 500:
        return UNAVAILABLE
    if error.status in (401, 403):
        return AUTH
    if error.status == 404:
        return NOT_FOUND
    if error.status in (400, 413, 414):
        return USAGE
    return FAILED


class Group(click.Group):
    """Ends every command on a HubError with its message and exit code (docs/cli.md)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except HubError as error:
            as_json = ctx.find_root().ensure_object(dict).get("json")
            if as_json:
                click.echo(json.dumps({"error": error.message, "status": error.status}))
            else:
                click.echo(f"Error: {error.message}", err=True)
            ctx.exit(exit_code_of(error))


def with_json(command):
    """Add --json to a command: its answer as JSON on stdout instead of text or a table."""

    def remember(ctx, _param, value):
        root = ctx.find_root().ensure_object(dict)
        root["json"] = root.get("json") or value
        return value

    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        expose_value=False,
        callback=remember,
        is_eager=True,
        help="Print the answer as JSON.",
    )(command)


def json_mode() -> bool:
    return bool(click.get_current_context().find_root().ensure_object(dict).get("json"))


def console() -> Console:
    return Console(stderr=False, soft_wrap=True)


def hub() -> Hub:
    """The hub of the command line's --url/--token, else of the environment or login file."""
    root = click.get_current_context().find_root().ensure_object(dict)
    return Hub(root.get("url"), root.get("token"))


def show(answer, human=None) -> None:
    """Print an answer: JSON with --json, else human(answer) (or the JSON, indented)."""
    if json_mode() or human is None:
        click.echo(json.dumps(answer, indent=None if json_mode() else 2, default=str))
    else:
        human(answer)


def table(title, columns, rows) -> None:
    """Print rows (lists of cells) under columns as a table."""
    grid = Table(title=title)
    for column in columns:
        grid.add_column(column)
    for row in rows:
        grid.add_row(*("" if cell is None else str(cell) for cell in row))
    console().print(grid)


def json_value(text):
    """A JSON option's value: inline JSON, or @path to a JSON file."""
    if text is None:
        return None
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from exc


def model_and_number(text):
    """MODEL[:VERSION] -> (model name or id, version number or None)."""
    model, _, number = text.partition(":")
    if number and not number.isdigit():
        raise click.BadParameter(f"{text!r}: the version after ':' is a number (resnet18:3).")
    return model, int(number) if number else None


def version_id(client, text):
    """The id of the version MODEL[:VERSION] names (the model's newest without a number)."""
    return client.version(*model_and_number(text))["id"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", envvar=config.URL_VARIABLE, help="The hub, e.g. https://hub.example.")
@click.option("--token", envvar=config.TOKEN_VARIABLE, help="A personal or pipeline token.")
@with_json
@click.pass_context
def cli(ctx, url, token):
    """DeployHub from the command line: upload models, run auto mode, follow jobs, download
    engines and release them.

    \b
    Example:
      deployhub login --url https://hub.example
      deployhub models upload resnet18.onnx --model resnet18
      deployhub auto resnet18 --class local-cpu --wait
    """
    ctx.ensure_object(dict).update(url=url, token=token)


@cli.command()
@click.option("--url", "login_url", help="The hub's address (asked when not given).")
@click.option("--token", "login_token", help="Your token (asked, hidden, when not given).")
@click.option("--no-check", is_flag=True, help="Store them without asking the hub first.")
@with_json
def login(login_url, login_token, no_check):
    """Store the hub's URL and your token in ~/.config/deployhub/client.json (mode 0600).

    The token is checked with the hub first (exit 3 when it refuses it). DEPLOYHUB_URL and
    DEPLOYHUB_TOKEN, when set, override what is stored.

    \b
    Example:
      deployhub login --url https://hub.example --token dhu_...
    """
    url = login_url or click.prompt("Hub URL")
    token = login_token or click.prompt("Token", hide_input=True)
    if not no_check:
        Hub(url, token).classes()
    path = config.save(url, token)
    show({"url": url, "config": str(path)}, lambda a: click.echo(f"Logged in to {url} ({path})."))


@cli.group(cls=Group)
def models():
    """Models and their versions.

    \b
    Example:
      deployhub models upload resnet18.onnx --model resnet18
    """


@models.command("list")
@with_json
def models_list():
    """List the models of your teams.

    \b
    Example:
      deployhub models list --json
    """
    answer = hub().models()
    show(
        answer,
        lambda rows: table(
            "Models", ["id", "name", "team"], [[m["id"], m["name"], m["team"]] for m in rows]
        ),
    )


@models.command("show")
@click.argument("model")
@with_json
def models_show(model):
    """Show a model (by id or name) with its versions.

    \b
    Example:
      deployhub models show resnet18
    """
    answer = hub().model(model)
    columns = ["version", "id", "format", "sha256"]
    show(
        answer,
        lambda m: table(
            f"{m['name']} (#{m['id']})",
            columns,
            [[v["number"], v["id"], v["format"], v["sha256"][:12]] for v in m.get("versions", [])],
        ),
    )


def sending(description, send):
    """Run send(on_progress) under a progress bar of the bytes sent (on stderr, so --json
    output stays clean); answer what it answers."""
    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bar:
        task = bar.add_task(description, total=None)
        return send(lambda sent, total: bar.update(task, completed=sent, total=total))


@models.command("upload")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--model", required=True, help="The model's name (created when new) or id.")
@click.option("--team", help="The team of a new model (when you are in several).")
@click.option("--contract", help="The input-shape contract: JSON, or @file.json.")
@click.option("--spec", help="The preprocessing spec: JSON, or @file.json.")
@click.option("--notes", default="", help="The version's notes.")
@click.option("--export-on", help="A .pt2's device class to export it to ONNX on.")
@with_json
def models_upload(file, model, team, contract, spec, notes, export_on):
    """Upload a model file (ONNX or .pt2) as a new version, with a progress bar.

    \b
    Example:
      deployhub models upload resnet18.onnx --model resnet18 --spec @preprocessing.json
    """
    client = hub()
    answer = sending(
        f"Uploading {file.name}",
        lambda on_progress: client.upload(
            file,
            model=model,
            contract=json_value(contract),
            spec=json_value(spec),
            notes=notes,
            team=team,
            export_on=export_on,
            on_progress=on_progress,
        ),
    )
    show(
        answer,
        lambda v: click.echo(
            f"Version {v['number']} of model #{v['model']} (version id {v['id']}, sha256 "
            f"{v['sha256'][:12]})."
        ),
    )


@cli.group(cls=Group)
def datasets():
    """Validation and calibration datasets.

    \b
    Example:
      deployhub datasets add val.zip --version resnet18 --kind validation --name val
    """


@datasets.command("add")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--version", "version", required=True, help="MODEL[:VERSION] it belongs to.")
@click.option("--kind", type=click.Choice(["validation", "calibration"]), required=True)
@click.option("--name", help="The dataset's name (the file's stem when not given).")
@with_json
def datasets_add(file, version, kind, name):
    """Attach a dataset file to a model's version.

    \b
    Example:
      deployhub datasets add calib.zip --version resnet18:2 --kind calibration
    """
    client = hub()
    pk = version_id(client, version)
    answer = sending(
        f"Uploading {file.name}",
        lambda on_progress: client.add_dataset(
            pk, file, kind=kind, name=name or file.stem, on_progress=on_progress
        ),
    )
    show(answer, lambda d: click.echo(f"Dataset {d['name']} (#{d['id']}, {d['samples']} samples)."))


def builds_table(run) -> Table:
    """An auto run's builds as a table: what each did, its figures and the recommendation."""
    grid = Table(title=f"Auto run #{run['id']}: {run.get('summary') or run['state']}")
    for column in ("build", "backend", "precision", "state", "p99 ms", "img/s", "accuracy"):
        grid.add_column(column)
    recommended = (run.get("recommended") or {}).get("build")
    for build in run.get("builds", []):
        bench, accuracy = build.get("benchmark") or {}, build.get("accuracy") or {}
        mark = " ★" if build["id"] == recommended else ""
        grid.add_row(
            f"{build['id']}{mark}",
            build["backend"],
            build["precision"],
            build.get("skipped") or (build.get("failure") or {}).get("label") or build["state"],
            str(bench.get("p99_ms", "")),
            str(bench.get("throughput_ips", "")),
            str(accuracy.get("headline_value", accuracy.get("top1_agreement", ""))),
        )
    return grid


@cli.command()
@click.argument("model_version", metavar="MODEL[:VERSION]")
@click.option("--class", "device_class", required=True, help="The device class's slug.")
@click.option("--wait/--no-wait", default=True, help="Follow the run until it is done.")
@click.option("--timeout", type=float, help="Give up waiting after this many seconds.")
@click.option("--poll", type=float, default=5.0, help="Seconds between looks at the run.")
@with_json
def auto(model_version, device_class, wait, timeout, poll):
    """Run auto mode on a version for a device class: every build tried, one recommended.

    With --wait, a live table shows the builds as they finish; the exit code is 1 when the
    run recommends nothing.

    \b
    Example:
      deployhub auto resnet18:2 --class local-cpu --wait
    """
    client = hub()
    version = version_id(client, model_version)
    if not wait or json_mode():
        run = client.auto(version, device_class, wait=wait, poll_seconds=poll, timeout=timeout)
    else:
        with Live(console=console(), refresh_per_second=2) as live:
            run = client.auto(
                version,
                device_class,
                poll_seconds=poll,
                timeout=timeout,
                on_progress=lambda seen: live.update(builds_table(seen)),
            )
    show(run, lambda r: click.echo(r.get("summary") or f"Auto run #{r['id']} is {r['state']}."))
    if run["state"] == "done" and run.get("outcome") in NO_RECOMMENDATION:
        sys.exit(FAILED)


@cli.group(cls=Group)
def jobs():
    """Jobs: submit, follow, cancel, read logs.

    \b
    Example:
      deployhub jobs watch 101
    """


def job_line(job):
    progress = f" {job['progress']:.0%}" if job.get("progress") else ""
    error = f": {job['error']}" if job.get("error") else ""
    return f"Job #{job['id']} ({job['kind']}) {job['state']}{progress}{error}"


@jobs.command("submit")
@click.argument(
    "kind",
    type=click.Choice(["compile", "benchmark", "batch-sweep", "evaluate", "parity", "export"]),
)
@click.option("--version", "version", help="MODEL[:VERSION] to run on.")
@click.option("--engine", type=int, help="An engine's id (benchmark, evaluate).")
@click.option("--class", "device_class", help="The device class's slug.")
@click.option("--backend", help="A compile's backend (onnxruntime, openvino, tensorrt...).")
@click.option(
    "--field",
    "fields",
    multiple=True,
    metavar="NAME=JSON",
    help='Another body field, e.g. --field build_config=\'{"precision":"int8"}\'.',
)
@with_json
def jobs_submit(kind, version, engine, device_class, backend, fields):
    """Queue a job of any kind a page queues.

    \b
    Example:
      deployhub jobs submit compile --version resnet18 --class local-cpu --backend openvino
    """
    client = hub()
    extra = {}
    for field in fields:
        name, _, value = field.partition("=")
        extra[name] = json_value(value)
    answer = client.jobs.submit(
        kind,
        model_version=version_id(client, version) if version else None,
        engine=engine,
        device_class=device_class,
        backend=backend,
        **extra,
    )
    show(
        answer,
        lambda a: click.echo(
            job_line(a["job"]) if a.get("job") else f"Reused engine #{a['engine']}: nothing queued."
        ),
    )


@jobs.command("list")
@click.option("--state", help="queued, running, succeeded, failed or cancelled.")
@click.option("--kind", help="compile, benchmark, evaluate...")
@click.option("--class", "device_class", help="A device class's slug.")
@with_json
def jobs_list(state, kind, device_class):
    """List your teams' jobs, newest first.

    \b
    Example:
      deployhub jobs list --state running
    """
    answer = hub().jobs.list(state=state, kind=kind, device_class=device_class)
    show(
        answer,
        lambda rows: table(
            "Jobs",
            ["id", "kind", "state", "class", "device"],
            [
                [j["id"], j["kind"], j["state"], j.get("device_class"), j.get("device")]
                for j in rows
            ],
        ),
    )


@jobs.command("watch")
@click.argument("job", type=int)
@click.option("--poll", type=float, default=2.0, help="Seconds between looks.")
@with_json
def jobs_watch(job, poll):
    """Follow a job until it ends; exit 1 when it failed or was cancelled.

    \b
    Example:
      deployhub jobs watch 101
    """
    client = hub()
    said = set()

    def progress(seen):
        line = job_line(seen)
        if line not in said and not json_mode():
            said.add(line)
            click.echo(line, err=True)

    answer = client.jobs.watch(job, on_progress=progress, poll_seconds=poll)
    show(answer, lambda j: click.echo(job_line(j)))
    if answer["state"] != "succeeded":
        sys.exit(FAILED)


@jobs.command("cancel")
@click.argument("job", type=int)
@with_json
def jobs_cancel(job):
    """Cancel a queued job, or stop a running one (exit 1 when it had ended already).

    \b
    Example:
      deployhub jobs cancel 101
    """
    show(hub().jobs.cancel(job), lambda j: click.echo(job_line(j)))


@jobs.command("log")
@click.argument("job", type=int)
@with_json
def jobs_log(job):
    """Print a job's whole log.

    \b
    Example:
      deployhub jobs log 101 > job-101.log
    """
    text = hub().jobs.log(job)
    show({"job": job, "log": text}, lambda a: click.echo(a["log"], nl=False))


RESULT_COLUMNS = (
    "id",
    "version",
    "device_class",
    "engine",
    "precision",
    "batch_size",
    "p99_ms",
    "sustained_throughput_ips",
    "gate",
)


@cli.command()
@click.argument("model")
@click.option("--csv", "as_csv", is_flag=True, help="The benchmarks as CSV (the hub's columns).")
@click.option("--class", "device_class", multiple=True, help="Only this class (repeatable).")
@with_json
def results(model, as_csv, device_class):
    """A model's benchmark results: a table, --json (every run, accuracy too) or --csv.

    \b
    Example:
      deployhub results resnet18 --class local-cpu --csv > results.csv
    """
    filters: dict[str, Any] = {"device_class": list(device_class) or None}
    if as_csv:
        click.echo(hub().results_csv(model, **filters), nl=False)
        return
    answer = hub().results(model, **filters)
    show(
        answer,
        lambda a: table(
            f"Results of {a['model']['name']}",
            RESULT_COLUMNS,
            [[run.get(column) for column in RESULT_COLUMNS] for run in a.get("benchmarks", [])],
        ),
    )


@cli.group(cls=Group)
def engines():
    """Engines: show one, download one (checked).

    \b
    Example:
      deployhub engines download 17 --dest engines/
    """


@engines.command("show")
@click.argument("engine", type=int)
@with_json
def engines_show(engine):
    """Show an engine: its build, status, sha256 and release gates.

    \b
    Example:
      deployhub engines show 17
    """
    answer = hub().engines.get(engine)
    show(
        answer,
        lambda e: click.echo(
            f"Engine #{e['id']}: {e['backend']} {e.get('build_config')} on {e['device_class']}, "
            f"{e['status']}, sha256 {e['sha256']}"
        ),
    )


@engines.command("download")
@click.argument("engine", type=int)
@click.option(
    "--dest",
    type=click.Path(path_type=Path),
    default=Path("."),
    help="A folder (default: here) or a file path.",
)
@click.option(
    "--any-machine",
    is_flag=True,
    help="Keep an engine built for another toolchain than this machine's.",
)
@click.option(
    "--public-key",
    envvar="DEPLOYHUB_SIGNING_KEY",
    help="The hub's Ed25519 public key (hex) to check the signature with.",
)
@with_json
def engines_download(engine, dest, any_machine, public_key):
    """Download an engine, kept only when its sha256 and the hub's signature check out
    (exit 1 otherwise, nothing kept).

    \b
    Example:
      deployhub engines download 17 --dest engines/
    """
    path = hub().engines.download(
        engine, dest, for_this_machine=not any_machine, public_key=public_key
    )
    show({"engine": engine, "path": str(path)}, lambda a: click.echo(f"Saved {a['path']}."))


@cli.group(cls=Group)
def releases():
    """Releases: propose an engine for production, review, promote, roll back.

    \b
    Example:
      deployhub releases propose 17 --note "fastest within tolerance"
    """


def release_line(release):
    return (
        f"Release #{release['id']} is {release['state']}: {release.get('state_reason') or ''}"
    ).rstrip(": ")


@releases.command("propose")
@click.argument("engine", type=int)
@click.option("--note", default="", help="Why this engine.")
@click.option("--class", "device_class", help="The engine's own device class (a check).")
@with_json
def releases_propose(engine, note, device_class):
    """Propose an engine for production on its device class (a draft).

    \b
    Example:
      deployhub releases propose 17 --note "int8, within tolerance"
    """
    show(hub().releases.propose(engine, note=note, device_class=device_class), release_echo)


def release_echo(release):
    click.echo(release_line(release))


@releases.command("show")
@click.argument("release", type=int)
@with_json
def releases_show(release):
    """Show a release: state, gates, reviews.

    \b
    Example:
      deployhub releases show 7
    """
    show(hub().releases.get(release), release_echo)


@releases.command("list")
@click.argument("model")
@with_json
def releases_list(model):
    """List a model's releases, newest first.

    \b
    Example:
      deployhub releases list resnet18
    """
    answer = hub().releases.list(model)
    show(
        answer,
        lambda rows: table(
            "Releases",
            ["id", "state", "class", "engine"],
            [
                [r["id"], r["state"], r["device_class"], (r.get("engine") or {}).get("id")]
                for r in rows
            ],
        ),
    )


@releases.command("submit")
@click.argument("release", type=int)
@with_json
def releases_submit(release):
    """Send a draft release for review.

    \b
    Example:
      deployhub releases submit 7
    """
    show(hub().releases.submit(release), release_echo)


@releases.command("review")
@click.argument("release", type=int)
@click.option(
    "--decision", type=click.Choice(["approve", "request_changes", "reject"]), required=True
)
@click.option("--comment", default="", help="What you checked, or what to change.")
@with_json
def releases_review(release, decision, comment):
    """Review a release (never your own).

    \b
    Example:
      deployhub releases review 7 --decision approve --comment "evidence checked"
    """
    show(hub().releases.review(release, decision, comment), release_echo)


@releases.command("promote")
@click.argument("release", type=int)
@with_json
def releases_promote(release):
    """Put an approved release in production.

    \b
    Example:
      deployhub releases promote 7
    """
    show(hub().releases.promote(release), release_echo)


@releases.command("rollback")
@click.argument("release", type=int)
@click.option("--reason", required=True, help="Why it is rolled back.")
@with_json
def releases_rollback(release, reason):
    """Roll back a production release; the one it replaced is production again.

    \b
    Example:
      deployhub releases rollback 7 --reason "p99 regression in the field"
    """
    show(hub().releases.rollback(release, reason), release_echo)


@cli.command()
@with_json
def classes():
    """List your teams' device classes with their budgets and online devices.

    \b
    Example:
      deployhub classes --json
    """
    answer = hub().classes()
    show(
        answer,
        lambda rows: table(
            "Device classes",
            ["slug", "team", "gate", "online"],
            [
                [
                    c["slug"],
                    c["team"],
                    (c.get("budget") or {}).get("gate"),
                    ", ".join(c.get("online_devices") or []),
                ]
                for c in rows
            ],
        ),
    )


@cli.command()
@click.option("--class", "device_class", help="Only this class's devices.")
@with_json
def devices(device_class):
    """List your teams' devices.

    \b
    Example:
      deployhub devices --class local-cpu
    """
    answer = hub().devices(device_class=device_class)
    show(
        answer,
        lambda rows: table(
            "Devices",
            ["id", "name", "class", "state"],
            [[d["id"], d["name"], d["device_class"], d.get("state")] for d in rows],
        ),
    )


def add_gate():
    """Register `deployhub gate` when its module is there (deployhub_client/gate.py)."""
    if importlib.util.find_spec("deployhub_client.gate") is None:
        return
    from deployhub_client import gate

    cli.add_command(gate.gate, "gate")


add_gate()


def main():
    """The console script `deployhub`."""
    cli(obj={})
