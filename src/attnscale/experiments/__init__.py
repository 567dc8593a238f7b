"""One module per experiment of the chapter: spread, fresh, dynamics, sweep."""

from attnscale.errors import ConfigError
from attnscale.core.scales import get_scale


def check_widths_and_scales(widths, scales) -> None:
    """The checks every init experiment's config makes: positive integer widths, known schemes."""
    if not widths or any(int(w) != w or w < 1 for w in widths):
        raise ConfigError(f"widths must be positive integers, got {widths}")
    for s in scales:
        get_scale(s, 1)
