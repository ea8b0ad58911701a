from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    name = "deployhub.evaluation"

    def ready(self):
        """Subscribe to evaluate jobs (the engine and its source run on a dataset or golden
        set); draw a golden run on its job's page."""
        from deployhub.evaluation import actions
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind
        from deployhub.jobs.pages import job_sections

        kinds.subscribe(
            JobKind.EVALUATE,
            record=actions.record_evaluation,
            inputs=(
                kinds.engine_input,
                kinds.model_input,
                actions.dataset_input,
                actions.golden_input,
            ),
            reloads_page=True,  # the golden run or accuracy joins the engine's gates and flags
        )
        job_sections.contribute("evaluation/_job_golden.html", order=30)
