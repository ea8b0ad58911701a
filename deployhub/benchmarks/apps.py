from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    name = "deployhub.benchmarks"

    def ready(self):
        """Subscribe to benchmark jobs: they run an engine (or the model itself) and store a run."""
        from deployhub.benchmarks.models import BenchmarkRun
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind

        kinds.subscribe(
            JobKind.BENCHMARK,
            record=BenchmarkRun.record,
            inputs=(kinds.engine_input, kinds.model_input),
        )
