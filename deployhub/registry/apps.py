from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "deployhub.registry"

    def ready(self):
        """Subscribe to export jobs: each turns a version into a new ONNX child version."""
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind
        from deployhub.registry.exports import record_export

        kinds.subscribe(JobKind.EXPORT, record=record_export, inputs=(kinds.model_input,))
