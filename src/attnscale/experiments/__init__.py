"""One module per experiment of the chapter: spread, fresh, dynamics, sweep."""

from attnscale.errors import ConfigError
from attnscale.core.scales import check_scale


def width_seed(seed: int, width: int) -> int:
    """The random stream of one width in the init experiments: each width gets its own,
    so adding or dropping a width leaves the others' numbers unchanged."""
    return seed * 1_000_003 + width


def check_widths_and_scales(widths, scales) -> None:
    """The checks every init experiment's config makes: positive integer widths, known schemes."""
    if not widths or any(int(w) != w or w < 1 for w in widths):
        raise ConfigError(f"widths must be positive integers, got {widths}")
    for s in scales:
        check_scale(s)
