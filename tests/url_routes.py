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


def view_functions(callback):
    """The functions that answer a route: a django-ninja path's operations (each method's),
    the function a functools.partial wraps, else the view itself."""
    for cell in getattr(callback, "__closure__", None) or ():
        operations = getattr(cell.cell_contents, "operations", None)
        if operations is not None:  # ninja's PathView, closed over by its view wrapper
            return [operation.view_func for operation in operations]
    return [getattr(callback, "func", callback)]


def body_fields(callback):
    """The field names a django-ninja operation's body and query schemas declare."""
    names = set()
    for cell in getattr(callback, "__closure__", None) or ():
        for operation in getattr(cell.cell_contents, "operations", None) or ():
            for model in operation.models:
                for field in model.model_fields.values():
                    annotation = field.annotation
                    names |= set(getattr(annotation, "model_fields", {}))
                names |= set(model.model_fields)
    return names
