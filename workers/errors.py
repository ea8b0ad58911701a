"""Exceptions shared by the job runner and the backends it calls."""


class Cancelled(Exception):
    """The job was cancelled while it ran; stop the work and report it."""
