"""Errors a user can act on. The CLI and the worker print them as one line, without a traceback."""


class VkllmError(Exception):
    """Base of every user-facing error: the message says what is wrong and what to do."""
