"""The README quotes the benchmark form's defaults: one figure, read from the form."""

import re
from pathlib import Path

from deployhub.benchmarks import forms

README = Path(__file__).resolve().parent.parent / "README.md"
QUOTE = re.compile(
    r"Warm-up by time \((?P<warmup>[\d.]+) s by default\), then a\s+measured duration "
    r"\((?P<duration>[\d.]+) s by default\), or an iteration count when you give one\s+"
    r"\(after (?P<warmup_iterations>\d+) warm-up iterations by default\)"
)


def readme_defaults():
    found = QUOTE.search(README.read_text())
    assert found, "README.md no longer quotes the benchmark defaults in the expected sentence"
    return {key: float(value) for key, value in found.groupdict().items()}


def test_the_readme_quotes_the_defaults_the_form_shows_and_applies():
    quoted = readme_defaults()
    fields = forms.BenchmarkForm.base_fields

    assert quoted["warmup"] == forms.DEFAULT_WARMUP_S == fields["warmup_s"].initial
    assert quoted["duration"] == forms.DEFAULT_DURATION_S == fields["duration_s"].initial
    assert quoted["warmup_iterations"] == forms.DEFAULT_WARMUP_ITERATIONS
