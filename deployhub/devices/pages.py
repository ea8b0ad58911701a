"""The device and device class pages' parts that apps above devices draw (figures: the
fingerprint timeline)."""

from deployhub.sections import Sections

device_sections = Sections("device_sections")
class_sections = Sections("class_sections")
