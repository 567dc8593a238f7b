"""Stable alias of ``attnscale.core.scales``, the path earlier releases documented."""

from attnscale.core.scales import *  # noqa: F401,F403
from attnscale.core.scales import __all__  # noqa: F401
