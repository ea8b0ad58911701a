"""Show structured values (build configs, job params, specs) as readable key/value text.

A template that prints a dict or a list directly shows a Python repr ("{'precision':
'int8'}"); `{{ value|keyvalues }}` shows "precision int8 · batch 8" instead, nested
keys dotted, lists joined with commas, and "defaults" for an empty mapping.
"""

from django import template
from django.utils.html import format_html, format_html_join

register = template.Library()


def flatten(value, prefix=""):
    """Yield (dotted key, scalar text) pairs of a nested mapping."""
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict) and item:
            yield from flatten(item, f"{name}.")
        else:
            yield name, plain(item)


def plain(value):
    """Return one value as text: lists joined, None as a dash, booleans as yes/no."""
    if isinstance(value, list | tuple):
        return ", ".join(plain(item) for item in value) or "none"
    if isinstance(value, dict):
        return "none"
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


@register.filter
def keyvalues(value, empty="defaults"):
    """Render a mapping as <span class="kv"> pairs; a list or scalar as plain text."""
    if not isinstance(value, dict):
        return plain(value) if value not in (None, "") else empty
    if not value:
        return empty
    pairs = format_html_join(
        " ", '<span class="kv"><span class="k">{}</span> {}</span>', flatten(value)
    )
    return format_html("{}", pairs)
