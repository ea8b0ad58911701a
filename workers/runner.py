"""Run one attempt of a hub job: claim, heartbeat, download, work, complete.

The work itself is the job kind's module in workers/jobs/; this module does the rest
of an attempt's life, the same for every kind.

The broker message is only a hint; the hub's answers decide. A 409 at claim
means the message was stale or redelivered, and a 409 later means the hub gave
the job to another attempt: either way this worker drops it quietly.
"""

import hashlib
import logging
import threading
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from workers import fingerprint as fingerprints
from workers import signing
from workers.backends.isolate import CompileFailure
from workers.client import RETRY_STATUSES, Conflict, HubError, HubUnreachable
from workers.errors import ERROR_MAX_CHARS, Cancelled, JobError, one_line
from workers.jobs import known as jobs
from workers.kinds import is_engine_input
from workers.scratch import scratch_dir

__all__ = ["Cancelled", "run_job"]

logger = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 30
# Progress reaches the hub at most this often (seconds), so a user watches it move.
PROGRESS_INTERVAL = 0.5
DROPPED = "dropped"
CHUNK_BYTES = 1024 * 1024
# Downloads, uploads and the completion wait this long for a hub that answers 503 or not at
# all (its database restarting): giving up would throw the work away and run the job again.
HUB_PATIENCE_SECONDS = 120
HUB_RETRY_PAUSE_SECONDS = 2


def run_job(client, job_id, attempt, workdir_root=None, fingerprint=None, signing_public_key=None):
    """Run one attempt of a job; return its final state, or "dropped".

    fingerprint is the one the worker last reported to the hub (collected when
    None); signing_public_key is the hub's, from `GET device`, to verify engines.
    """
    try:
        job = {**client.claim(job_id, attempt), "id": job_id, "attempt": attempt}
    except HubError as error:
        if not _is_lost(error):
            raise
        logger.info("job %s attempt %s not claimed, message dropped: %s", job_id, attempt, error)
        return DROPPED
    return JobRun(client, job, fingerprint, signing_public_key).run(workdir_root)


def run_claimed_job(client, job, workdir_root=None, fingerprint=None, signing_public_key=None):
    """Run a job the hub has already claimed for this device (HTTPS mode: POST device/work
    answers with it); return its final state."""
    return JobRun(client, job, fingerprint, signing_public_key).run(workdir_root)


class JobLog:
    """Timestamped log lines of a job, remembering which ones the hub has."""

    def __init__(self, job_id):
        self.job_id = job_id
        self._lines = []
        self._sent = 0
        self._lock = threading.Lock()

    def add(self, message):
        """Add a line, stamped with the current UTC time."""
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        logger.info("job %s: %s", self.job_id, message)
        with self._lock:
            self._lines.append(f"{stamp} {message}\n")

    def unsent(self):
        """Return (text of the lines the hub does not have yet, mark for mark_sent)."""
        with self._lock:
            return "".join(self._lines[self._sent :]), len(self._lines)

    def mark_sent(self, mark):
        """Record that the hub received the lines up to mark."""
        with self._lock:
            self._sent = max(self._sent, mark)


class JobProgress:
    """The latest progress of a job, written by the work and read by the heartbeat."""

    def __init__(self, log):
        self.log = log
        self.fraction = 0.0
        self.message = "starting"

    def update(self, fraction, message):
        """Record progress; log the message when it changes (a new phase)."""
        if message != self.message:
            self.log.add(message)
        self.fraction, self.message = round(fraction, 4), message


class JobHeartbeat:
    """Heartbeat a running job from a thread, watching for cancel and loss, until the hub has
    its completion: a completion retried without them would outlive the lease."""

    def __init__(self, client, job, progress, log):
        self.client = client
        self.job_id, self.attempt = job["id"], job["attempt"]
        self.interval = (job.get("lease_seconds") or DEFAULT_LEASE_SECONDS) / 3
        self.progress, self.log = progress, log
        self.cancel = threading.Event()
        self.lost = False
        self.work_done = False
        self._beating = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"job-{self.job_id}-heartbeat", daemon=True
        )

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stopped.set()
        self._thread.join()

    def _loop(self):
        """Beat every interval, sooner when progress moved, until stopped or lost."""
        last_beat, last_sent = time.monotonic(), None
        while not self._stopped.wait(min(self.interval, PROGRESS_INTERVAL)) and not self.lost:
            state = (self.progress.fraction, self.progress.message)
            due = time.monotonic() - last_beat >= self.interval
            if due or state != last_sent:
                self.beat()
                last_beat, last_sent = time.monotonic(), state

    def beat(self):
        """Send one heartbeat; set cancel on cancel_requested, lost on a 409. Once the work is
        done, a beat only extends the lease: the completion carries the log."""
        with self._beating:
            if self.work_done:
                self._send()
                return
            text, mark = self.log.unsent()
            fields = {"progress": self.progress.fraction, "message": self.progress.message}
            answer = self._send(**fields, log=text or None)
            if answer is None:
                return
            self.log.mark_sent(mark)
            if answer.get("cancel_requested") and not self.cancel.is_set():
                self.log.add("cancel requested by the hub")
                self.cancel.set()

    def finish_work(self):
        """Beat on only to keep the lease while the completion is sent; a beat sending log
        lines finishes first, so that no line reaches the hub twice."""
        with self._beating:
            self.work_done = True

    def _send(self, **fields):
        """Send a heartbeat; return the hub's answer, or None when it failed."""
        try:
            return self.client.job_heartbeat(self.job_id, self.attempt, **fields)
        except Exception as error:
            self._failed(error)
            return None

    def _failed(self, error):
        """Stop the work when the hub gave the job away, or refuses this device's token (it was
        revoked, or enrolled again elsewhere: the job went back on the queue); otherwise retry
        next beat."""
        refused = isinstance(error, HubError) and error.status == 401
        if isinstance(error, HubError) and (_is_lost(error) or refused):
            logger.info("job %s attempt %s lost: %s", self.job_id, self.attempt, error)
            self.lost = True
            self.cancel.set()
        else:
            logger.warning("job %s heartbeat failed, will retry: %s", self.job_id, error)


class JobRun:
    """One claimed attempt of a job, from download to completion."""

    def __init__(self, client, job, fingerprint=None, signing_public_key=None):
        self.client = client
        self.job = job
        self.fingerprint = fingerprint
        self.signing_public_key = signing_public_key
        self.log = JobLog(job["id"])
        self.progress = JobProgress(self.log)
        self.heartbeat = JobHeartbeat(client, job, self.progress, self.log)
        self.workdir = None

    def run(self, workdir_root=None):
        """Do the work and report it, heartbeating until the hub has the completion; return
        the final state or "dropped"."""
        self.log.add(f"claimed job {self.job['id']} attempt {self.job['attempt']}")
        with self.heartbeat:
            outcome = self._work(workdir_root)
            if self.heartbeat.lost:
                return DROPPED
            self.heartbeat.finish_work()
            return self._complete(**outcome)

    def _work(self, workdir_root):
        """Run the job's kind; return the completion fields."""
        try:
            job = jobs.get(self.job["kind"])
            jobs.check_before_download(self)
            with scratch_dir(self.job["id"], workdir_root) as workdir:
                self.workdir = workdir
                inputs = self._download_inputs(workdir)
                return {"state": "succeeded", "result": job.run(self, inputs)}
        except Cancelled:
            self.log.add("stopped: the job moved on" if self.heartbeat.lost else "cancelled")
            return {"state": "cancelled"}
        except Exception as error:
            self.log.add(f"failed: {_one_line(error)}")
            return {
                "state": "failed",
                "error": _one_line(error),
                "failure_category": getattr(error, "category", None),
                "trace": _trace(error),
            }

    def _download_inputs(self, workdir):
        """Download every input of the job into workdir; return {name: path}."""
        paths = {}
        for name, info in (self.job.get("inputs") or {}).items():
            if not _is_plain_name(name):
                raise JobError(f"the hub named an input {name!r}; expected a plain name")
            self.log.add(f"downloading input {name} ({info['size']} bytes)")
            filename = info.get("filename")
            dest = workdir / name / (filename if _is_plain_name(filename) else name)
            dest.parent.mkdir(parents=True)
            download = self._download_engine if is_engine_input(name) else self._download_file
            paths[name] = download(name, info, dest)
            self.log.add(f"input {name} verified (sha256 {info['sha256'][:12]}...)")
        return paths

    def _download_file(self, name, info, dest):
        """Download a job input to dest, checking its size and sha256."""
        args = (self.job["id"], name, dest, info["sha256"], info["size"])
        return patiently(self.client.download_input, *args)

    def _download_engine(self, name, info, dest):
        """Download an engine and check size, sha256 and the hub's signature before any load."""
        if not self.signing_public_key:
            raise JobError(
                "the hub sent no signing_public_key in GET device, so this worker cannot "
                "verify engines and will not load one: upgrade the hub"
            )
        args = (info["id"], dest, info["sha256"], info["size"], name)
        path = patiently(self.client.download_engine, *args)
        try:
            signing.verify(info["sha256"], info.get("signature") or "", self.signing_public_key)
        except signing.TamperedEngine:
            path.unlink(missing_ok=True)
            raise
        self.log.add(f"engine {info['id']} signature verified")
        return path

    def upload(self, name, path):
        """Upload a file the job produced as artifact `name`; return its sha256."""
        if self.should_stop():
            raise Cancelled(f"stopped before uploading {name}")
        sha256 = _file_sha256(path)
        self.log.add(f"uploading artifact {name} ({Path(path).stat().st_size} bytes)")
        stored = patiently(
            self.client.upload_artifact, self.job["id"], self.job["attempt"], name, path
        )
        if stored.get("sha256", sha256) != sha256:
            raise JobError(f"the hub stored artifact {name} with another sha256 than the worker's")
        self.log.add(f"artifact {name} uploaded (sha256 {sha256[:12]}...)")
        return sha256

    def _complete(self, state, result=None, error=None, trace=None, failure_category=None):
        """Report the final state with the remaining log lines; return the state."""
        text, mark = self.log.unsent()
        log = text + (trace or "")
        try:
            patiently(
                self.client.complete,
                self.job["id"],
                self.job["attempt"],
                state,
                result=result,
                error=error,
                log=log,
                failure_category=failure_category,
            )
        except HubError as refused:
            if not _is_lost(refused):
                raise
            logger.info("job %s completion refused, dropping: %s", self.job["id"], refused)
            return DROPPED
        self.log.mark_sent(mark)
        logger.info("job %s attempt %s %s", self.job["id"], self.job["attempt"], state)
        return state

    def report(self, fraction, message):
        """Record progress for the next heartbeat."""
        self.progress.update(fraction, message)

    def should_stop(self):
        """Return True once the hub asked to cancel or gave the job away."""
        return self.heartbeat.cancel.is_set()

    def current_fingerprint(self):
        """Return the fingerprint the worker reports to the hub (override applied)."""
        return self.fingerprint or fingerprints.collect()

    def model_io(self):
        """Return what the job's model version takes and gives (its signature and input-shape
        contract, docs/protocol.md), or None: feeds then follow the loaded model's inputs."""
        return self.job.get("model_io") or None


def _is_lost(error):
    """Return True when the hub's answer means the job is no longer ours."""
    return isinstance(error, Conflict) or error.status == 403


def patiently(call, *args, **kwargs):
    """Call the hub, retrying for HUB_PATIENCE_SECONDS while it is unavailable (503, down) or
    throttles this address (429)."""
    deadline = time.monotonic() + HUB_PATIENCE_SECONDS
    while True:
        try:
            return call(*args, **kwargs)
        except HubError as error:
            unavailable = isinstance(error, HubUnreachable) or error.status in RETRY_STATUSES
            if not unavailable or time.monotonic() > deadline:
                raise
            logger.warning("the hub is unavailable, trying again: %s", error)
        time.sleep(HUB_RETRY_PAUSE_SECONDS)


def _file_sha256(path):
    """Return the sha256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_plain_name(name):
    """Return True for a file name without folders, safe to join to a path."""
    return bool(name) and Path(name).name == name and name not in (".", "..")


def _trace(error):
    """Return what the log gets for a failure: the child's log for a compile failure."""
    if isinstance(error, CompileFailure):
        return f"--- log of the child process ---\n{error.log}"
    return traceback.format_exc()


def _one_line(error):
    """Return an error as one line, its lines joined; name its type unless it is a JobError."""
    text = one_line(error)
    if not isinstance(error, JobError):
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text[:ERROR_MAX_CHARS]
