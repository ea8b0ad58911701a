"""Events are append-only in the database too: on PostgreSQL a trigger refuses UPDATE and
DELETE of teams_event rows, whoever asks (a shell, raw SQL, a cascade). TRUNCATE fires
no row trigger, so a test database is still emptied between transactional tests.

SQLite (make run, one user's laptop) gets no trigger: Django empties a SQLite test
database with DELETE, and the model refuses updates and deletes there as everywhere.
A team with events is protected from deletion, rather than failing at the trigger.
"""

import django.db.models.deletion
from django.db import migrations, models

CREATE = """
CREATE FUNCTION teams_event_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'Events are append-only: % of an event is refused.', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER teams_event_append_only BEFORE UPDATE OR DELETE ON teams_event
    FOR EACH ROW EXECUTE FUNCTION teams_event_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS teams_event_append_only ON teams_event;
DROP FUNCTION IF EXISTS teams_event_append_only();
"""


def on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)  # no placeholders: RAISE has a %

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("teams", "0007_token_failures"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="teams.team",
            ),
        ),
        migrations.RunPython(on_postgresql(CREATE), on_postgresql(DROP)),
    ]
