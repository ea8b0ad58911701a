from django.db import migrations, models


class Migration(migrations.Migration):
    """The queued jobs' index orders a class's jobs by age: an order only it keeps, so the
    planner reads it, not the primary key (jobs/models.py)."""

    dependencies = [
        ("jobs", "0006_claim_refusals"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="job", name="job_queued_by_class"),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state", "queued")),
                fields=["device_class", "created_at", "id"],
                name="job_queued_by_class",
            ),
        ),
    ]
