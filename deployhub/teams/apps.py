from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "deployhub.teams"

    def ready(self):
        """Record every change of a member's role in the audit trail; count failed sign-ins."""
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from deployhub.teams import signals, throttle

        signals.connect()
        user_login_failed.connect(
            throttle.count_sign_in_failure, dispatch_uid="teams.count_sign_in_failure"
        )
        user_logged_in.connect(
            throttle.forget_sign_in_failures, dispatch_uid="teams.forget_sign_in_failures"
        )
