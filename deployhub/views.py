"""Project-level views: health, home, team switch, the worker wheel devices install."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import Resolver404, resolve
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST, require_safe

from deployhub.core import worker_dist
from deployhub.core.downloads import file_download
from deployhub.devices.models import Device
from deployhub.teams.access import as_id, teams_of
from workers import version


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


@require_safe
def worker_downloads(request):
    """The page naming this hub's worker wheel: what to install, and pip's --find-links page.

    No sign-in, as for the wheel: a device has no session.
    """
    try:
        wheel = worker_dist.worker_wheel()
    except worker_dist.WheelUnavailable as exc:
        return HttpResponse(str(exc), status=503, content_type="text/plain; charset=utf-8")
    context = {
        "wheel": wheel,
        "name": worker_dist.wheel_name(),
        "install": worker_dist.install_command(request.build_absolute_uri("/")),
        "version": version.worker_version(),
        "protocols": f"{version.OLDEST_PROTOCOL}–{version.PROTOCOL}",
    }
    return render(request, "downloads/index.html", context)


@require_safe
def worker_wheel(request, filename):
    """Serve the wheel of this hub's own code; another version's name is a 404 naming it."""
    name = worker_dist.wheel_name()
    if filename != name:
        message = f"This hub serves its own worker only: {name}, at /downloads/{name}.\n"
        return HttpResponse(message, status=404, content_type="text/plain; charset=utf-8")
    try:
        wheel = worker_dist.worker_wheel()
    except worker_dist.WheelUnavailable as exc:
        return HttpResponse(str(exc), status=503, content_type="text/plain; charset=utf-8")
    return file_download(open(wheel.path, "rb"), name)  # FileResponse closes it


@login_required
def home(request):
    return redirect("models")


@login_required
@require_POST
def switch_team(request):
    """Make one of the user's teams the active one, and stay on the same list page."""
    chosen = as_id(request.POST.get("team"))
    if chosen is None:
        raise Http404("No such team.")
    team = get_object_or_404(teams_of(request.user), pk=chosen)
    request.session["team_id"] = team.pk
    messages.success(request, f"You are working in {team} now.")
    return redirect(_team_wide_page(request, request.POST.get("next", "")))


# Pages that show the active team's objects, not one object: the same page serves the new team.
TEAM_WIDE_PAGES = {"models", "device_classes", "jobs", "audit", "team_settings", "api_tokens"}


def _team_wide_page(request, next_url):
    """Return next_url when it is a list page of this site; an object's page goes to Models."""
    if not url_has_allowed_host_and_scheme(next_url, {request.get_host()}):
        return "models"
    try:
        match = resolve(next_url.split("?")[0])
    except Resolver404:
        return "models"
    return next_url if match.url_name in TEAM_WIDE_PAGES else "models"
