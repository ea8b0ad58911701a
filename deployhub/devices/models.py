"""Device classes (a kind of target with its queue and budget) and their devices."""

import functools
import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import connection, models
from django.urls import reverse
from django.utils import timezone

from deployhub.core import accuracy, worker_dist
from deployhub.core.choices import ChoiceSet
from deployhub.core.handwritten import Columns, split
from deployhub.teams.models import TokenFailures

TOKEN_PREFIX = "dht_"
ENROLMENT_PREFIX = "dhe_"


class ServingPattern(ChoiceSet):
    REALTIME = "realtime"
    BATCH = "batch"
    CHOICES = (
        (REALTIME, "Real-time (per-frame latency budget)", "blue"),
        (BATCH, "Batch (throughput target)", "purple"),
    )


class DeviceState(ChoiceSet):
    ONLINE = "online"
    OFFLINE = "offline"
    DRAINING = "draining"
    CHOICES = (
        (ONLINE, "Online", "green"),
        (OFFLINE, "Offline", "grey"),
        (DRAINING, "Draining", "orange"),
    )


class DeviceClass(models.Model):
    """A kind of target (a GPU server, a Jetson, a CPU box) and the budget it runs under."""

    team = models.ForeignKey("teams.Team", on_delete=models.CASCADE, related_name="device_classes")
    slug = models.SlugField(max_length=50, unique=True, help_text="Also names its queue.")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    serving_pattern = models.CharField(
        max_length=20, choices=ServingPattern.choices(), default=ServingPattern.REALTIME
    )
    frame_budget_ms = models.FloatField(
        default=33.3, help_text="Per-frame latency budget in milliseconds (30 fps = 33.3 ms)."
    )
    throughput_target_ips = models.FloatField(
        null=True, blank=True, help_text="Images per second a batch class must sustain."
    )
    batch_latency_ceiling_ms = models.FloatField(
        null=True,
        blank=True,
        help_text="Batch classes: the most one batch may take at p99, in milliseconds.",
    )
    memory_limit_mb = models.PositiveIntegerField(null=True, blank=True)
    backends = models.JSONField(default=list, blank=True)
    accuracy_tolerance = models.FloatField(
        default=1.0, help_text="Most top-1 points an engine may lose against the FP32 reference."
    )
    task_tolerances = models.JSONField(
        default=dict,
        blank=True,
        help_text="Per task, what overrides the defaults (workers/tasks DEFAULT_TOLERANCES): "
        '{"detection": {"drop": 1.0, "agreement": 0.99}}.',
    )
    silent_after_minutes = models.PositiveIntegerField(
        default=10,
        help_text="A device silent this long is reported (audit trail, webhooks, email).",
    )
    auto_rebuild = models.BooleanField(
        default=False, help_text="Rebuild engines that a fingerprint change made stale."
    )
    trusts_builds_of = models.ManyToManyField(
        "self",
        symmetrical=False,
        blank=True,
        related_name="trusted_by",
        help_text="Classes whose engines this class's devices may run (an admin's decision): "
        "without it, a class runs only engines its own devices built.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        verbose_name_plural = "device classes"

    def __str__(self):
        return self.slug

    def get_absolute_url(self):
        return reverse("device_class_detail", args=[self.pk])

    @property
    def queue(self):
        return f"dc.{self.slug}"

    def builder_classes(self):
        """Return the classes whose engines this class runs: itself and those it trusts."""
        return [self, *self.trusts_builds_of.all()]

    def tolerance_for(self, task):
        """Return this class's accuracy tolerance for a task (deployhub/core/accuracy.py)."""
        return accuracy.tolerance_for(task, self.accuracy_tolerance, self.task_tolerances)

    @property
    def budget_fps(self):
        return 1000.0 / self.frame_budget_ms if self.frame_budget_ms else None

    @property
    def is_batch(self):
        return self.serving_pattern == ServingPattern.BATCH

    @property
    def serving_pattern_color(self):
        return ServingPattern.color(self.serving_pattern)

    @property
    def latency_budget_ms(self):
        """The latency a Server run must keep its p99 within: frame budget, or batch ceiling."""
        return self.batch_latency_ceiling_ms if self.is_batch else self.frame_budget_ms

    @property
    def gate_rule(self):
        """Say in one sentence what a benchmark run must do to meet this class's gate."""
        if not self.is_batch:
            return f"p99 per frame within {self.frame_budget_ms:g} ms ({self.budget_fps:.0f} fps)."
        if not self.throughput_target_ips:
            return "Batch class without a throughput target: runs cannot be judged."
        ceiling = self.batch_latency_ceiling_ms
        limit = f", each batch within {ceiling:g} ms at p99" if ceiling else ""
        return f"At least {self.throughput_target_ips:g} images/s{limit}."

    def delivers_by_broker(self):
        """True when a device of the class takes its work from the broker queue, or when the
        class has no device yet (one may be started in broker mode); False when every device
        asks for work over HTTPS, so nothing would ever consume the queue."""
        counts = self.devices.filter(revoked_at__isnull=True).aggregate(
            devices=models.Count("pk"),
            broker=models.Count("pk", filter=models.Q(delivery=Delivery.BROKER)),
        )
        return not counts["devices"] or counts["broker"] > 0

    def online_devices(self):
        """Devices that heartbeat and take jobs (not draining, not revoked)."""
        return self.devices.online().filter(draining=False, revoked_at__isnull=True)


def hash_token(token):
    """Return the stored form of a device token (tokens are random, so sha256 suffices)."""
    return hashlib.sha256(token.encode()).hexdigest()


def offline_after(delivery):
    """Seconds without a heartbeat after which a device shows offline. A device in HTTPS
    mode heartbeats by asking for work, and the hub may hold an ask DEPLOYHUB_POLL_SECONDS:
    it is given that long more."""
    if delivery == Delivery.HTTPS:
        return max(settings.DEPLOYHUB_OFFLINE_AFTER, settings.DEPLOYHUB_POLL_SECONDS + 15)
    return settings.DEPLOYHUB_OFFLINE_AFTER


def online_filter(now=None):
    """The Q that keeps online devices, whichever way each takes its work."""
    now = now or timezone.now()
    since = lambda delivery: now - timedelta(seconds=offline_after(delivery))  # noqa: E731
    return models.Q(last_heartbeat_at__gte=since(Delivery.BROKER)) | models.Q(
        delivery=Delivery.HTTPS, last_heartbeat_at__gte=since(Delivery.HTTPS)
    )


class DeviceQuerySet(models.QuerySet):
    def online(self):
        return self.filter(online_filter())


class DeviceManager(models.Manager.from_queryset(DeviceQuerySet)):
    def by_token(self, token, address=None):
        """Return the device holding this token, with its class and team, or None.

        device.token_lockout is when the token lockout of the caller's address ends
        (None when it is not locked out, or no address is given): one statement answers
        both. Every device call runs it; the ORM took eight times as long to compile it
        as the database to run it (deployhub/core/handwritten.py).
        """
        if not token or not token.startswith(TOKEN_PREFIX):
            return None
        lookup = token_lookup()
        params = {
            "token_hash": hash_token(token),
            "address": address or "",
            "now": connection.ops.adapt_datetimefield_value(timezone.now()),
        }
        with connection.cursor() as cursor:
            cursor.execute(lookup.sql(connection), params)
            row = cursor.fetchone()
        return None if row is None else lookup.read(row, connection)

    def holds(self, token):
        """Return True when the presented token is a device's (whatever its address's lockout)."""
        return (
            bool(token)
            and token.startswith(TOKEN_PREFIX)
            and self.filter(token_hash=hash_token(token)).exists()
        )


class Delivery(ChoiceSet):
    """How a device's worker receives its class's work (docs/protocol.md)."""

    BROKER = "broker"
    HTTPS = "https"
    CHOICES = (
        (BROKER, "Broker (inside the hub's network)", "grey"),
        (HTTPS, "HTTPS (the hub's API only)", "blue"),
    )
    VALUES = (BROKER, HTTPS)


class Device(models.Model):
    """One worker host of a class; it authenticates with a token shown once."""

    device_class = models.ForeignKey(DeviceClass, on_delete=models.CASCADE, related_name="devices")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_hint = models.CharField(max_length=12, editable=False, blank=True)
    fingerprint = models.JSONField(default=dict, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    draining = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    # Enrolment (deployhub-worker enroll): the machine's stable id makes enrolling again
    # return the same device; blank for a device registered by hand.
    machine_id = models.CharField(max_length=128, blank=True, db_index=True)
    enrolled_with = models.ForeignKey(
        "EnrolmentToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="devices"
    )
    # What the worker last said of itself (every call's User-Agent: docs/protocol.md).
    worker_version = models.CharField(max_length=40, blank=True)
    protocol_version = models.PositiveIntegerField(null=True, blank=True)
    delivery = models.CharField(max_length=10, choices=Delivery.choices(), default=Delivery.BROKER)
    revoked_at = models.DateTimeField(null=True, blank=True)
    silence_reported_at = models.DateTimeField(null=True, blank=True)

    objects = DeviceManager()

    class Meta:
        ordering = ["device_class", "name"]
        constraints = [
            models.UniqueConstraint(fields=["device_class", "name"], name="device_name_unique")
        ]

    def __str__(self):
        return self.name

    @property
    def team(self):
        return self.device_class.team

    def issue_token(self):
        """Set a new token and return it; only its hash is kept, so show it now."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        self.token_hash = hash_token(token)
        self.token_hint = token[: len(TOKEN_PREFIX) + 4]
        return token

    @property
    def is_online(self):
        if self.last_heartbeat_at is None:
            return False
        age = timezone.now() - self.last_heartbeat_at
        return age <= timedelta(seconds=offline_after(self.delivery))

    @property
    def state(self):
        if not self.is_online:
            return DeviceState.OFFLINE
        return DeviceState.DRAINING if self.draining else DeviceState.ONLINE

    @property
    def state_color(self):
        return DeviceState.color(self.state)

    @property
    def state_label(self):
        return DeviceState.label(self.state)

    @property
    def refused_protocol(self):
        """True when the worker last spoke a protocol this hub refuses (HTTP 426)."""
        return self.protocol_version is not None and not worker_dist.speaks(self.protocol_version)

    @property
    def older_worker(self):
        """True when the device's worker is an older release than the hub's."""
        return worker_dist.older_than_hub(self.worker_version)

    def record_worker(self, version, protocol):
        """Keep what the worker says of itself (its User-Agent); one UPDATE when it changed."""
        version = (version or "")[: self._meta.get_field("worker_version").max_length]
        protocol = protocol if protocol is not None and protocol < 2**31 else None
        if (self.worker_version, self.protocol_version) != (version, protocol):
            self.worker_version, self.protocol_version = version, protocol
            self.save(update_fields=["worker_version", "protocol_version"])

    def record_heartbeat(self, fingerprint=None):
        """Mark the device alive now; a beat within the last second changes nothing.

        A device reported silent is back: its team is told (devices/silence.py).
        """
        now = timezone.now()
        recent = self.last_heartbeat_at and (now - self.last_heartbeat_at).total_seconds() < 1
        if recent and not fingerprint:
            return
        self.last_heartbeat_at = now
        fields = ["last_heartbeat_at"]
        if fingerprint:
            self.fingerprint = fingerprint
            fields.append("fingerprint")
        self.save(update_fields=fields)
        if self.silence_reported_at is not None:
            from deployhub.devices.silence import report_back  # it imports these models

            report_back(self)


class EnrolmentTokenQuerySet(models.QuerySet):
    def by_token(self, token):
        """Return the enrolment token this secret is, with its class and team, or None."""
        if not token or not token.startswith(ENROLMENT_PREFIX):
            return None
        found = self.select_related("device_class__team").filter(token_hash=hash_token(token))
        return found.first()


class EnrolmentToken(models.Model):
    """A secret a team admin hands to devices so they register themselves in a class.

    Shown once, stored hashed; it may expire, cap how many devices it enrols, and be
    revoked. A device it enrolled keeps its own device token whatever becomes of it.
    """

    device_class = models.ForeignKey(
        DeviceClass, on_delete=models.CASCADE, related_name="enrolment_tokens"
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_hint = models.CharField(max_length=12, editable=False, blank=True)
    note = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    max_devices = models.PositiveIntegerField(null=True, blank=True)
    uses = models.PositiveIntegerField(default=0, help_text="Devices enrolled with it.")
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = EnrolmentTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.token_hint}… ({self.device_class})"

    def issue(self):
        """Set a new secret and return it; only its hash is kept, so show it now."""
        token = ENROLMENT_PREFIX + secrets.token_urlsafe(32)
        self.token_hash = hash_token(token)
        self.token_hint = token[: len(ENROLMENT_PREFIX) + 4]
        return token

    def refusal(self, now=None, new_device=True):
        """Say why this token enrols no more devices, or return "" when it may.

        A machine enrolled again (new_device=False) takes no use: a used-up token still
        enrols it again, a revoked or expired one does not.
        """
        now = now or timezone.now()
        if self.revoked_at is not None:
            return f"This enrolment token was revoked at {self.revoked_at:%Y-%m-%d %H:%M} UTC."
        if self.expires_at is not None and self.expires_at <= now:
            return f"This enrolment token expired at {self.expires_at:%Y-%m-%d %H:%M} UTC."
        if new_device and self.max_devices is not None and self.uses >= self.max_devices:
            return f"This enrolment token has enrolled its {self.max_devices} device(s)."
        return ""


class FingerprintChange(models.Model):
    """A change of a device's hardware or toolchain, as the worker reported it."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="fingerprint_changes")
    before = models.JSONField(default=dict)
    after = models.JSONField(default=dict)
    summary = models.JSONField(default=list, help_text="Readable change lines.")
    changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-changed_at", "-id"]

    def __str__(self):
        return f"{self.device}: {'; '.join(self.summary)[:80]}"


class TokenLookup:
    """The device holding a token hash, its class and team, and the lockout of an address:
    the tables and columns of the statements that authenticate a device (by_token, and
    a claim's on PostgreSQL: deployhub/jobs/models.py)."""

    def __init__(self):
        self.device = Columns(Device, "d")
        self.device_class = Columns(DeviceClass, "c")
        self.team = Columns(DeviceClass._meta.get_field("team").related_model, "t")
        self.lockout = Columns(TokenFailures, "f", ["locked_until"])
        self._sql = {}

    def tables(self, connection):
        """The device (d), its class (c) and its team (t), joined."""
        quote, table = connection.ops.quote_name, lambda columns: columns.model._meta.db_table
        return (
            f"{quote(table(self.device))} d "
            f"JOIN {quote(table(self.device_class))} c ON c.id = d.device_class_id "
            f"JOIN {quote(table(self.team))} t ON t.id = c.team_id"
        )

    def lockout_sql(self, connection):
        """The end of the lockout of %(address)s at %(now)s (NULL when there is none)."""
        table = connection.ops.quote_name(self.lockout.model._meta.db_table)
        return (
            f"(SELECT {self.lockout.sql(connection)} FROM {table} f "
            "WHERE f.address = %(address)s AND f.locked_until > %(now)s)"
        )

    def columns_sql(self, connection):
        """The device's, its class's and its team's columns, in the order device() reads."""
        parts = (self.device, self.device_class, self.team)
        return ", ".join(part.sql(connection) for part in parts)

    def sql(self, connection):
        if connection.vendor not in self._sql:
            self._sql[connection.vendor] = (
                f"SELECT {self.columns_sql(connection)}, {self.lockout_sql(connection)} "
                f"FROM {self.tables(connection)} WHERE d.token_hash = %(token_hash)s"
            )
        return self._sql[connection.vendor]

    def width(self):
        return len(self.device) + len(self.device_class) + len(self.team)

    def device_of(self, values, connection):
        """The device, its class and its team from values read in columns_sql()'s order."""
        device, device_class, team = split(values, self.device, self.device_class, self.team)
        device = self.device.instance(device, connection)
        device.device_class = self.device_class.instance(device_class, connection)
        device.device_class.team = self.team.instance(team, connection)
        return device

    def read(self, row, connection):
        """The device of a row of sql(), with its address's lockout as device.token_lockout."""
        device = self.device_of(row[: self.width()], connection)
        [device.token_lockout] = self.lockout.values(row[self.width() :], connection)
        return device


@functools.cache
def token_lookup():
    return TokenLookup()
