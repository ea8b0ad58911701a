"""Make guessing costly: sign-ins (django-axes) and API and device tokens, per client address.

Sign-ins: after AXES_FAILURE_LIMIT failures for one username, or from one address,
that username or address is locked out for AXES_COOLOFF_TIME (settings.py); the
sign-in page says for how long, and each team of the locked user gets an audit
event. Tokens: after DEPLOYHUB_TOKEN_FAILURE_LIMIT made-up tokens from one address
within DEPLOYHUB_TOKEN_LOCKOUT_SECONDS, the API answers that address 429 for as
long (deployhub/api/auth.py). A made-up token names nobody, so its lockout is a
line in the log and a TokenFailures row in the admin, not a team's event.
"""

import ipaddress
import logging
import math
from datetime import timedelta

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Max, Q
from django.shortcuts import render
from django.utils import timezone

from deployhub.teams.models import Event, Team, TokenFailures

logger = logging.getLogger("deployhub.security")


def client_address(request):
    """Return the caller's address: REMOTE_ADDR, or behind DEPLOYHUB_PROXY_COUNT reverse proxies
    the address the outermost of them saw (X-Forwarded-For, counted from the right)."""
    count = settings.DEPLOYHUB_PROXY_COUNT
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    if count and len(forwarded) >= count and _is_address(forwarded[-count]):
        return forwarded[-count]
    return request.META.get("REMOTE_ADDR") or "0.0.0.0"


def _is_address(text):
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def try_again_in(seconds):
    """Say how long a lockout lasts, in whole minutes rounded up: "try again in 15 minutes"."""
    minutes = max(1, math.ceil(seconds / 60))
    return f"try again in {minutes} minute{'' if minutes == 1 else 's'}"


class SignInThrottle(AxesStandaloneBackend):
    """Refuse a sign-in for a locked-out username or address (axes), before the password check.

    Only sign-ins over HTTP are throttled: authenticate() without a request (the
    test client's login, a management command) has no address to count by.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)


def sign_in_lockout_seconds(request, credentials=None):
    """Return the seconds until the sign-in lockout that refused this request ends."""
    matching = Q(ip_address=request.axes_ip_address)
    if username := get_client_username(request, credentials):
        matching |= Q(username=username)
    latest = AccessAttempt.objects.filter(matching).aggregate(at=Max("attempt_time"))["at"]
    ends = (latest or timezone.now()) + get_cool_off(request)
    return max(1, math.ceil((ends - timezone.now()).total_seconds()))


def lockout_response(request, original_response=None, credentials=None):
    """The sign-in page, 429, saying how long the lockout lasts (axes' AXES_LOCKOUT_CALLABLE)."""
    seconds = sign_in_lockout_seconds(request, credentials)
    message = f"Too many failed sign-ins: {try_again_in(seconds)}."
    response = render(request, "registration/login.html", {"lockout": message}, status=429)
    response["Retry-After"] = str(seconds)
    return response


def record_sign_in_lockout(sender, request, username, ip_address, **kwargs):
    """When a lockout begins, log it and add an event to each team of the user it names.

    axes also sends its signal for each refused attempt during the lockout; those
    are not new lockouts, and record nothing.
    """
    if getattr(request, "axes_failures_since_start", None) != settings.AXES_FAILURE_LIMIT:
        return
    minutes = round(get_cool_off(request).total_seconds() / 60)
    logger.warning(
        "sign-ins locked out for %s min: username %r from %s after %s failures",
        minutes,
        username,
        ip_address,
        settings.AXES_FAILURE_LIMIT,
    )
    user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: username}).first()
    if user is None:
        return
    for team in Team.objects.filter(memberships__user=user):
        Event.record(
            team,
            None,
            "user.locked_out",
            user,
            user=username,
            address=ip_address,
            failures=settings.AXES_FAILURE_LIMIT,
            minutes=minutes,
        )


def token_lockout(request):
    """An expression for the end of the caller's address's token lockout (NULL: none), for the
    token lookup to carry (ApiToken.objects.annotate(lockout=...).by_token(...))."""
    return TokenFailures.objects.lockout_of(client_address(request), timezone.now())


def seconds_until(moment):
    """Whole seconds from now until moment, rounded up; 0 once it has passed."""
    return max(0, math.ceil((moment - timezone.now()).total_seconds())) if moment else 0


def count_token_failure(request):
    """Count a made-up token from the caller's address; return the seconds the address was
    locked out for already (0 when it was not, and this one counted). Log the lockout."""
    now = timezone.now()
    row, counted = TokenFailures.objects.count_failure(
        client_address(request),
        now,
        limit=settings.DEPLOYHUB_TOKEN_FAILURE_LIMIT,
        lockout=timedelta(seconds=settings.DEPLOYHUB_TOKEN_LOCKOUT_SECONDS),
    )
    if not counted:
        return seconds_until(row.locked_until)
    if row.failures == settings.DEPLOYHUB_TOKEN_FAILURE_LIMIT:
        logger.warning(
            "token authentication locked out for %s s: %s after %s made-up tokens (last on %s)",
            settings.DEPLOYHUB_TOKEN_LOCKOUT_SECONDS,
            row.address,
            row.failures,
            request.path[:200],
        )
    return 0
