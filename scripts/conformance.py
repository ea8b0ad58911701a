"""`make conformance`: the conformance corpus through auto mode on the embedded product.

Starts a throwaway embedded hub (SQLite, the filesystem broker and local storage in a
temporary folder, served from this process) and real device workers on one CPU class
(`--worker-python`: `make conformance` passes the product's `.venv`, the `make run`
install), takes every corpus model (tests/conformance_models.py) through upload,
datasets, preflight and auto mode, benchmarks each source file with ONNX Runtime
defaults beside its builds, and prints one row per model (its task, its outcome, and the
headline its recommended build was judged on: top-1, mAP, mIoU, CER or cosine) and the
share that reached the outcome the corpus names for it. Exits 1 unless every model did.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Longer than make test's runs: these figures are printed as speed-ups.
BENCHMARKS = {
    "REALTIME_BENCHMARK": {
        "scenario": "single-stream",
        "batch_size": 1,
        "warmup_s": 0.3,
        "duration_s": 1.5,
    },
    "BATCH_BENCHMARK": {"scenario": "offline", "warmup_s": 0.3, "duration_s": 1.5},
    "COMPARE_BENCHMARK": {"rounds": 6, "duration_s": 0.5, "warmup_s": 0.2},
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names (default: all)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="device workers on the class (1, as make run; more finish sooner on more cores "
        "but time each other's benchmarks)",
    )
    parser.add_argument("--worker-python", default=sys.executable, help="Python of the workers")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds to wait for the runs")
    parser.add_argument("--keep", action="store_true", help="keep the embedded data folder")
    return parser.parse_args()


def embedded_environment(folder):
    """Point Django at a fresh embedded install in `folder`, before it configures itself."""
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "DEPLOYHUB_STORAGE_ROOT"):
        os.environ.pop(name, None)
    os.environ["DEPLOYHUB_VAR_DIR"] = str(folder)
    os.environ["DJANGO_SETTINGS_MODULE"] = "deployhub.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def serve_hub():
    """Serve the hub's WSGI app from a thread of this process; return its URL."""
    from django.core.handlers.wsgi import WSGIHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler)
    server.set_app(WSGIHandler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


class Worker:
    """A real `python -m workers run` process of one device, logging to a file."""

    def __init__(self, python, hub_url, device, token, log_path):
        from django.conf import settings

        self.device, self.log_path = device, log_path
        command = [python, "-m", "workers", "run", "--hub", hub_url, "--token", token]
        command += ["--broker", settings.CELERY_BROKER_URL]
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )

    def ready(self):
        return "ready" in Path(self.log_path).read_text(errors="replace")

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)


def start_workers(args, hub_url, device_class, folder):
    from deployhub.devices.models import Device

    workers = []
    for index in range(args.workers):
        device = Device(device_class=device_class, name=f"conformance-{index}")
        token = device.issue_token()
        device.save()
        log = folder / f"worker-{index}.log"
        workers.append(Worker(args.worker_python, hub_url, device, token, log))
    deadline = time.monotonic() + 120
    while not all(w.ready() for w in workers):
        if time.monotonic() > deadline or any(w.process.poll() is not None for w in workers):
            raise SystemExit(f"a worker did not start; see its log in {folder}")
        time.sleep(0.5)
    return workers


def setup_team():
    from django.contrib.auth import get_user_model

    from deployhub.devices.models import DeviceClass
    from deployhub.teams.models import Membership, Role, Team

    team = Team.objects.create(name="Conformance", slug="conformance")
    user = get_user_model().objects.create_user("conformance", password=uuid.uuid4().hex)
    Membership.objects.create(user=user, team=team, role=Role.ADMIN)
    device_class = DeviceClass.objects.create(
        team=team, slug="conformance-cpu", name="Conformance CPU", frame_budget_ms=33.3
    )
    return team, user, device_class


def run_corpus(args, folder, team, user, device_class):
    from deployhub.engines import auto
    from tests.conformance_models import CORPUS
    from tests.conformance_run import conclude, start_model, summarise, wait_for

    for name, value in BENCHMARKS.items():
        setattr(auto, name, value)
    only = {name for name in args.only.split(",") if name}
    models = [model for model in CORPUS if not only or model.name in only]
    (folder / "models").mkdir()
    rows = []
    for model in models:
        rows.append(start_model(model, folder / "models", team, user, device_class, True))
        print(f"  started {model.name}: {rows[-1].outcome or 'auto mode running'}", flush=True)
    seconds = wait_for(rows, args.timeout)
    return [summarise(conclude(row)) for row in rows], seconds


def _figure(value, form):
    return "-" if value is None else format(value, form)


HEADER = ("model", "task", "outcome", "recommended build", "p50 gain", "headline", "value", "Δ pts")
WIDTHS = (28, 22, 40, 18, 8, 34, 7, 7)
FIGURES = (4, 6, 7)  # the columns right-aligned


def _row(result):
    """Return the table line of one model: text columns left-aligned, figures right-aligned.

    The headline is the figure the recommended build was judged on, in its task's terms
    (top-1, mAP, mIoU or CER with labels; detection F1 or cosine without); Δ is the points
    of it lost against the FP32 source (labelled only).
    """
    from tests.conformance_run import reached

    outcome = result["outcome"] if reached(result) else f"FAIL {result['outcome']}"
    drop = result["drop"]
    cells = (
        result["name"],
        result["task"] or "-",
        outcome,
        result["build"] or "-",
        _figure(result["speedup"], ".2f") + ("x" if result["speedup"] else ""),
        result["headline"] or "-",
        _figure(result["headline_value"], ".3f"),
        _figure(0.0 - drop if drop is not None else None, "+.1f"),  # no "-0.0"
    )
    return "  ".join(
        str(cell).rjust(width) if index in FIGURES else str(cell)[:width].ljust(width)
        for index, (cell, width) in enumerate(zip(cells, WIDTHS, strict=True))
    )


def print_table(results, seconds):
    """Print a row per model and the share that conforms; return True when every model does."""
    from tests.conformance_run import reached

    print("\n" + "  ".join(h.ljust(w) for h, w in zip(HEADER, WIDTHS, strict=True)))
    for result in results:
        print(_row(result))
        for failure in result["failures"]:
            print(f"      failed build {failure[:300]}")
    counted = [r for r in results if not r["skipped"]]
    conforming = sum(reached(r) for r in counted)
    broken = [r["name"] for r in counted if r["failures"]]
    share = 100 * conforming / len(counted) if counted else 0
    print(f"\n{len(counted)} models in {seconds:.0f} s")
    print(
        f"conformance: {conforming}/{len(counted)} models with a recommended build or a named "
        f"preflight refusal ({share:.0f}%)"
    )
    print(f"models with a build that failed after preflight allowed it: {len(broken)}", end="")
    print(f" ({', '.join(broken)})" if broken else "")
    return conforming == len(counted) and not broken


def main():
    args = parse_args()
    folder = Path(tempfile.mkdtemp(prefix="deployhub-conformance-"))
    embedded_environment(folder)
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    hub_url = serve_hub()
    team, user, device_class = setup_team()
    print(f"embedded hub at {hub_url}, data in {folder}", flush=True)
    workers = start_workers(args, hub_url, device_class, folder)
    try:
        results, seconds = run_corpus(args, folder, team, user, device_class)
    finally:
        for worker in workers:
            worker.stop()
    ok = print_table(results, seconds)
    if args.keep or not ok:
        print(f"data and worker logs kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
