from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "deployhub.demo"
