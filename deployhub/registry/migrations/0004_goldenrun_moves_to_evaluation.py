# GoldenRun now belongs to the evaluation app (evaluation/0001 keeps its table).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0003_golden_sets"),
        ("evaluation", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="GoldenRun")]
        ),
    ]
