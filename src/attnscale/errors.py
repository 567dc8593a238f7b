"""The one exception type for a user's mistake (bad corpus, bad config, bad model path).

The CLI prints its message as one line and exits 2; library callers catch it
as a ``ValueError``. Messages name the problem and the fix."""

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """Bad input from the user; the message says what is wrong and how to fix it."""
