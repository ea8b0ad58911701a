from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "deployhub.jobs"

    def ready(self):
        """A no-op job checks the pipeline alone: it gets its version's model, stores nothing."""
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind

        kinds.subscribe(JobKind.NOOP, inputs=(kinds.model_input,))
