from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "deployhub.teams"
