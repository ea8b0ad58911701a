from django.apps import AppConfig


class ReleasesConfig(AppConfig):
    name = "deployhub.releases"

    def ready(self):
        """Draw the engine's releases and the propose form on the engine page."""
        from deployhub.engines import pages as engine_page
        from deployhub.releases.views import engine_part

        engine_page.contribute_to_engine_page("releases/_engine_section.html", engine_part)
