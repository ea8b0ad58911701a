"""Keep Django out of a worker process, even in a virtualenv that has it installed.

Embedded mode installs the hub and the worker in one virtualenv, and kombu
imports `django.utils` whenever it can. A worker process refuses Django
instead, so that a worker module that comes to need it fails at once, here,
rather than on the first device installed without it.
"""

import sys


class RefuseDjango:
    """An import hook that refuses to import Django."""

    def find_spec(self, name, path=None, target=None):
        """Raise ImportError for django and its submodules; leave the rest alone."""
        if name == "django" or name.startswith("django."):
            raise ImportError(f"{name}: a DeployHub worker never imports Django (see {__name__})")
        return None


def keep_django_out():
    """Make Django unimportable in this process, unless it is loaded already (a hub process)."""
    if "django" in sys.modules or any(isinstance(f, RefuseDjango) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, RefuseDjango())
