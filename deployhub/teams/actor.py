"""Who acts in the current request, for events recorded where the request is not at hand.

Django's model signals (a role changed in the admin) do not know the user; the
middleware remembers the request for its duration, so the event names the person.
Outside a request (a command, the shell, a task) nobody is remembered: "system".
"""

import contextvars

_request = contextvars.ContextVar("deployhub_request", default=None)


def current_actor():
    """Return the signed-in user of the request being answered, or None."""
    request = _request.get()
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated else None


class ActorMiddleware:
    """Remember the request while it is answered (API views set request.user later: read late)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        remembered = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(remembered)
