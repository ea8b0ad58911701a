"""What may change after an upload: a model's description, a version's notes and tags.

A version's file and what was read from it never change (its task is declared in
registry/tasks.py); another spec or contract is a new version (uploads.derive_version).
The page and the API both change them here, so the audit trail records each change once.
"""

from django.db import transaction

from deployhub.teams.models import Event

# The longest tag a version takes.
TAG_CHARS = 40


def tidy_tags(tags):
    """Return tags as a version keeps them: stripped, blank ones dropped, each once, sorted."""
    return sorted({tag.strip() for tag in tags if tag.strip()})


def edit_notes(version, user, *, notes=None, tags=None):
    """Change a version's notes, its tags or both (None keeps one as it is)."""
    before = {"notes": version.notes, "tags": version.tags}
    if notes is not None:
        version.notes = notes
    if tags is not None:
        version.tags = tidy_tags(tags)
    after = {"notes": version.notes, "tags": version.tags}
    with transaction.atomic():
        version.save(update_fields=["notes", "tags"])
        Event.record(version.team, user, "version.notes", version, before=before, after=after)
    return version


def describe_model(model, user, description):
    """Change what a model's description says about it."""
    before = model.description
    model.description = description
    with transaction.atomic():
        model.save(update_fields=["description"])
        Event.record(model.team, user, "model.described", model, before=before, after=description)
    return model
