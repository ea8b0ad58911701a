"""`deployhub gate MODEL:VERSION --class SLUG ...`: may this version replace production?

For each class named, the gate checks a device is online, finds the baseline (the class's
production release, or a version named with --against), starts the candidate's auto run,
waits for it, and compares its recommended build with the baseline on p99 latency,
accuracy and peak memory (deployhub_client.judge). It prints a table, writes a Markdown
summary for the merge request (--summary) and exits 0 (passed), 1 (a criterion failed)
or 2 (could not decide: no device online, no baseline, no build to compare, timeout).
docs/gate.md is the user's guide.
"""

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from deployhub_client.hub import Hub, HubError
from deployhub_client.judge import (
    EXIT_CODES,
    MARKS,
    ClassReport,
    Limits,
    Outcome,
    Status,
    best_of_version,
    build_label,
    candidate_of,
    failed_builds,
    judge,
    markdown,
    measured,
    outcome_of,
    overall,
    undecided,
)

PRODUCTION = "production"
DEFAULT_TIMEOUT_S = 3600
STYLES = {
    Status.PASS: "green",
    Status.FAIL: "red",
    Status.NOISE: "yellow",
    Status.UNKNOWN: "magenta",
    Outcome.PASSED: "bold green",
    Outcome.FAILED: "bold red",
    Outcome.UNDECIDED: "bold magenta",
}


def parse_ref(ref):
    """Split "MODEL:VERSION" into the model (a name or an id) and the version number."""
    model, _, number = ref.rpartition(":")
    if not model or not number.isdigit():
        raise click.BadParameter(f"{ref!r} is not MODEL:VERSION (digits-cnn:3)", param_hint="REF")
    return model, int(number)


def percent(ctx, param, value):
    """A percentage given as "5%" or "5": answer the fraction (0.05)."""
    try:
        number = float(str(value).strip().removesuffix("%"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a percentage like 5%") from None
    if number < 0:
        raise click.BadParameter("a limit cannot be negative")
    return number / 100


def points(ctx, param, value):
    if value < 0:
        raise click.BadParameter("a limit cannot be negative")
    return value


def against_choice(ctx, param, value):
    """ "production", or a version number of the same model to compare with."""
    if value == PRODUCTION or value.isdigit():
        return value
    raise click.BadParameter(f"say 'production' or a version number, not {value!r}")


# The outcomes of a finished auto run that recommended a build (the hub's AutoRun.outcome).
RECOMMENDED = ("recommended", "recommended_off_gate")


class Gate:
    """One gate's run against a hub: the candidate version, its classes and the limits."""

    def __init__(self, hub, version, against, limits, say, new_run=False):
        self.hub, self.version, self.against, self.limits = hub, version, against, limits
        self.new_run = new_run  # start a run even where the version has one
        self.model = version["model"]
        self.say = say  # say(text): progress for a person, on stderr

    def run(self, slugs, timeout):
        """Judge every class; answer a ClassReport per class, in the order named."""
        reports = self.offline(slugs)
        if reports:
            return reports
        results = self.hub.results(self.model)
        baselines = {slug: self.baseline(results, slug) for slug in slugs}
        runs = {slug: self.start(slug) for slug in slugs if isinstance(baselines[slug], int)}
        runs = self.wait(runs, timeout)
        results = self.hub.results(self.model)
        return [self.compare(slug, baselines[slug], runs.get(slug), results) for slug in slugs]

    def offline(self, slugs):
        """Reports for every class when one is unknown or has no device online, else []: the
        gate cannot pass then, so it starts nothing."""
        classes = {c["slug"]: c for c in self.hub.classes()}
        missing = {}
        for slug in slugs:
            if slug not in classes:
                known = ", ".join(sorted(classes)) or "none"
                missing[slug] = f"no device class {slug!r} in your teams (they have: {known})"
            elif not classes[slug]["online_devices"]:
                missing[slug] = f"no device online in {slug}: nothing can measure the candidate"
        if not missing:
            return []
        names = ", ".join(missing)
        return [
            undecided(slug, missing.get(slug) or f"not started: {names} cannot be judged")
            for slug in slugs
        ]

    def baseline(self, results, slug):
        """The baseline's engine id on the class, or the reason there is none (a str)."""
        if self.against == PRODUCTION:
            live = [
                release
                for release in self.hub.releases.list(self.model)
                if release["state"] == PRODUCTION and release["device_class"] == slug
            ]
            if not live:
                return f"no production release on {slug} to compare with (try --against VERSION)"
            return live[0]["engine"]["id"]
        number = int(self.against)
        version = next((v for v in results["versions"] if v["number"] == number), None)
        engine = best_of_version(results, version["id"], slug) if version else None
        return engine or f"version {number} has no benchmarked build on {slug} to compare with"

    def start(self, slug):
        """The candidate's auto run on the class: the newest one already started, while it
        runs or when it recommended a build, unless a new one is asked for; else one started
        now; or why not (a str)."""
        try:
            newest = None if self.new_run else self.newest_run(slug)
            if newest is not None:
                run = self.hub.auto_run(newest["id"])
                self.say(f"{slug}: auto run #{run['id']} ({run['state']}) is the candidate's")
                return run
            run = self.hub.auto(self.version["id"], slug, wait=False)
        except HubError as exc:
            return f"auto mode refused: {exc.message}"
        self.say(f"{slug}: auto run #{run['id']} started ({self.hub.url}{run['page']})")
        return run

    def newest_run(self, slug):
        """The version's newest auto run on the class when it may stand for the candidate
        (running, or done with a recommendation), else None: a run that failed or found
        nothing to recommend is started again. A hub without the list answers None."""
        try:
            runs = self.hub.auto_runs(self.version["id"], slug)
        except HubError as exc:
            if exc.status == 404:
                return None
            raise
        newest = runs[0] if runs else None
        if newest and (newest["state"] != "done" or newest["outcome"] in RECOMMENDED):
            return newest
        return None

    def wait(self, runs, timeout):
        """Wait for every started run to finish, all within `timeout` seconds together."""
        deadline = time.monotonic() + timeout
        finished: dict[str, Any] = {}  # a slug's run, or why it has none
        for slug, run in runs.items():
            if isinstance(run, str):
                finished[slug] = run
                continue
            left = max(0.0, deadline - time.monotonic())
            try:
                finished[slug] = self.hub.wait_for_run(run, timeout=left)
            except HubError as exc:
                finished[slug] = f"stopped waiting (--timeout {timeout:g} s): {exc.message}"
                continue
            self.say(f"{slug}: auto run #{run['id']} {finished[slug]['outcome_label'].lower()}")
        return finished

    def compare(self, slug, engine, run, results):
        """Judge the class's candidate against its baseline."""
        if isinstance(engine, str):
            return undecided(slug, engine)
        if isinstance(run, str):
            return undecided(slug, run)
        known: dict[str, Any] = {"run": {"id": run["id"], "page": self.hub.url + run["page"]}}
        candidate = candidate_of(run, results)
        if candidate is None:
            failures = "; ".join(failed_builds(run))
            why = f"no build to compare: {run['summary'] or run['outcome_label']}"
            return undecided(slug, f"{why} {failures}".strip(), **known)
        baseline = measured(results, engine, slug, like=candidate)
        known.update(
            candidate=build_label(candidate["benchmark"]), engine=run["recommended"]["engine"]
        )
        if baseline is None:
            return undecided(slug, f"engine #{engine} has no benchmark on {slug}", **known)
        verdicts = judge(candidate, baseline, self.limits)
        return ClassReport(
            slug,
            outcome_of(verdicts),
            baseline=build_label(baseline["benchmark"]),
            verdicts=verdicts,
            **known,
        )


def table(title, reports):
    """The verdicts as a rich table: a row per class and criterion."""
    shown = Table(title=title, show_lines=False)
    for column in ("Class", "Criterion", "Candidate", "Baseline", "Change", "Verdict"):
        shown.add_column(column)
    for report in reports:
        style = STYLES[report.outcome]
        slug = f"[{style}]{report.device_class}[/]"
        if not report.verdicts:
            shown.add_row(slug, "—", "", "", "", f"[{style}]{report.outcome}[/]: {report.reason}")
        for verdict in report.verdicts:
            mark = f"[{STYLES[verdict.status]}]{verdict.status}[/]: {verdict.reason}"
            row = (verdict.criterion, verdict.candidate, verdict.baseline, verdict.change, mark)
            shown.add_row(slug, *row)
            slug = ""
    return shown


def answer_json(ref, against, limits, reports):
    outcome = overall(reports)
    return {
        "candidate": ref,
        "against": against,
        "limits": limits.__dict__,
        "outcome": outcome,
        "exit_code": EXIT_CODES[outcome],
        "classes": [report.as_json() for report in reports],
    }


@click.command("gate")
@click.argument("ref", metavar="MODEL:VERSION")
@click.option(
    "--class",
    "classes",
    metavar="SLUG",
    multiple=True,
    required=True,
    help="A device class to gate on (repeat for several).",
)
@click.option(
    "--against",
    default=PRODUCTION,
    show_default=True,
    callback=against_choice,
    help="Compare with the class's production release, or with this version number.",
)
@click.option(
    "--max-p99-regression",
    default="5%",
    show_default=True,
    callback=percent,
    help="How much slower (p99) the candidate may be.",
)
@click.option(
    "--max-accuracy-drop",
    default=0.5,
    show_default=True,
    type=float,
    callback=points,
    help="How many points of the labelled metric (top-1, mAP, ...) it may lose.",
)
@click.option(
    "--max-memory-growth",
    default="10%",
    show_default=True,
    callback=percent,
    help="How much more peak memory it may take.",
)
@click.option(
    "--summary",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write a Markdown summary to this file (for the merge request).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.option(
    "--new-run",
    is_flag=True,
    help="Start a new auto run on each class even where the version has one already.",
)
@click.option(
    "--timeout",
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to wait for the auto runs, all together.",
)
def gate(ref, classes, against, max_p99_regression, max_accuracy_drop, max_memory_growth, **out):
    """Compare MODEL:VERSION with production on each device class; block a merge if worse.

    Waits for the version's newest auto run on every class (starts one where it has
    none, or with --new-run), compares its recommended build with
    the baseline's on p99 latency, accuracy and peak memory, and exits 0 when every
    class passes, 1 when a criterion fails, 2 when the gate cannot decide (no device
    online, no baseline, no build to compare, timeout). A slowdown that an unstable
    measurement cannot tell from noise is reported "within noise" and does not fail.

    \b
    Example:
      deployhub gate digits-cnn:3 --class edge-cpu --class server-gpu \\
          --max-p99-regression 5% --summary gate.md
    """
    limits = Limits(max_p99_regression, max_accuracy_drop, max_memory_growth)
    model, number = parse_ref(ref)
    slugs = list(dict.fromkeys(classes))  # a class named twice is gated once
    title = f"{model} v{number} against {against}"
    errors, given = Console(stderr=True), root_options()
    out["as_json"] = out["as_json"] or given.get("json")
    try:
        hub = Hub(given.get("url"), given.get("token"))
        version = hub.version(model, number)
        judged = Gate(hub, version, against, limits, errors.print, out["new_run"])
        reports = judged.run(slugs, out["timeout"])
    except HubError as exc:
        reports = [undecided(slug, f"the hub answered {exc}") for slug in slugs]
    finish(title, ref, against, limits, reports, out)


def root_options():
    """What the `deployhub` group was given (--url, --token, --json: deployhub_client.cli),
    or {} when the gate runs as a command of its own."""
    return click.get_current_context().find_root().obj or {}


def finish(title, ref, against, limits, reports, out):
    """Show the verdicts, write the summary and exit with the gate's status."""
    outcome = overall(reports)
    if out["summary"]:
        out["summary"].write_text(markdown(title, against, limits, reports))
    if out["as_json"]:
        click.echo(json.dumps(answer_json(ref, against, limits, reports), indent=2))
    else:
        console = Console()
        console.print(table(title, reports))
        console.print(f"Gate: [{STYLES[outcome]}]{MARKS[outcome]}[/]")
    sys.exit(EXIT_CODES[outcome])
