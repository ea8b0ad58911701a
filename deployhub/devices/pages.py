"""The device, device class and fleet pages' parts that apps above devices draw (figures:
the fingerprint timelines; jobs: the recent jobs at the foot of the device and class pages,
each class's waiting work on the fleet page)."""

from deployhub.core.sections import Sections

# "changes": in the device's Changes card; "end": the foot of the page.
device_sections = Sections("device_sections", slots=("changes", "end"))
# "devices": below the class's devices; "end": the foot of the page.
class_sections = Sections("class_sections", slots=("devices", "end"))
fleet_sections = Sections("fleet_sections")  # drawn with the team
