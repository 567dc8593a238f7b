"""One module per experiment of the chapter: spread, fresh, dynamics, sweep."""

from attnscale.errors import ConfigError
from attnscale.core.scales import check_scale


def head_dim_seed(seed: int, head_dim: int) -> int:
    """The random stream of one width in the init experiments: each width gets its own,
    so adding or dropping a width leaves the others' numbers unchanged."""
    return seed * 1_000_003 + head_dim


def check_head_dims_and_scales(head_dims, scales) -> None:
    """The checks every init experiment's config makes: positive integer widths, known schemes."""
    if not head_dims or any(int(w) != w or w < 1 for w in head_dims):
        raise ConfigError(f"head_dims must be positive integers, got {head_dims}")
    for s in scales:
        check_scale(s)
