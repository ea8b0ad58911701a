"""What devices announces to the apps above it, which it never imports.

device_revoked: sent in the transaction that ended a device's token (actions.revoke_device,
or enrolling its machine again: enrolment.enrol), with the device, the user and why; jobs
puts the job it was running back on the queue.
"""

from django.dispatch import Signal

device_revoked = Signal()
