"""The one exception type for a user's mistake (bad corpus, bad config, bad model path).

The CLI prints its message as one line and exits 2; library callers catch it
as a ``ValueError``. Messages name the problem and the fix."""

__all__ = ["ConfigError", "check_positive_ints"]


class ConfigError(ValueError):
    """Bad input from the user; the message says what is wrong and how to fix it."""


def check_positive_ints(config, names, what: str) -> None:
    """A ConfigError naming the first of ``names`` whose value on ``config`` is not a positive integer
    (bools are not integers here): "{what} {name} must be a positive integer, got ..."."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{what} {name} must be a positive integer, got {value!r}")
