from django.apps import AppConfig


class FiguresConfig(AppConfig):
    """The figures of the dashboard: trade-offs, fleet and trends, drawn from stored runs."""

    name = "deployhub.figures"

    def ready(self):
        """Make the model page the model's home: the explorer, best engines, exports."""
        from deployhub.figures.home import model_part
        from deployhub.registry.pages import model_sections

        model_sections.contribute("figures/_model_home.html", model_part)
        contribute_engine_figures()
        contribute_release_and_device_figures()


def contribute_engine_figures():
    """Draw the engine page's figures: latency distribution, against production, batch sweep."""
    from deployhub.engines.pages import engine_sections
    from deployhub.figures.engine_views import engine_part

    engine_sections.contribute("figures/_engine_figures.html", engine_part)


def contribute_release_and_device_figures():
    """Draw the release page's comparison and the device pages' fingerprint timelines."""
    from deployhub.devices.pages import class_sections, device_sections
    from deployhub.releases.pages import release_sections

    release_sections.contribute("figures/_release_comparison.html")
    device_sections.contribute("figures/_device_timeline.html", slot="changes")
    class_sections.contribute("figures/_class_timeline.html", slot="devices")
