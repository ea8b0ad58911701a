from django.apps import AppConfig


class EnginesConfig(AppConfig):
    name = "deployhub.engines"

    def ready(self):
        """Subscribe to the job kinds engines owns: builds and side-by-side runs."""
        from deployhub.engines import actions, auto, pages
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind
        from deployhub.jobs.pages import job_sections
        from deployhub.registry.pages import version_sections

        kinds.subscribe(
            JobKind.COMPILE,
            record=actions.record_engine,
            check=actions.check_engine,
            inputs=(
                kinds.model_input,
                actions.calibration_input,
                actions.timing_cache_input,
                actions.calibration_cache_input,
            ),
            reloads_page=True,  # the engine joins the page's store, with its flags
        )
        kinds.subscribe(
            JobKind.COMPARE,
            record=auto.record_comparison,
            inputs=(actions.compared_engine_inputs, kinds.model_input),
        )
        kinds.on_finished(auto.advance_for_job)
        version_sections.contribute(
            "engines/_version_section.html", pages.version_part, slot="work"
        )
        job_sections.contribute("engines/_job_flags.html", order=20)
        job_sections.contribute("engines/_job_compared.html", pages.job_part, order=40)
        kinds.on_reap(auto.advance_running)
