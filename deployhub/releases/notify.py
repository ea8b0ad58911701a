"""Email about releases: reviewers hear when one enters review, its author of each decision.

Sent after the transaction commits (a rolled-back change sends nothing), with
Django's email (settings.EMAIL_BACKEND: the console unless SMTP is configured).
People without an email address are skipped.
"""

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction

from deployhub.teams.models import Role


def entered_review(release):
    """Tell the team's reviewers and admins (not the author) that a release waits for them."""
    url = _link(release)
    members = release.team.memberships.filter(role__gte=Role.REVIEWER).select_related("user")
    to = [m.user.email for m in members if m.user.email and m.user_id != release.created_by_id]
    subject = (
        f"[DeployHub] Review release #{release.pk}: {release.engine} on {release.device_class}"
    )
    body = f"{release.created_by} asks for a review.\n\n{release.note}\n\n{url}\n"
    _send_on_commit(subject, body, to)


def decided(release, review):
    """Tell the release's author what a reviewer decided, with the comment."""
    author, url = release.created_by, _link(release)
    if author is None or not author.email:
        return
    subject = f"[DeployHub] Release #{release.pk}: {review.decision_label.lower()}"
    body = f"{review.reviewer} decided: {review.decision_label}.\n\n{review.comment}\n\n{url}\n"
    _send_on_commit(subject, body, [author.email])


def _link(release):
    return settings.DEPLOYHUB_PUBLIC_URL.rstrip("/") + release.get_absolute_url()


def _send_on_commit(subject, body, to):
    if to:
        transaction.on_commit(lambda: send_mail(subject, body, None, to, fail_silently=True))
