"""Make guessing costly: sign-ins per (username, address) and per address, API and device
tokens per address.

Sign-ins: DEPLOYHUB_LOGIN_FAILURE_LIMIT failures of one username from one address
lock that username out from that address, and DEPLOYHUB_LOGIN_ADDRESS_FAILURE_LIMIT
failures from one address, whatever the usernames, lock that address out (password
spraying), each counted over DEPLOYHUB_LOGIN_WINDOW_MINUTES and locked for
DEPLOYHUB_LOGIN_LOCKOUT_MINUTES (settings.py). So people behind one address (an
office NAT) do not lock each other out, and a stranger cannot lock a user out from
her own address. A sign-in clears its own pair's count; the sign-in page says what
is locked and until when, and each team of a locked-out user gets an audit event.
Tokens: after DEPLOYHUB_TOKEN_FAILURE_LIMIT made-up tokens from one address
within DEPLOYHUB_TOKEN_LOCKOUT_SECONDS, the API answers that address 429 for as
long (deployhub/api/auth.py). Only tokens the hub does not know count: a known token
at the wrong call is a 403 and nothing more. A made-up token names nobody, so its
lockout is a line in the log and a TokenFailures row in the admin, not a team's event.
"""

import ipaddress
import logging
import math
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.shortcuts import render
from django.utils import timezone

from deployhub.teams.models import ANY_USERNAME, Event, SignInFailures, Team, TokenFailures

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


class SignInThrottle:
    """Refuse a sign-in whose username is locked out at its address, or whose address is,
    before any password is checked (first in AUTHENTICATION_BACKENDS).

    It authenticates nobody and has no get_user: a session is never tied to it, so a
    login made without a password (the test client's force_login) goes to ModelBackend.

    Only sign-ins over HTTP are throttled: authenticate() without a request (the
    test client's login, a management command) has no address to count by.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        lockout = SignInFailures.objects.lockout_of(
            username or ANY_USERNAME, client_address(request), timezone.now()
        )
        if lockout is not None:
            request.sign_in_lockout = lockout
            raise PermissionDenied
        return None


def count_sign_in_failure(sender, credentials, request=None, **kwargs):
    """Count a failed sign-in for its username at its address and for its address (Django's
    user_login_failed); a lockout it begins is recorded and answered at once.

    A sign-in the throttle refused is not counted: a lockout never extends itself.
    """
    if request is None or hasattr(request, "sign_in_lockout"):
        return
    username = str(credentials.get("username") or ANY_USERNAME)[:150]
    limits = {username: settings.DEPLOYHUB_LOGIN_FAILURE_LIMIT} if username else {}
    limits[ANY_USERNAME] = settings.DEPLOYHUB_LOGIN_ADDRESS_FAILURE_LIMIT
    for key, limit in limits.items():
        locked = SignInFailures.objects.count_failure(
            key,
            client_address(request),
            timezone.now(),
            limit=limit,
            window=timedelta(minutes=settings.DEPLOYHUB_LOGIN_WINDOW_MINUTES),
            lockout=timedelta(minutes=settings.DEPLOYHUB_LOGIN_LOCKOUT_MINUTES),
        )
        if locked is not None:
            request.sign_in_lockout = locked
            record_sign_in_lockout(locked)


def forget_sign_in_failures(sender, request, user, **kwargs):
    """Clear the failures of a user's username at the address she signed in from (Django's
    user_logged_in). Her address's count stays: signing in to an account of one's own
    does not buy more guesses at others'."""
    username = user.get_username()
    if request is None or not username:
        return
    SignInFailures.objects.filter(username=username, address=client_address(request)).delete()


def record_sign_in_lockout(row):
    """Log a sign-in lockout that began, and add an event to each team of the user it names."""
    minutes = settings.DEPLOYHUB_LOGIN_LOCKOUT_MINUTES
    who = "every username" if row.of_address else f"username {row.username!r}"
    logger.warning(
        "sign-ins locked out for %s min: %s from %s after %s failures",
        minutes,
        who,
        row.address,
        row.failures,
    )
    if row.of_address:
        return
    user_model = get_user_model()
    user = user_model.objects.filter(**{user_model.USERNAME_FIELD: row.username}).first()
    if user is None:
        return
    for team in Team.objects.filter(memberships__user=user):
        Event.record(
            team,
            None,
            "user.locked_out",
            user,
            user=row.username,
            address=row.address,
            failures=row.failures,
            minutes=minutes,
        )


def lockout_message(row, seconds):
    """Say what a sign-in lockout locks and until when."""
    until = f"{timezone.localtime(row.locked_until):%H:%M %Z} ({try_again_in(seconds)})"
    if row.of_address:
        return (
            f"Too many failed sign-ins from your address ({row.address}), whatever the "
            f"username: nobody can sign in from it until {until}."
        )
    return (
        f"Too many failed sign-ins as {row.username} from your address ({row.address}): "
        f"{row.username} cannot sign in from it until {until}. "
        "Other users at this address are not affected."
    )


class SignInLockoutMiddleware:
    """Answer a sign-in that a lockout refused, or that began one, with the sign-in page, 429,
    saying what is locked and until when (on /login/ and /admin/login/ alike)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        lockout = getattr(request, "sign_in_lockout", None)
        if lockout is None:
            return response
        seconds = max(1, seconds_until(lockout.locked_until))
        message = lockout_message(lockout, seconds)
        response = render(request, "registration/login.html", {"lockout": message}, status=429)
        response["Retry-After"] = str(seconds)
        return response


def token_lockout(request):
    """An expression for the end of the caller's address's token lockout (NULL: none), for the
    token lookup to carry (ApiToken.objects.annotate(lockout=...).by_token(...))."""
    return TokenFailures.objects.lockout_of(client_address(request), timezone.now())


def token_lockout_seconds(request):
    """Seconds until the token lockout of the caller's address ends (0: it is not locked out)."""
    locked = TokenFailures.objects.filter(
        address=client_address(request), locked_until__gt=timezone.now()
    )
    return seconds_until(locked.values_list("locked_until", flat=True).first())


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
