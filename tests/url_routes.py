"""Every route of the URLconf, as a path a test can call: the walks over the API and the pages."""

from django.urls import URLPattern, URLResolver, get_resolver


def routes(patterns=None, prefix=""):
    """Yield (name, pattern string with converters, view) for every route, includes flattened."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(pattern, URLResolver):
            yield from routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield pattern.name, prefix + str(pattern.pattern), pattern.callback


def filled(route, value_of):
    """Return the route with each <converter:name> replaced by value_of(segment before it,
    converter): the id of an object of that kind, or a made-up one."""
    parts = route.split("/")
    for index, part in enumerate(parts):
        while "<" in part:
            start, end = part.index("<"), part.index(">")
            converter = part[start + 1 : end].split(":")[0]
            before = parts[index - 1] if index else ""
            part = part[:start] + str(value_of(before, converter)) + part[end + 1 :]
        parts[index] = part
    return "/" + "/".join(parts)
