from django.apps import AppConfig


class ParityConfig(AppConfig):
    name = "deployhub.parity"
