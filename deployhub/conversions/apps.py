from django.apps import AppConfig


class ConversionsConfig(AppConfig):
    name = "deployhub.conversions"

    def ready(self):
        """Subscribe to export jobs, export each .pt2 the upload pages store, and add the class
        to convert on to the version page."""
        from deployhub.conversions import actions, pages, views
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind
        from deployhub.registry.pages import version_sections
        from deployhub.registry.signals import version_uploaded

        kinds.subscribe(
            JobKind.EXPORT,
            record=actions.record_export,
            inputs=(kinds.model_input,),
            reloads_page=True,  # the exported version joins the page's lineage
        )
        version_uploaded.connect(views.export_uploaded_pt2, dispatch_uid="conversions.export")
        version_sections.contribute(
            "conversions/_version_forms.html", pages.version_part, slot="lineage"
        )
