"""Who may see and do what: every object belongs to a team."""

from django.core.exceptions import PermissionDenied

from deployhub.teams.models import Role, Team


def teams_of(user):
    """Return the teams the user is a member of."""
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user)


def current_team(request):
    """Return the team the user is working in (chosen in the session, else the first)."""
    teams = teams_of(request.user)
    chosen = request.session.get("team_id")
    return (chosen and teams.filter(pk=chosen).first()) or teams.first()


def as_id(value):
    """Return a form's id field as an int, or None when it is not one: "²" passes isdigit()
    and 5,000 digits pass isdecimal(), but neither is a database id."""
    text = str(value or "").strip()
    return int(text) if text.isdecimal() and len(text) <= 18 else None


def require_role(user, team, role):
    """Raise PermissionDenied unless the user holds at least `role` in `team`."""
    if team is None:  # a user in no team yet: current_team() found none
        raise PermissionDenied("You are in no team yet: ask a team's admin to add you.")
    held = team.role_of(user)
    if held is None or held < role:
        raise PermissionDenied(f"This needs the {Role(role).label.lower()} role in {team}.")
