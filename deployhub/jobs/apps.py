from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "deployhub.jobs"

    def ready(self):
        """A no-op job checks the pipeline alone: it gets its version's model, stores nothing.
        The version, device and class pages end with their recent jobs; the fleet page shows
        each class's waiting work. A revoked device's job is re-queued."""
        from deployhub.devices.pages import class_sections, device_sections, fleet_sections
        from deployhub.devices.signals import device_revoked
        from deployhub.jobs import backlog, kinds, pages
        from deployhub.jobs.models import JobKind
        from deployhub.registry.pages import version_sections

        kinds.subscribe(JobKind.NOOP, inputs=(kinds.model_input,))
        version_sections.contribute(
            "jobs/_version_section.html", pages.version_part, slot="activity", read_first=True
        )
        fleet_sections.contribute("jobs/_fleet_queues.html", backlog.fleet_part)
        device_sections.contribute("jobs/_recent.html", pages.device_part, slot="end")
        class_sections.contribute("jobs/_recent.html", pages.class_part, slot="end")
        device_revoked.connect(_take_back_jobs, dispatch_uid="jobs.device_revoked")


def _take_back_jobs(sender, device, user=None, why=None, **kwargs):
    """A device whose token ended finishes nothing: its running job goes back on the queue."""
    from deployhub.jobs.actions import take_back_from_revoked

    take_back_from_revoked(device, user, why)
