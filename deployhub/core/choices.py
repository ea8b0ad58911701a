"""Status choice sets that carry a label and a colour, so templates never hard-code colours."""


class ChoiceSet:
    """A set of (value, label, colour) triples; subclasses list them in CHOICES."""

    CHOICES: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        return [(value, label) for value, label, _ in cls.CHOICES]

    @classmethod
    def label(cls, value: str) -> str:
        return next((label for v, label, _ in cls.CHOICES if v == value), value)

    @classmethod
    def color(cls, value: str) -> str:
        return next((color for v, _, color in cls.CHOICES if v == value), "grey")
