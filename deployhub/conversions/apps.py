from django.apps import AppConfig


class ConversionsConfig(AppConfig):
    name = "deployhub.conversions"

    def ready(self):
        """Subscribe to export jobs, export each .pt2 the upload pages store, and add the class
        to convert on to the version page."""
        from deployhub.conversions import actions, pages, views
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind
        from deployhub.registry import pages as version_page
        from deployhub.registry.signals import version_uploaded

        kinds.subscribe(JobKind.EXPORT, record=actions.record_export, inputs=(kinds.model_input,))
        version_uploaded.connect(views.export_uploaded_pt2, dispatch_uid="conversions.export")
        version_page.contribute(
            pages.version_part, slot="lineage", template="conversions/_version_forms.html"
        )
