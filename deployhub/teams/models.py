"""Teams, memberships with roles, and the append-only audit log."""

import hashlib
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction

from deployhub.core.choices import ChoiceSet
from deployhub.teams.addresses import BlockedAddress, check_literal_host
from deployhub.teams.webhook_url import read_webhook_url


class Role(models.IntegerChoices):
    """What a member may do; each role includes the ones below it."""

    VIEWER = 10, "Viewer"
    ENGINEER = 20, "Engineer"
    REVIEWER = 30, "Reviewer"
    ADMIN = 40, "Admin"


class Team(models.Model):
    """A group of people that owns models, device classes and jobs."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    approvals_required = models.PositiveSmallIntegerField(
        default=1, help_text="Approvals a release needs, from reviewers other than its author."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def role_of(self, user):
        """Return the user's Role in this team, or None when not a member."""
        membership = self.memberships.filter(user=user).first()
        return Role(membership.role) if membership else None


class Membership(models.Model):
    """A user's role in a team."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.IntegerField(choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_team")
        ]

    def __str__(self):
        return f"{self.user} in {self.team} ({self.get_role_display()})"


class EventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise TypeError("Events are append-only.")

    def delete(self):
        raise TypeError("Events are append-only.")


def shown(value):
    """A recorded value as a person reads it: key: value pairs, never a Python repr."""
    if value is None or value == "" or value == []:
        return "—"
    if isinstance(value, dict):
        return "; ".join(f"{key}: {shown(item)}" for key, item in value.items())
    if isinstance(value, list):
        return ", ".join(shown(item) for item in value)
    return str(value)


def _actor_name(actor):
    if actor is None:
        return "system"
    return actor if isinstance(actor, str) else actor.get_username()


class Event(models.Model):
    """One state change, as it happened: who did what to which object.

    Append-only: saving an event again, updating or deleting one raises here, and on
    PostgreSQL a trigger refuses UPDATE and DELETE of its rows whoever asks (migration
    teams 0008). A team with events cannot be deleted: its trail would go with it.
    """

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="events")
    actor = models.CharField(max_length=150, help_text="A username or device:<name>.")
    verb = models.CharField(max_length=60)
    target_type = models.CharField(max_length=60)
    target_id = models.BigIntegerField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.actor} {self.verb} {self.target_type}#{self.target_id}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise TypeError("Events are append-only.")
        super().save(*args, **kwargs)
        from deployhub.teams.webhooks import announce_on_commit  # it imports these models

        announce_on_commit(self)

    def delete(self, *args, **kwargs):
        raise TypeError("Events are append-only.")

    @property
    def change(self):
        """The state change as "before → after" text; "" when the event records none."""
        if "before" not in self.data and "after" not in self.data:
            return ""
        return f"{shown(self.data.get('before'))} → {shown(self.data.get('after'))}"

    @property
    def details(self):
        """The rest of what the event records, as "key: value" text."""
        rest = {k: v for k, v in self.data.items() if k not in ("before", "after")}
        return shown(rest) if rest else ""

    @classmethod
    def record(cls, team, actor, verb, target, **data):
        """Append an event about `target` (any model instance)."""
        return cls.objects.create(
            team=team,
            actor=_actor_name(actor),
            verb=verb,
            target_type=target._meta.model_name,
            target_id=target.pk,
            data=data,
        )


API_TOKEN_PREFIX = "dhu_"


class ApiTokenQuerySet(models.QuerySet):
    def by_token(self, token):
        """Return the live token record for a presented token, or None."""
        if not token or not token.startswith(API_TOKEN_PREFIX):
            return None
        return self.select_related("user").filter(_live_token(token)).first()

    def holds(self, token):
        """Return True when the presented token is a live personal or pipeline token."""
        return (
            bool(token)
            and token.startswith(API_TOKEN_PREFIX)
            and self.filter(_live_token(token)).exists()
        )


def _live_token(token):
    digest = hashlib.sha256(token.encode()).hexdigest()
    return models.Q(token_hash=digest, user__is_active=True)


class TokenScope(models.TextChoices):
    """What a personal token may do: everything its user may, or what a CI pipeline needs."""

    FULL = "full", "Full: everything you may do"
    PIPELINE = "pipeline", "Pipeline: upload, build, benchmark, request a release"


class ApiToken(models.Model):
    """A personal API token: it acts as its user, with the user's roles. Shown once.

    A pipeline-scoped token may upload, build, benchmark and request a release, but
    never review, override a gate, promote or roll back (deployhub/api/auth.py).
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=10, choices=TokenScope.choices, default=TokenScope.FULL)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_hint = models.CharField(max_length=12, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} ({self.token_hint}…)"

    def issue(self):
        """Set a new secret and return it; only its hash is kept."""
        token = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
        self.token_hash = hashlib.sha256(token.encode()).hexdigest()
        self.token_hint = token[: len(API_TOKEN_PREFIX) + 4]
        return token


class TokenFailuresQuerySet(models.QuerySet):
    def lockout_of(self, address, now):
        """An expression for the end of the address's lockout (NULL when it is not locked out),
        to annotate the token lookup with: one query answers both."""
        locked = self.filter(address=address, locked_until__gt=now)
        return models.Subquery(locked.values("locked_until")[:1])

    def count_failure(self, address, now, *, limit, lockout):
        """Count one failed token authentication from the address; return (its row, whether
        it counted): an address locked out already is not counted again.

        The count runs over a window of `lockout` from its first failure; reaching
        `limit` locks the address out for `lockout`. Rows of windows long over go.
        """
        self.filter(window_started_at__lt=now - 2 * lockout).exclude(address=address).delete()
        with transaction.atomic():
            row, _ = self.select_for_update().get_or_create(
                address=address, defaults={"window_started_at": now}
            )
            if row.locked(now):
                return row, False
            if row.window_started_at <= now - lockout:
                row.failures, row.window_started_at, row.locked_until = 0, now, None
            row.failures += 1
            if row.failures == limit:
                row.locked_until = now + lockout
            row.save()
        return row, True


class TokenFailures(models.Model):
    """Failed API and device token authentications from one client address.

    No user or team is known for a made-up token, so this row (shown in the admin)
    and a line in the hub's log are the record of a lockout; a team's audit trail
    gets the sign-in lockouts of its members (teams/throttle.py).
    """

    address = models.CharField(max_length=64, unique=True)
    failures = models.PositiveIntegerField(default=0)
    window_started_at = models.DateTimeField(help_text="The first failure of this count.")
    locked_until = models.DateTimeField(null=True, blank=True)

    objects = TokenFailuresQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "token failures"

    def __str__(self):
        return f"{self.address}: {self.failures} failed token authentications"

    def locked(self, now):
        return self.locked_until is not None and self.locked_until > now


# The username of the row that counts an address's failures for every username.
ANY_USERNAME = ""


class SignInFailuresQuerySet(models.QuerySet):
    def lockout_of(self, username, address, now):
        """Return the row that locks this username out at this address (the pair's, or the
        address's for every username), the one that ends last; None when neither does."""
        keys = models.Q(username=username) | models.Q(username=ANY_USERNAME)
        locked = self.filter(keys, address=address, locked_until__gt=now)
        return locked.order_by("-locked_until").first()

    def count_failure(self, username, address, now, *, limit, window, lockout):
        """Count one failed sign-in on the row of (username, address); return the row when this
        failure locked it out, else None.

        The count runs over a window from its first failure; reaching `limit` locks the
        row out for `lockout`, after which a new count starts. Rows of windows over and
        lockouts ended go.
        """
        over = models.Q(locked_until__isnull=True) | models.Q(locked_until__lte=now)
        self.filter(over, window_started_at__lte=now - window).delete()
        with transaction.atomic():
            row, _ = self.select_for_update().get_or_create(
                username=username, address=address, defaults={"window_started_at": now}
            )
            if row.window_started_at <= now - window or row.lockout_ended(now):
                row.failures, row.window_started_at, row.locked_until = 0, now, None
            row.failures += 1
            if row.failures == limit:
                row.locked_until = now + lockout
            row.save()
        return row if row.failures == limit else None


class SignInFailures(models.Model):
    """Failed sign-ins of one username from one address, or (username empty) of every
    username from one address: the counts that lock sign-ins out (teams/throttle.py)."""

    username = models.CharField(
        max_length=150, blank=True, help_text="Empty: the address's failures for any username."
    )
    address = models.CharField(max_length=64)
    failures = models.PositiveIntegerField(default=0)
    window_started_at = models.DateTimeField(help_text="The first failure of this count.")
    locked_until = models.DateTimeField(null=True, blank=True)

    objects = SignInFailuresQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "sign-in failures"
        constraints = [
            models.UniqueConstraint(fields=["address", "username"], name="sign_in_failures_key")
        ]

    def __str__(self):
        who = self.username or "any username"
        return f"{who} from {self.address}: {self.failures} failed sign-ins"

    def lockout_ended(self, now):
        return self.locked_until is not None and self.locked_until <= now

    @property
    def of_address(self):
        """Tell whether this row counts the address's failures for every username."""
        return self.username == ANY_USERNAME


def validate_webhook_url(value):
    """Accept only an http or https URL that the sender reads as the form does (webhook_url.py),
    and not a blocked address by itself (teams/addresses.py; a host name's addresses are
    checked when a webhook is sent)."""
    try:
        parts = read_webhook_url(value)
    except ValueError as exc:
        raise ValidationError(str(exc), code="invalid_webhook_url") from exc
    try:
        check_literal_host(parts.host)
    except BlockedAddress as exc:
        raise ValidationError(str(exc), code="blocked_webhook_address") from exc


def new_webhook_secret():
    return "whsec_" + secrets.token_urlsafe(32)


class WebhookQuerySet(models.QuerySet):
    def matching(self, event):
        """Return the team's active webhooks that want this event, by its verb."""
        webhooks = self.filter(team_id=event.team_id, active=True)
        return [webhook for webhook in webhooks if webhook.matches(event.verb)]


class Webhook(models.Model):
    """A team's outgoing webhook: its events, chosen by verb prefix, POSTed signed to a URL.

    The secret signs each delivery (deployhub/teams/webhooks.py); it is kept as is
    because signing needs it, and shown once, when the webhook is added.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="webhooks")
    url = models.CharField(max_length=500, validators=[validate_webhook_url])
    secret = models.CharField(max_length=64, default=new_webhook_secret, editable=False)
    events = models.JSONField(
        default=list, blank=True, help_text="Verb prefixes, e.g. release. or job.failed; none: all."
    )
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = WebhookQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self):
        return self.url

    def matches(self, verb):
        """Tell whether an event with this verb goes to this webhook."""
        return not self.events or any(verb.startswith(prefix) for prefix in self.events)

    @property
    def secret_hint(self):
        return self.secret[:10]


class DeliveryState(ChoiceSet):
    PENDING = "pending"
    SENDING = "sending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CHOICES = (
        (PENDING, "Pending", "grey"),
        (SENDING, "Sending", "blue"),
        (SUCCEEDED, "Delivered", "green"),
        (FAILED, "Failed", "red"),
    )


class WebhookDelivery(models.Model):
    """One attempt to deliver an event to a webhook, with the receiver's answer.

    A failed attempt is followed by a new row with the next attempt number, due at
    next_attempt_at, until the retries run out.
    """

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="+")
    attempt = models.PositiveSmallIntegerField(default=1)
    state = models.CharField(
        max_length=10, choices=DeliveryState.choices(), default=DeliveryState.PENDING
    )
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True, help_text="When it is due.")
    sending_since = models.DateTimeField(null=True, blank=True, help_text="When sending began.")
    delivered_at = models.DateTimeField(null=True, blank=True, help_text="When it was sent.")

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "webhook deliveries"

    def __str__(self):
        return f"{self.event.verb} to {self.webhook} (attempt {self.attempt})"

    @property
    def succeeded(self):
        return self.state == DeliveryState.SUCCEEDED

    @property
    def state_color(self):
        return DeliveryState.color(self.state)

    @property
    def state_label(self):
        return DeliveryState.label(self.state)
