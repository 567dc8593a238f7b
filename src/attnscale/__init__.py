"""attnscale: a laboratory and diagnostic for the score scale in dot-product attention."""

from attnscale.core.attention import Attention, attend, build_mask, masked_softmax
from attnscale.core.hooks import HookPoint, hook_names, hooked
from attnscale.core.scales import SCALES, ScoreScale, get_scale, register_scale, scale_names

__version__ = "0.1.0"

__all__ = [
    "Attention",
    "attend",
    "build_mask",
    "masked_softmax",
    "HookPoint",
    "hook_names",
    "hooked",
    "SCALES",
    "ScoreScale",
    "get_scale",
    "register_scale",
    "scale_names",
    "__version__",
]
