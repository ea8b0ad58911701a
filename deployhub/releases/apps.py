from django.apps import AppConfig


class ReleasesConfig(AppConfig):
    name = "deployhub.releases"

    def ready(self):
        """Draw the engine's releases and the propose form on the engine page."""
        from deployhub.engines.pages import engine_sections
        from deployhub.releases.views import engine_part

        engine_sections.contribute("releases/_engine_section.html", engine_part)
