from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    name = "deployhub.evaluation"

    def ready(self):
        """Subscribe to evaluate jobs (the engine and its source run on a dataset or golden
        set); draw a golden run on its job's page."""
        from deployhub.evaluation import actions
        from deployhub.jobs import kinds
        from deployhub.jobs import pages as job_page
        from deployhub.jobs.models import JobKind

        kinds.subscribe(
            JobKind.EVALUATE,
            record=actions.record_evaluation,
            inputs=(
                kinds.engine_input,
                kinds.model_input,
                actions.dataset_input,
                actions.golden_input,
            ),
        )
        job_page.contribute("evaluation/_job_golden.html", order=30)
