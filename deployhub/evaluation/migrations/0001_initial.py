# AccuracyRun (from benchmarks) and GoldenRun (from registry) move to evaluation, their home.
# Their tables stay as they are: this changes Django's state only, no data moves.

import django.db.models.deletion
from django.db import migrations, models

ACCURACY_RUN = migrations.CreateModel(
    name="AccuracyRun",
    fields=[
        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
        ("samples", models.PositiveIntegerField()),
        ("reference_top1", models.FloatField(null=True)),
        ("reference_top5", models.FloatField(null=True)),
        ("top1", models.FloatField(null=True)),
        ("top5", models.FloatField(null=True)),
        ("top1_agreement", models.FloatField()),
        ("max_abs_error", models.FloatField()),
        ("mean_abs_error", models.FloatField()),
        ("cosine_min", models.FloatField()),
        ("cosine_mean", models.FloatField()),
        ("details", models.JSONField(default=dict)),
        ("created_at", models.DateTimeField(auto_now_add=True)),
        ("dataset", models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="accuracy_runs", to="registry.dataset")),
        ("engine", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="accuracy", to="engines.engine")),
        ("job", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name="accuracy", to="jobs.job")),
    ],
    options={"db_table": "benchmarks_accuracyrun", "ordering": ["-created_at"]},
)

GOLDEN_RUN = migrations.CreateModel(
    name="GoldenRun",
    fields=[
        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
        ("passed", models.BooleanField()),
        ("reference_passed", models.BooleanField(help_text="Whether the FP32 source reproduced the pairs in the same job.", null=True)),
        ("pairs", models.PositiveIntegerField()),
        ("atol", models.FloatField()),
        ("rtol", models.FloatField()),
        ("outputs", models.JSONField(default=list, help_text="One report per checked output.")),
        ("created_at", models.DateTimeField(auto_now_add=True)),
        ("engine", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="golden_runs", to="engines.engine")),
        ("job", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name="golden_run", to="jobs.job")),
        ("golden_set", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="runs", to="registry.goldenset")),
    ],
    options={"db_table": "registry_goldenrun", "ordering": ["-created_at", "-id"]},
)


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("benchmarks", "0004_benchmark_conditions"),
        ("engines", "0006_autorun_compare_job_related_name"),
        ("jobs", "0004_job_failure_category"),
        ("registry", "0003_golden_sets"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[ACCURACY_RUN, GOLDEN_RUN]),
    ]
