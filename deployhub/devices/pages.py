"""The device, device class and fleet pages' parts that apps above devices draw (figures:
the fingerprint timeline; jobs: each class's waiting work on the fleet page)."""

from deployhub.sections import Sections

device_sections = Sections("device_sections")
class_sections = Sections("class_sections")
fleet_sections = Sections("fleet_sections")  # drawn with the team
