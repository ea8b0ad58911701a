from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    name = "deployhub.benchmarks"

    def ready(self):
        """Subscribe to benchmark jobs (they run an engine, or the model itself, and store a run);
        add the results and the benchmark form to the version page."""
        from deployhub.benchmarks.models import BenchmarkRun
        from deployhub.benchmarks.pages import job_part, version_part
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind
        from deployhub.jobs.pages import job_sections
        from deployhub.registry.pages import version_sections

        kinds.subscribe(
            JobKind.BENCHMARK,
            record=BenchmarkRun.record,
            inputs=(kinds.engine_input, kinds.model_input),
        )
        version_sections.contribute("benchmarks/_version_section.html", version_part, slot="work")
        job_sections.contribute("benchmarks/_job_result.html", job_part, order=10)
