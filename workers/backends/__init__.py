"""Runtime backends: one file per runtime on the small base in base.py, listed in known.py.

Importing this package imports no runtime: each backend imports its own
inside the methods that need it, so the hub can use the compatibility
functions on a machine without any runtime installed.
"""
