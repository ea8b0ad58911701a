"""Key stored engines on their canonical build config, as new engines are keyed.

Engines stored before were keyed on the digest of the config as it was asked for,
so {"precision": "f32"} and {} gave two keys for one OpenVINO build. Each engine's
build_config and config_digest are rewritten canonically (every default filled in,
aliases resolved), so asking for the build again in any spelling reuses it. Where
two stored engines turn out to be the same build, the first valid one (oldest
first) takes the canonical key; the others keep their old key, so none is lost
and none breaks the store's uniqueness: they stay served, only not reused.
"""

from django.db import migrations

from workers.backends.base import digest
from workers.backends.known import BACKENDS


def _canonical(engine):
    backend = BACKENDS.get(engine.backend)
    if backend is None or not isinstance(engine.build_config, dict):
        return None
    return backend.canonical_config(engine.build_config)


def canonicalise(apps, schema_editor):
    Engine = apps.get_model("engines", "Engine")
    taken = set(
        Engine.objects.values_list("model_version_id", "backend", "config_digest", "compat_key")
    )
    valid_first = sorted(
        Engine.objects.all(), key=lambda e: (e.status != "valid", e.created_at, e.pk)
    )
    for engine in valid_first:
        config = _canonical(engine)
        if config is None or digest(config) == engine.config_digest:
            continue
        old = (engine.model_version_id, engine.backend, engine.config_digest, engine.compat_key)
        new = (*old[:2], digest(config), old[3])
        if new in taken:
            continue  # the same build is stored already under the canonical key
        taken.discard(old)
        taken.add(new)
        engine.build_config, engine.config_digest = config, new[2]
        engine.save(update_fields=["build_config", "config_digest"])


class Migration(migrations.Migration):
    dependencies = [
        ("engines", "0004_autobuild_side_by_side_ms_autorun_compare_job"),
    ]

    operations = [
        migrations.RunPython(canonicalise, migrations.RunPython.noop),
    ]
