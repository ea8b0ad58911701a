from django.apps import AppConfig


class FiguresConfig(AppConfig):
    """The figures of the dashboard: trade-offs, fleet and trends, drawn from stored runs."""

    name = "deployhub.figures"
