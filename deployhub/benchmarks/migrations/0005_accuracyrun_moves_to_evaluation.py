# AccuracyRun now belongs to the evaluation app (evaluation/0001 keeps its table).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("benchmarks", "0004_benchmark_conditions"),
        ("evaluation", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="AccuracyRun")]
        ),
    ]
