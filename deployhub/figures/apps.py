from django.apps import AppConfig


class FiguresConfig(AppConfig):
    """The figures of the dashboard: trade-offs, fleet and trends, drawn from stored runs."""

    name = "deployhub.figures"

    def ready(self):
        contribute_engine_figures()


def contribute_engine_figures():
    """Draw the engine page's figures: latency distribution, against production, batch sweep."""
    from deployhub.engines.pages import contribute_to_engine_page
    from deployhub.figures.engine_views import engine_part

    contribute_to_engine_page("figures/_engine_figures.html", engine_part)
