"""Teams, memberships with roles, and the append-only audit log."""

import hashlib
import secrets

from django.conf import settings
from django.db import models


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


def _actor_name(actor):
    if actor is None:
        return "system"
    return actor if isinstance(actor, str) else actor.get_username()


class Event(models.Model):
    """One state change, as it happened: who did what to which object."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="events")
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
        digest = hashlib.sha256(token.encode()).hexdigest()
        return self.select_related("user").filter(token_hash=digest, user__is_active=True).first()


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
