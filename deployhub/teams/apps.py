from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "deployhub.teams"

    def ready(self):
        """Record every change of a member's role in the audit trail."""
        from deployhub.teams import signals

        signals.connect()
