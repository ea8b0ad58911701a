"""Parts of a page that apps above the page's owner draw: a template and a context provider.

A lower app's page names no higher app's URL, tag or template (the layers); a higher
app contributes a part from its AppConfig.ready(), and the page includes the parts
by order, then in the order they were contributed. A page with slots draws each
slot's parts where the slot stands (`{% for part in <name>.<slot> %}`). This is the
one way pages are composed across apps. Imports no app (an import-linter contract says so).
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# What a part's provider returns: the names its template reads.
Provider = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class Part:
    """One contributed part: its template, what reads its context, where and when it is drawn."""

    template: str
    provider: Provider | None = None
    slot: str | None = None
    order: int = 50
    read_first: bool = False


class Sections:
    """The contributed parts of one page: `{% for part in <name> %}{% include part %}`.

    slots, when given, names the places of the page that take parts; each part then
    names one, and the page reads `<name>.<slot>`.
    """

    def __init__(self, name: str, slots: Iterable[str] | None = None) -> None:
        self.name = name
        self.slots = tuple(slots) if slots else None
        self._parts: list[Part] = []

    def contribute(
        self,
        template: str,
        provider: Provider | None = None,
        *,
        slot: str | None = None,
        order: int = 50,
        read_first: bool = False,
    ) -> None:
        """Draw template on the page, with the context provider(*page args) returns.

        Called from an AppConfig.ready(); a template already contributed adds nothing.
        order: lower draws first (ties keep the order of contribution). read_first: the
        provider reads before every other part's (the version page's jobs table: a job
        it reads unfinished is watched by the page, and one it reads finished has its
        results in every part read after it).
        """
        if (slot is None) != (self.slots is None) or (slot and slot not in (self.slots or ())):
            raise ValueError(f"{self.name} takes parts in the slots {self.slots}, not {slot!r}")
        if all(part.template != template for part in self._parts):
            self._parts.append(Part(template, provider, slot, order, read_first))
            self._parts.sort(key=lambda part: part.order)

    def parts(self) -> list[Part]:
        """The parts in the order their providers read: read_first ones, then by order."""
        return sorted(self._parts, key=lambda part: not part.read_first)

    def context(self, *args: Any) -> dict[str, Any]:
        """Return the templates to include, under the page's name, and what they read."""
        context: dict[str, Any] = {self.name: self._templates()}
        for part in self.parts():
            if part.provider is not None:
                context.update(part.provider(*args))
        return context

    def _templates(self) -> list[str] | dict[str, list[str]]:
        if self.slots is None:
            return [part.template for part in self._parts]
        return {slot: [p.template for p in self._parts if p.slot == slot] for slot in self.slots}
