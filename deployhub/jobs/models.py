"""Jobs: the database row is the truth; the broker only carries its id."""

import functools
import json

from django.conf import settings
from django.db import connection, models
from django.urls import reverse
from django.utils import timezone

from deployhub.core.choices import ChoiceSet
from deployhub.core.handwritten import Columns, prepared_cursor
from deployhub.devices.models import TOKEN_PREFIX, hash_token, token_lookup
from deployhub.teams.models import Event, Webhook
from workers import kinds

# How a worker classifies a failed build or first load (workers/backends/isolate.py); it
# sends the category with the completion (docs/protocol.md).
FAILURE_CATEGORIES = {
    "unsupported_operator": "Unsupported operator",
    "shape_or_contract": "Shape or contract error",
    "out_of_memory": "Out of memory",
    "timeout": "Timed out",
    "runtime_missing": "Runtime missing",
    "internal": "Internal error",
}


class JobState(ChoiceSet):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CHOICES = (
        (QUEUED, "Queued", "grey"),
        (RUNNING, "Running", "blue"),
        (SUCCEEDED, "Succeeded", "green"),
        (FAILED, "Failed", "red"),
        (CANCELLED, "Cancelled", "orange"),
    )
    FINAL = (SUCCEEDED, FAILED, CANCELLED)


class JobKind(ChoiceSet):
    BENCHMARK = kinds.BENCHMARK
    NOOP = kinds.NOOP
    EXPORT = kinds.EXPORT
    COMPILE = kinds.COMPILE
    EVALUATE = kinds.EVALUATE
    PARITY = kinds.PARITY
    COMPARE = kinds.COMPARE
    CHOICES = (
        (BENCHMARK, "Benchmark", "blue"),
        (NOOP, "No-op (pipeline check)", "grey"),
        (EXPORT, "Export", "purple"),
        (COMPILE, "Compile", "purple"),
        (EVALUATE, "Evaluate", "teal"),
        (PARITY, "Preprocessing parity", "teal"),
        (COMPARE, "Side-by-side benchmark", "blue"),
    )


class JobQuerySet(models.QuerySet):
    def for_team(self, team):
        return self.filter(team=team).select_related(
            "model_version__model", "device_class", "device"
        )

    def active(self):
        return self.filter(state__in=[JobState.QUEUED, JobState.RUNNING])


# A name of its own: django-stubs types a manager made from a queryset only when it has one.
JobManagerBase = models.Manager.from_queryset(JobQuerySet)


class JobManager(JobManagerBase):
    def take(self, job_id, device, attempt, *, lease_expires_at):
        """Take the job for the device when it can be claimed (queued, on this attempt, of
        the device's class and team), in one statement, and return it; else None.

        Its start (kept from an earlier attempt) is the database's time of the moment the
        row is taken. Every job's dispatch waits on this statement, and the ORM took longer
        to compile it than the database to run it (deployhub/core/handwritten.py).
        """
        return _claim_statement().take(connection, job_id, device, attempt, lease_expires_at)

    def take_oldest(self, device, *, lease_expires_at):
        """Take the oldest queued job of the device's class for it and record its claim's
        event, in one statement (PostgreSQL only); return (the job, the event, whether its
        team has active webhooks), or None. See _ClaimStatement.take_oldest."""
        return _claim_statement().take_oldest(connection, device, lease_expires_at)

    def oldest_statement(self, device, *, lease_expires_at):
        """take_oldest's statement and its parameters (make bench explains its plan)."""
        return _claim_statement().oldest_statement(connection, device, lease_expires_at)

    def take_for_token(self, job_id, token, address, attempt, *, lease_expires_at):
        """Take the job for the device holding the token, in one statement that authenticates
        it too, when the claim is sure to be granted; return (the job, the device), or None.

        Sure to be granted: the device is neither draining nor revoked, the caller's address
        is not locked out, and the job can be claimed as take() says. Only PostgreSQL returns
        the joined rows' columns: elsewhere this is always None, and the caller authenticates
        the device first, then calls take(), whose refusal says why. There it runs as a prepared
        statement (deployhub/core/handwritten.py): PostgreSQL took longer to plan it than to run it.
        """
        if connection.vendor != "postgresql" or not token.startswith(TOKEN_PREFIX):
            return None
        return _claim_statement().take_for_token(
            connection, job_id, token, address, attempt, lease_expires_at
        )


class Job(models.Model):
    """One piece of device work with its attempt, lease, progress and log."""

    team = models.ForeignKey("teams.Team", on_delete=models.CASCADE, related_name="jobs")
    kind = models.CharField(max_length=20, choices=JobKind.choices())
    state = models.CharField(
        max_length=20, choices=JobState.choices(), default=JobState.QUEUED, db_index=True
    )
    model_version = models.ForeignKey(
        "registry.ModelVersion",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="jobs",
    )
    device_class = models.ForeignKey(
        "devices.DeviceClass", on_delete=models.CASCADE, related_name="jobs"
    )
    device = models.ForeignKey(
        "devices.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    engine = models.ForeignKey(
        "engines.Engine",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="jobs",
        help_text="The engine a job runs (a benchmark of an engine), if any.",
    )
    params = models.JSONField(default=dict, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    max_attempts = models.PositiveIntegerField(default=3)
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    cancel_requested = models.BooleanField(default=False)
    progress = models.FloatField(default=0.0)
    message = models.CharField(max_length=200, blank=True)
    log = models.TextField(blank=True)
    error = models.TextField(blank=True)
    failure_category = models.CharField(
        max_length=30,
        blank=True,
        choices=list(FAILURE_CATEGORIES.items()),
        help_text="How the worker classified a failed build or first load (blank: unclassified).",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobManager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # A device asking for work over HTTPS takes its class's oldest queued job: the
            # cost of finding it does not grow with the backlog (docs/protocol.md). By age,
            # an order only this index keeps: by id, PostgreSQL's planner may walk the
            # primary key instead, past every job taken before (a backlog just queued, as
            # ANALYZE saw it, looks cheap to walk), and each take costs more than the last.
            models.Index(
                fields=["device_class", "created_at", "id"],
                condition=models.Q(state="queued"),
                name="job_queued_by_class",
            )
        ]

    def __str__(self):
        return f"{self.get_kind_display()} #{self.pk}"

    def get_absolute_url(self):
        return reverse("job_detail", args=[self.pk])

    @property
    def state_color(self):
        return JobState.color(self.state)

    @property
    def failure_label(self):
        return FAILURE_CATEGORIES.get(self.failure_category)

    @property
    def is_final(self):
        return self.state in JobState.FINAL

    @property
    def duration(self):
        if not self.started_at:
            return None
        return (self.finished_at or timezone.now()) - self.started_at

    def append_log(self, text, source="hub"):
        """Append lines to the log; hub lines get a timestamp and a source."""
        if text:
            limit = settings.DEPLOYHUB_MAX_LOG_CHARS  # the oldest lines go first
            self.log = (self.log + log_lines(text, source))[-limit:]


def log_lines(text, source="hub"):
    """Return text as the log's lines: a hub line gets a timestamp and a source."""
    if source:
        stamp = log_stamp(source)
        return "".join(f"{stamp}{line}\n" for line in text.splitlines())
    return text if text.endswith("\n") else text + "\n"


def log_stamp(source="hub"):
    """The start of a log line the hub writes now: its time and source."""
    return f"{timezone.now().isoformat(timespec='milliseconds').replace('+00:00', 'Z')} {source}: "


class _ClaimStatement:
    """The UPDATE that takes a job for a device, written once per database.

    For a device already authenticated (its id and name are parameters), or for the device
    holding a token hash, whose row, class and team come back with the job's (PostgreSQL).
    The row's start is the database's clock as it takes the row; a full log keeps its tail.
    """

    NOW = {
        "postgresql": "CLOCK_TIMESTAMP()",
        "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')",
    }
    TAIL = {"postgresql": "RIGHT({}, %(limit)s)", "sqlite": "SUBSTR({}, -%(limit)s)"}
    BIGGEST_ID = 2**63 - 1  # SQLite refuses a bigger integer outright; no job has one

    def __init__(self):
        self.job = Columns(Job, Job._meta.db_table)
        self.devices = token_lookup()
        self._sql = {}

    def take(self, connection, job_id, device, attempt, lease_expires_at):
        if not 0 < job_id <= self.BIGGEST_ID:
            return None
        # RETURNING is SQLite 3.35's: before, the row the statement took is read after it.
        returning = connection.features.can_return_columns_from_insert
        params = self._params(connection, job_id, attempt, lease_expires_at)
        params.update(
            device=device.pk,
            name=device.name,
            team=device.device_class.team_id,
            device_class=device.device_class_id,
        )
        with connection.cursor() as cursor:
            cursor.execute(self.sql(connection, "device", returning), params)
            row = cursor.fetchone() if returning else cursor.rowcount or None
        if row is None:
            return None
        job = self.job.instance(row, connection) if returning else Job.objects.get(pk=job_id)
        job.device, job.device_class = device, device.device_class
        return job

    def take_for_token(self, connection, job_id, token, address, attempt, lease_expires_at):
        if not 0 < job_id <= self.BIGGEST_ID:
            return None
        params = self._params(connection, job_id, attempt, lease_expires_at)
        params.update(
            token_hash=hash_token(token),
            address=address,
            now=connection.ops.adapt_datetimefield_value(timezone.now()),
        )
        with prepared_cursor(connection) as cursor:
            cursor.execute(self.sql(connection, "token", True), params)
            row = cursor.fetchone()
        if row is None:
            return None
        job = self.job.instance(row[: len(self.job)], connection)
        device = self.devices.device_of(row[len(self.job) :], connection)
        job.device, job.device_class = device, device.device_class
        return job, device

    def take_oldest(self, connection, device, lease_expires_at):
        """Take the oldest queued job of the device's class for it and record the claim's
        event, in one statement (PostgreSQL); return (the job, the event, whether the team
        has active webhooks), or None when none is queued or the device is drained or
        revoked now. Another device's statement at the same moment skips the row this one
        locks (SKIP LOCKED) and takes the next."""
        sql, params = self.oldest_statement(connection, device, lease_expires_at)
        with prepared_cursor(connection) as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        job = self.job.instance(row[: len(self.job)], connection)
        job.device, job.device_class = device, device.device_class
        event_id, webhooks = row[len(self.job) :]
        return job, self.event(job, event_id, params), webhooks

    def oldest_statement(self, connection, device, lease_expires_at):
        """take_oldest's statement for the device, and its parameters."""
        params = self._params(connection, 0, 0, lease_expires_at)
        params.update(
            device=device.pk,
            name=device.name,
            actor=f"device:{device}",
            device_class=device.device_class_id,
            log=f"{log_stamp()}attempt ",
            claimed_by=" claimed by device ",
            event_data=json.dumps({"before": JobState.QUEUED, "after": JobState.RUNNING}),
            now=connection.ops.adapt_datetimefield_value(timezone.now()),
        )
        return self.oldest_sql(connection), params

    def event(self, job, event_id, params):
        """The claim's event as take_oldest's statement wrote it (not read back)."""
        data = {"attempt": job.attempt, "before": JobState.QUEUED, "after": JobState.RUNNING}
        return Event.from_db(
            "default",
            ["id", "team_id", "actor", "verb", "target_type", "target_id", "data", "created_at"],
            [
                event_id,
                job.team_id,
                params["actor"],
                "job.claimed",
                "job",
                job.pk,
                data,
                params["now"],
            ],
        )

    def oldest_sql(self, connection):
        key = (connection.vendor, "oldest")
        if key not in self._sql:
            self._sql[key] = self._written_oldest(connection)
        return self._sql[key]

    def _written_oldest(self, connection):
        """The oldest queued job of the class, read through the partial index that holds only
        queued jobs (its state is written out, not a parameter, so a prepared statement's
        generic plan still matches that index), taken and its claim recorded."""
        quote = connection.ops.quote_name
        job, device = quote(Job._meta.db_table), quote(self.devices.device.model._meta.db_table)
        event, webhook = quote(Event._meta.db_table), quote(Webhook._meta.db_table)
        queued = "'" + JobState.QUEUED + "'"
        tail = self.TAIL["postgresql"].format(
            f"{job}.log || %(log)s || {job}.attempt || %(claimed_by)s || %(name)s || %(newline)s"
        )
        return (
            f"WITH oldest AS (SELECT id FROM {job} WHERE device_class_id = %(device_class)s "
            f"AND state = {queued} AND EXISTS (SELECT 1 FROM {device} WHERE id = %(device)s "
            f"AND NOT draining AND revoked_at IS NULL) "
            f"ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED), "
            f"taken AS (UPDATE {job} SET state = %(running)s, device_id = %(device)s, "
            f"started_at = COALESCE({job}.started_at, CLOCK_TIMESTAMP()), "
            f"lease_expires_at = %(lease)s, progress = 0.0, message = %(message)s || %(name)s, "
            f"log = {tail} FROM oldest WHERE {job}.id = oldest.id AND {job}.state = {queued} "
            f"RETURNING {self.job.sql(connection)}), "
            f"recorded AS (INSERT INTO {event} (team_id, actor, verb, target_type, target_id, "
            f"data, created_at) SELECT taken.team_id, %(actor)s, 'job.claimed', 'job', taken.id, "
            f"jsonb_build_object('attempt', taken.attempt) || %(event_data)s::jsonb, %(now)s "
            f"FROM taken RETURNING id) "
            f"SELECT taken.*, (SELECT id FROM recorded), EXISTS (SELECT 1 FROM {webhook} "
            f"WHERE team_id = taken.team_id AND active) FROM taken"
        )

    def _params(self, connection, job_id, attempt, lease_expires_at):
        return {
            "job": job_id,
            "attempt": attempt,
            "queued": JobState.QUEUED,
            "running": JobState.RUNNING,
            "lease": connection.ops.adapt_datetimefield_value(lease_expires_at),
            "message": "claimed by ",
            "log": f"{log_stamp()}attempt {attempt} claimed by device ",
            "newline": "\n",
            "limit": settings.DEPLOYHUB_MAX_LOG_CHARS,
        }

    def sql(self, connection, by, returning):
        key = (connection.vendor, by, returning)
        if key not in self._sql:
            self._sql[key] = self._written(connection, by, returning)
        return self._sql[key]

    def _written(self, connection, by, returning):
        job = connection.ops.quote_name(Job._meta.db_table)
        if by == "device":
            device, name, source = "%(device)s", "%(name)s", ""
            holder = f"{job}.team_id = %(team)s AND {job}.device_class_id = %(device_class)s"
        else:
            device, name, source = "d.id", "d.name", f"FROM {self.devices.tables(connection)}"
            holder = (
                f"d.token_hash = %(token_hash)s AND NOT d.draining AND d.revoked_at IS NULL "
                f"AND {self.devices.lockout_sql(connection)} IS NULL "
                f"AND {job}.team_id = c.team_id AND {job}.device_class_id = d.device_class_id"
            )
        tail = self.TAIL[connection.vendor].format(f"{job}.log || %(log)s || {name} || %(newline)s")
        sql = (
            f"UPDATE {job} SET state = %(running)s, device_id = {device}, "
            f"started_at = COALESCE({job}.started_at, {self.NOW[connection.vendor]}), "
            f"lease_expires_at = %(lease)s, progress = 0.0, message = %(message)s || {name}, "
            f"log = {tail} {source} WHERE {holder} AND {job}.id = %(job)s "
            f"AND {job}.attempt = %(attempt)s AND {job}.state = %(queued)s"
        )
        if returning:
            sql += f" RETURNING {self.job.sql(connection)}"
        if returning and by == "token":
            sql += f", {self.devices.columns_sql(connection)}"
        return sql


@functools.cache
def _claim_statement():
    return _ClaimStatement()


class ClaimRefusalReason(ChoiceSet):
    """Why a device's claim of a job was refused (jobs/actions.py claim_job)."""

    STALE_ATTEMPT = "stale_attempt"
    WRONG_CLASS = "wrong_class"
    DRAINING = "draining"
    NOT_QUEUED = "not_queued"
    CHOICES = (
        (STALE_ATTEMPT, "Stale attempt", "orange"),
        (WRONG_CLASS, "Device of another class", "red"),
        (DRAINING, "Device draining", "orange"),
        (NOT_QUEUED, "Job no longer queued (already running or ended)", "grey"),
    )


class ClaimRefusals(models.Model):
    """How many claims were refused for a reason, in every hub process (/metrics reads it).

    One row per reason, counted in the database because gunicorn runs several processes
    and a claim goes to any of them; only a refusal writes here, never a granted claim.
    """

    reason = models.CharField(max_length=20, unique=True, choices=ClaimRefusalReason.choices())
    count = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["reason"]
        verbose_name_plural = "claim refusals"

    def __str__(self):
        return f"{self.reason}: {self.count}"

    @classmethod
    def count_one(cls, reason):
        """Add one refusal for the reason: one UPDATE, or a new row the first time."""
        if not cls.objects.filter(reason=reason).update(count=models.F("count") + 1):
            row, created = cls.objects.get_or_create(reason=reason, defaults={"count": 1})
            if not created:
                cls.objects.filter(pk=row.pk).update(count=models.F("count") + 1)


class Artifact(models.Model):
    """A file a job produced, stored under a server-generated name."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    attempt = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    file = models.FileField(max_length=255)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "name"]

    def __str__(self):
        return f"{self.name} of {self.job}"
