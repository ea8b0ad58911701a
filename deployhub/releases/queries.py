"""What a release's state depends on, read from the database: its approvals, the production release.

The actions (which change releases) and the evidence pack (which reads them) both ask
these questions; they live here so that neither imports the other for them.
"""

from deployhub.releases.models import Decision, Release, ReleaseState


def production_of(model, device_class, lock=False):
    """Return the production release of a model on a device class, or None."""
    releases = Release.objects.select_for_update() if lock else Release.objects
    return releases.filter(
        model=model, device_class=device_class, state=ReleaseState.PRODUCTION
    ).first()


def approvals(release):
    """Return the distinct reviewers who approved since the release last entered review."""
    approved = release.current_reviews().filter(decision=Decision.APPROVE)
    return list({review.reviewer_id: review.reviewer for review in approved}.values())
