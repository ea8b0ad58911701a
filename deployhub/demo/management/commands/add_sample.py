"""Add a sample model to a team: `manage.py add_sample resnet18 --team demo --user alice`."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from deployhub.demo import samples
from deployhub.teams.models import Team

SAMPLES = {"resnet18": samples.add_resnet18}


class Command(BaseCommand):
    help = "Add a sample model (made on the spot, random weights) to a team."

    def add_arguments(self, parser):
        parser.add_argument("sample", choices=sorted(SAMPLES))
        parser.add_argument("--team", required=True, help="the team's slug")
        parser.add_argument("--user", required=True, help="who adds it (a member of the team)")

    def handle(self, *args, sample, team, user, **options):
        team_ = Team.objects.filter(slug=team).first()
        if team_ is None:
            raise CommandError(f"There is no team {team!r}.")
        user_ = get_user_model().objects.filter(username=user).first()
        if user_ is None:
            raise CommandError(f"There is no user {user!r}.")
        try:
            model = SAMPLES[sample](team_, user_)
        except samples.SampleExists as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"added {model} (version 1, calibration set 'random') to {team_}")
