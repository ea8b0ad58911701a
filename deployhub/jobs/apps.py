from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "deployhub.jobs"

    def ready(self):
        """A no-op job checks the pipeline alone: it gets its version's model, stores nothing.
        The version page ends with the version's jobs."""
        from deployhub.jobs import kinds, pages
        from deployhub.jobs.models import JobKind
        from deployhub.registry import pages as version_page

        kinds.subscribe(JobKind.NOOP, inputs=(kinds.model_input,))
        version_page.contribute(
            pages.version_part,
            slot="activity",
            template="jobs/_version_section.html",
            read_first=True,
        )
