from django.apps import AppConfig


class ParityConfig(AppConfig):
    name = "deployhub.parity"

    def ready(self):
        """Subscribe to parity jobs (they get the spec in their params and the pack as input);
        draw the parity section on the version page."""
        from deployhub.jobs import kinds
        from deployhub.jobs.models import JobKind
        from deployhub.jobs.pages import job_sections
        from deployhub.parity.models import ParityRun, pack_input
        from deployhub.registry.pages import version_sections

        kinds.subscribe(
            JobKind.PARITY,
            record=ParityRun.record,
            inputs=(pack_input,),
            reloads_page=True,  # the run's verdict sets the version's parity gate
        )
        version_sections.contribute("parity/_version_section.html", slot="checks")
        job_sections.contribute("parity/_job_result.html", order=50)
