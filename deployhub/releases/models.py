"""Releases: an engine proposed for its device class, reviewed, promoted, retired or rolled back.

States: draft → in review → approved → production → retired; or rejected; or
rolled back. One production release per (model, device class), kept by a
constraint; promoting a new one retires the old one in the same transaction.
Every change is an Event (deployhub/releases/actions.py).
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.urls import reverse

from deployhub.core.choices import ChoiceSet


class ReleaseState(ChoiceSet):
    DRAFT = "draft"
    IN_REVIEW = "in-review"
    APPROVED = "approved"
    PRODUCTION = "production"
    RETIRED = "retired"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled-back"
    CHOICES = (
        (DRAFT, "Draft", "grey"),
        (IN_REVIEW, "In review", "blue"),
        (APPROVED, "Approved", "green"),
        (PRODUCTION, "Production", "green"),
        (RETIRED, "Retired", "grey"),
        (REJECTED, "Rejected", "red"),
        (ROLLED_BACK, "Rolled back", "orange"),
    )
    # The path a release takes to production, as the page draws it.
    PATH = (DRAFT, IN_REVIEW, APPROVED, PRODUCTION, RETIRED)
    FINAL = (RETIRED, REJECTED, ROLLED_BACK)


class Decision(ChoiceSet):
    APPROVE = "approve"
    REQUEST_CHANGES = "request_changes"
    REJECT = "reject"
    CHOICES = (
        (APPROVE, "Approve", "green"),
        (REQUEST_CHANGES, "Request changes", "orange"),
        (REJECT, "Reject", "red"),
    )


class Release(models.Model):
    """One engine proposed for its device class, with a note, on its way to production."""

    engine = models.ForeignKey("engines.Engine", on_delete=models.PROTECT, related_name="releases")
    model = models.ForeignKey("registry.Model", on_delete=models.CASCADE, related_name="releases")
    device_class = models.ForeignKey(
        "devices.DeviceClass", on_delete=models.CASCADE, related_name="releases"
    )
    state = models.CharField(
        max_length=20, choices=ReleaseState.choices(), default=ReleaseState.DRAFT
    )
    note = models.TextField(blank=True)
    state_reason = models.TextField(blank=True, help_text="Why it last changed state.")
    replaced = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The production release this one retired when promoted: a rollback restores it.",
    )
    submitted_at = models.DateTimeField(null=True, blank=True)
    promoted_at = models.DateTimeField(null=True, blank=True)
    evidence = models.JSONField(
        default=dict,
        blank=True,
        help_text="The evidence pack (releases/evidence.py), kept from when it entered review.",
    )
    evidence_at = models.DateTimeField(null=True, blank=True, help_text="When it was computed.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["model", "device_class"],
                condition=Q(state="production"),
                name="one_production_release_per_model_and_class",
            )
        ]

    def __str__(self):
        return f"release #{self.pk} of {self.engine} on {self.device_class}"

    def get_absolute_url(self):
        return reverse("release_detail", args=[self.pk])

    @property
    def team(self):
        return self.device_class.team

    @property
    def state_label(self):
        return ReleaseState.label(self.state)

    @property
    def state_color(self):
        return ReleaseState.color(self.state)

    def current_reviews(self):
        """The reviews since the release last entered review: the ones that count."""
        reviews = self.reviews.select_related("reviewer")
        return reviews.filter(created_at__gte=self.submitted_at) if self.submitted_at else reviews


class Review(models.Model):
    """A reviewer's decision on a release, with a comment; the page threads them."""

    release = models.ForeignKey(Release, on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    decision = models.CharField(max_length=20, choices=Decision.choices())
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self):
        return f"{self.reviewer}: {self.decision} on release #{self.release_id}"

    @property
    def decision_label(self):
        return Decision.label(self.decision)

    @property
    def decision_color(self):
        return Decision.color(self.decision)


class GateOverride(models.Model):
    """An admin's written decision to let a release past one failed gate; kept forever."""

    release = models.ForeignKey(Release, on_delete=models.CASCADE, related_name="overrides")
    gate = models.CharField(max_length=30)
    justification = models.TextField()
    by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["release", "gate"], name="one_override_per_gate")
        ]

    def __str__(self):
        return f"{self.gate} gate of release #{self.release_id} overridden by {self.by}"
