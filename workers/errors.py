"""Exceptions shared by the job runner and the code it calls."""


class Cancelled(Exception):
    """The job was cancelled while it ran; stop the work and report it."""


class JobError(ValueError):
    """The job cannot run as asked; the message is meant for the person who queued it."""
