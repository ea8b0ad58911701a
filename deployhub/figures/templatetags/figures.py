"""{% plotly_script %}: the script tag of plotly.js from the installed package, then figures.js."""

from django import template
from django.templatetags.static import static
from django.urls import reverse
from django.utils.html import format_html

from deployhub.figures.http import plotly_version

register = template.Library()


@register.simple_tag
def plotly_script():
    """Return the <script> tags that draw every [data-figure] element of a page."""
    url = f"{reverse('plotly_js')}?v={plotly_version()}"
    return format_html(
        '<script src="{}" defer></script>\n<script src="{}" defer></script>',
        url,
        static("js/figures.js"),
    )
