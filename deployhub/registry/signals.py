"""What registry announces to the apps above it, which it never imports.

version_uploaded: sent by the upload pages after a version is stored, with the
request and the upload form's cleaned data; conversions queues a .pt2's export.
"""

from django.dispatch import Signal

version_uploaded = Signal()
