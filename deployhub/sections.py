"""Parts of a page that apps above the page's owner draw: a template and a context provider.

A lower app's page names no higher app's URL, tag or template (the layers); a higher
app contributes a part from its AppConfig.ready(), and the page includes the parts in
the order they were contributed. Imports no app (an import-linter contract says so).
"""


class Sections:
    """The contributed parts of one page: `{% for part in <name> %}{% include part %}`."""

    def __init__(self, name):
        self.name = name
        self._parts = []

    def contribute(self, template, provider=None):
        """Draw template on the page, with the context provider(obj) returns (once per template)."""
        if all(known != template for known, _ in self._parts):
            self._parts.append((template, provider))

    def context(self, obj):
        """Return the templates to include, under the page's name, and what they read."""
        context = {self.name: [template for template, _ in self._parts]}
        for _, provider in self._parts:
            if provider is not None:
                context.update(provider(obj))
        return context
