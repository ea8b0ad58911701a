"""Project-level views: health, home, team switch."""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from deployhub.devices.models import Device
from deployhub.teams.access import teams_of


def _database_ok():
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True, "ok"
    except Exception as exc:
        return False, str(exc)


def _broker_ok():
    from deployhub.celery import app

    try:
        with app.connection_for_write(settings.CELERY_BROKER_URL) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return True, "ok"
    except Exception as exc:
        return False, str(exc)


@require_GET
def healthz(request):
    """Report database, broker and online workers; 503 when the hub cannot work."""
    db_ok, db_detail = _database_ok()
    broker_ok, broker_detail = _broker_ok()
    workers = Device.objects.online().count() if db_ok else None
    healthy = db_ok and broker_ok
    body = {
        "status": "ok" if healthy else "unhealthy",
        "database": db_detail,
        "broker": broker_detail,
        "workers_online": workers,
        "embedded": settings.CELERY_BROKER_URL.startswith("filesystem://"),
    }
    return JsonResponse(body, status=200 if healthy else 503)


@login_required
def home(request):
    return redirect("models")


@login_required
@require_POST
def switch_team(request):
    team = get_object_or_404(teams_of(request.user), pk=request.POST.get("team"))
    request.session["team_id"] = team.pk
    return redirect("models")
