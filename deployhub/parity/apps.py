from django.apps import AppConfig


class ParityConfig(AppConfig):
    name = "deployhub.parity"

    def ready(self):
        """Subscribe to parity jobs (they get the spec in their params and the pack as input);
        draw the parity section on the version page."""
        from deployhub.jobs import kinds
        from deployhub.jobs import pages as job_page
        from deployhub.jobs.models import JobKind
        from deployhub.parity.models import ParityRun, pack_input
        from deployhub.registry import pages as version_page

        kinds.subscribe(JobKind.PARITY, record=ParityRun.record, inputs=(pack_input,))
        version_page.contribute(slot="checks", template="parity/_version_section.html")
        job_page.contribute("parity/_job_result.html", order=50)
