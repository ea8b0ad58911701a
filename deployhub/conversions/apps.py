from django.apps import AppConfig


class ConversionsConfig(AppConfig):
    name = "deployhub.conversions"

    def ready(self):
        """Subscribe to export jobs, and export each .pt2 the version page uploads."""
        from deployhub.conversions import actions, views
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind
        from deployhub.registry.signals import version_uploaded

        kinds.subscribe(JobKind.EXPORT, record=actions.record_export, inputs=(kinds.model_input,))
        version_uploaded.connect(views.export_uploaded_pt2, dispatch_uid="conversions.export")
