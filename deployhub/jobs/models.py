"""Jobs: the database row is the truth; the broker only carries its id."""

import functools

from django.conf import settings
from django.db import connection, models
from django.urls import reverse
from django.utils import timezone

from deployhub.choices import ChoiceSet
from deployhub.handwritten import Columns
from workers import kinds

LOG_LIMIT = 200_000  # characters kept; the oldest lines go first
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

    def take(self, job_id, device, attempt, *, lease_expires_at, message, log):
        """Take the job for the device in one statement when it can be claimed (queued, on
        this attempt, of the device's class and team) and return it; None when it cannot.

        Its start (kept from an earlier attempt) is the database's time of the statement:
        the moment the row is taken. Every job's dispatch waits on this statement, and the
        ORM took longer to compile it than the database to run it (deployhub/handwritten.py).
        It reads the whole table, whatever this queryset filters.
        """
        statement = _take_statement()
        with connection.cursor() as cursor:
            cursor.execute(
                statement.sql(connection),
                [
                    JobState.RUNNING,
                    device.pk,
                    connection.ops.adapt_datetimefield_value(lease_expires_at),
                    message,
                    log_lines(log),
                    LOG_LIMIT,
                    job_id,
                    device.device_class.team_id,
                    device.device_class_id,
                    attempt,
                    JobState.QUEUED,
                ],
            )
            row = cursor.fetchone()
        if row is None:
            return None
        job = statement.job.instance(row, connection)
        job.device, job.device_class = device, device.device_class
        return job


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

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

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
            self.log = (self.log + log_lines(text, source))[-LOG_LIMIT:]


def log_lines(text, source="hub"):
    """Return text as the log's lines: a hub line gets a timestamp and a source."""
    if source:
        stamp = timezone.now().isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return "".join(f"{stamp} {source}: {line}\n" for line in text.splitlines())
    return text if text.endswith("\n") else text + "\n"


class _TakeStatement:
    """UPDATE ... RETURNING of a claim, in each database's words for now and a log's tail."""

    NOW = {"sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"}  # Django's Now() there
    TAIL = {"sqlite": "SUBSTR(log || %s, -%s)"}

    def __init__(self):
        self.job = Columns(Job, Job._meta.db_table)
        self._sql = {}

    def sql(self, connection):
        vendor = connection.vendor
        if vendor not in self._sql:
            now = self.NOW.get(vendor, "STATEMENT_TIMESTAMP()")
            tail = self.TAIL.get(vendor, "RIGHT(log || %s, %s)")
            self._sql[vendor] = (
                f"UPDATE {connection.ops.quote_name(Job._meta.db_table)} "
                "SET state = %s, device_id = %s, "
                f"started_at = COALESCE(started_at, {now}), lease_expires_at = %s, "
                f"progress = 0, message = %s, log = {tail} "
                "WHERE id = %s AND team_id = %s AND device_class_id = %s AND attempt = %s "
                f"AND state = %s RETURNING {self.job.sql(connection)}"
            )
        return self._sql[vendor]


@functools.cache
def _take_statement():
    return _TakeStatement()


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
