from django.apps import AppConfig


class EnginesConfig(AppConfig):
    name = "deployhub.engines"

    def ready(self):
        """Subscribe to the job kinds engines owns: builds, side-by-side runs and evaluations."""
        from deployhub.engines import actions, auto
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind
        from deployhub.registry.golden import record_evaluation

        kinds.subscribe(
            JobKind.COMPILE,
            record=actions.record_engine,
            inputs=(
                kinds.model_input,
                actions.calibration_input,
                actions.timing_cache_input,
                actions.calibration_cache_input,
            ),
        )
        kinds.subscribe(
            JobKind.COMPARE,
            record=auto.record_comparison,
            inputs=(actions.compared_engine_inputs, kinds.model_input),
        )
        kinds.subscribe(
            JobKind.EVALUATE,
            record=record_evaluation,
            inputs=(
                kinds.engine_input,
                kinds.model_input,
                actions.evaluation_dataset_input,
                actions.golden_input,
            ),
        )
        kinds.on_finished(auto.advance_for_job)
        kinds.on_reap(auto.advance_running)
