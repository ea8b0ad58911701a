"""What devices announces to the apps above it, which it never imports.

device_revoked: sent in the transaction that revoked a device (actions.revoke_device), with
the device and the user; jobs puts the job it was running back on the queue.
"""

from django.dispatch import Signal

device_revoked = Signal()
