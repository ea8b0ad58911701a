"""Propose a task for every version stored before versions had one (as an upload now does)."""

from django.db import migrations


def propose_tasks(apps, schema_editor):
    from deployhub.registry.tasks import proposed_task

    versions = apps.get_model("registry", "ModelVersion").objects.filter(task={})
    for version in versions.iterator():
        info = {"inputs": version.inputs, "outputs": version.outputs, "graph": version.graph}
        version.task = proposed_task(info)
        version.save(update_fields=["task"])


class Migration(migrations.Migration):
    dependencies = [("registry", "0005_task_aware")]
    operations = [migrations.RunPython(propose_tasks, migrations.RunPython.noop)]
