"""attnscale.watch: attention health, per layer and head, inside a training run.

    from attnscale import watch
    numbers = watch.measure(model, batch)          # {"attn/layer_0/head_0/max_score": ..., "attn/max_score": ...}
    stats = watch.measure_heads(model, batch)      # HeadStats: values (layers, measures, heads), rows per head

What a run attaches, over the capture floor (``attnscale.capture``, which reads
q and k and reduces them): ``loop`` (``Watch``, for a plain loop), ``callbacks/``
(a Trainer or Lightning ``WatchCallback``; ``Attached``, for attnscale's own loop), ``alerts``, ``actions`` (what
an alert can do to the run: ``ClipQK``, ``ScaleLR``, ``SkipStep``), ``logs/`` (the watch
log's line and the sinks), ``clip/`` (QK-Clip). Those names load on first use,
so ``import attnscale.watch`` stays light.
"""

from attnscale.capture.adapter import Adapter, capture_adapter
from attnscale.capture.call import AttentionCall
from attnscale.capture.own import capture_hooks, capture_weights
from attnscale.capture.probe import Inputs, measure, measure_heads
from attnscale.capture.ranks import TensorParallel
from attnscale.capture.route import capturing
from attnscale.capture.sdpa import capture_sdpa
from attnscale.capture.stats import HeadStats

# name -> the module that defines it, imported when the name is first read
_LAZY = {
    "capture_hf": "attnscale.capture.hf",
    "capture_flex": "attnscale.capture.flex",
    "capture_flash": "attnscale.capture.flash",
    "Watch": "attnscale.watch.loop",
    "WatchCallback": "attnscale.watch.callbacks.hf",
    "Attached": "attnscale.watch.callbacks.attach",
    "QKClip": "attnscale.watch.clip.qk_clip",
    **{name: "attnscale.watch.logs.sinks" for name in ("JsonlSink", "CsvSink", "TensorBoardSink", "WandbSink")},
    **{name: "attnscale.watch.alerts" for name in ("Alert", "Alerts", "Firing", "default_alerts", "MaxScore", "Collapsed",
                                                   "Frozen", "NonFinite", "Spike")},
    **{name: "attnscale.watch.logs.line" for name in ("WatchLine", "read_log")},
    **{name: "attnscale.watch.actions" for name in ("Action", "ClipQK", "ScaleLR", "SkipStep")},
}

__all__ = ["Adapter", "AttentionCall", "HeadStats", "Inputs", "TensorParallel", "capture_adapter", "capture_hooks", "capture_sdpa",
           "capture_weights", "capturing", "measure", "measure_heads", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'attnscale.watch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # the name is bound to the object, not to a submodule of the same name
    return value
