"""Every /api/v1/ error is the documented JSON body {"error": "..."}, whoever answered it.

Our views answer their refusals as JSON themselves (deployhub/api/auth.py). Django
answers some before or around them, as HTML: an unknown path (404), a method a call
does not take (405, from require_http_methods), a body over DATA_UPLOAD_MAX_MEMORY_SIZE
(RequestDataTooBig, which Django makes a 400: here it is 413), a malformed multipart
body or too many fields (400), a CSRF refusal (403), a crash (500). This middleware,
first in MIDDLEWARE so it sees every answer, turns those into the JSON body too,
keeping their status and headers (a 405 keeps its Allow). Pages keep their HTML.
"""

from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from django.http.multipartparser import MultiPartParserError

API_PREFIX = "/api/v1/"


class ApiErrorsMiddleware:
    """Answer /api/v1/ errors as {"error": "..."}; leave everything else alone."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if is_api(request) and response.status_code >= 400 and not is_json(response):
            if response.has_header("Allow"):  # django-ninja lists a set: its order varies
                response["Allow"] = ", ".join(sorted(response["Allow"].split(", ")))
            return as_json(response, message_for(request, response))
        return response

    def process_exception(self, request, exception):
        """Say what was wrong with the request when Django would answer a bare 400."""
        if not is_api(request):
            return None
        if isinstance(exception, RequestDataTooBig):
            return JsonResponse({"error": too_large()}, status=413)
        if isinstance(exception, MultiPartParserError):
            message = f"The multipart body cannot be read: {exception}"
            return JsonResponse({"error": message}, status=400)
        return None


def too_large():
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return (
        f"The request is too large: a JSON body or the form fields beside a file take at most "
        f"{limit:,} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE); send files as multipart file fields."
    )


def is_api(request):
    return request.path_info.startswith(API_PREFIX)


def is_json(response):
    return response.get("Content-Type", "").startswith("application/json")


def message_for(request, response):
    """Say in words what the status means for this request."""
    status = response.status_code
    if status == 404 and getattr(request, "resolver_match", None) is None:
        return (
            f"There is no API v1 call at {request.path_info}: see docs/api.md and "
            "docs/protocol.md for the calls."
        )
    if status == 405:
        allowed = response.get("Allow", "")
        return f"{request.method} is not allowed on {request.path_info}; it takes {allowed}."
    if status in MESSAGES:
        return MESSAGES[status]
    phrase = HTTPStatus(status).phrase if status in iter(HTTPStatus) else "Error"
    return f"{phrase} (HTTP {status})."


MESSAGES = {
    400: "The request is malformed: the hub cannot read it.",
    403: "Forbidden: this caller may not make this call.",
    404: "Not found.",
    413: "The request is too large.",
    500: "The hub failed to answer this call; it is logged. Try again, or report it.",
}


def as_json(response, message):
    """Return the JSON error body with the response's status, headers and cookies."""
    answer = JsonResponse({"error": message}, status=response.status_code)
    for header, value in response.items():
        if header.lower() not in ("content-type", "content-length"):
            answer[header] = value
    answer.cookies = response.cookies
    return answer
