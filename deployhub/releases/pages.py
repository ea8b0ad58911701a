"""The release page's parts that apps above releases draw (figures: against production)."""

from deployhub.core.sections import Sections

release_sections = Sections("release_sections")
