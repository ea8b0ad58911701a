from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "deployhub.teams"

    def ready(self):
        """Record every change of a member's role, and every sign-in lockout, in the audit trail."""
        from axes.signals import user_locked_out

        from deployhub.teams import signals, throttle

        signals.connect()
        user_locked_out.connect(
            throttle.record_sign_in_lockout, dispatch_uid="teams.record_sign_in_lockout"
        )
