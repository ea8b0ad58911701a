"""Template context: the team the user is working in."""

from deployhub.teams.access import current_team as _current_team
from deployhub.teams.access import teams_of


def current_team(request):
    if not request.user.is_authenticated:
        return {}
    team = _current_team(request)
    return {
        "team": team,
        "teams": teams_of(request.user),
        "role": team.role_of(request.user) if team else None,
    }
