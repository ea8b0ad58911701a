from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo data: seed_demo, the ResNet-18 sample and its button on the models list."""

    name = "deployhub.demo"

    def ready(self):
        from deployhub.registry.pages import models_list_sections

        models_list_sections.contribute("demo/_sample_model.html")
