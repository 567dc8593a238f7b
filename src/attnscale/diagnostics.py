"""Stable alias of ``attnscale.core.diagnostics``, the path earlier releases documented."""

from attnscale.core.diagnostics import *  # noqa: F401,F403
from attnscale.core.diagnostics import __all__  # noqa: F401
