"""What jobs adds to the version page (registered in apps.py): the version's latest jobs."""


def version_part(version):
    return {"jobs": version.jobs.select_related("device_class", "device")[:20]}
