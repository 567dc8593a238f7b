"""attnscale.watch: attention health, per layer and head, from any model's own forward.

    from attnscale import watch
    numbers = watch.measure(model, batch)          # {"attn/layer_0/head_0/max_score": ..., "attn/max_score": ...}
    stats = watch.measure_heads(model, batch)      # HeadStats: values (layers, measures, heads), rows per head

The package sits just above ``core`` (it imports only ``core``, ``errors`` and
``files``); transformers is imported only when a Hugging Face model is captured.
``capture.py``, ``hf_capture.py`` and ``sdpa_capture.py`` read q and k,
``pool.py`` turns them into per-head numbers, ``measure.py`` runs one probe;
``loop.py`` (``Watch``), ``hf.py`` and ``lightning.py`` (a ``WatchCallback`` each,
sharing ``attach.py``), ``alerts.py``, ``sinks.py`` and ``record.py`` take the
probes into a training run; ``qk_clip.py`` (with ``projections.py``) acts on
the weights, ``distributed.py`` reduces across ranks. Those names load on first
use, so ``import attnscale.watch`` stays light.
"""

from attnscale.watch.capture import Adapter, AttentionCall, capture_adapter, capture_hooks, capture_weights
from attnscale.watch.measure import HeadStats, capturing, measure, measure_heads
from attnscale.watch.sdpa_capture import capture_sdpa

# name -> the module that defines it, imported when the name is first read
_LAZY = {
    "capture_hf": "attnscale.watch.hf_capture",
    "Watch": "attnscale.watch.loop",
    "WatchCallback": "attnscale.watch.hf",
    "QKClip": "attnscale.watch.qk_clip",
    **{name: "attnscale.watch.sinks" for name in ("JsonlSink", "CsvSink", "TensorBoardSink", "WandbSink")},
    **{name: "attnscale.watch.alerts" for name in ("Alert", "Alerts", "Firing", "default_alerts", "MaxScore", "Collapsed",
                                                   "Frozen", "NonFinite", "Spike")},
    **{name: "attnscale.watch.record" for name in ("WatchRecord", "read_log")},
}

__all__ = ["Adapter", "AttentionCall", "HeadStats", "capture_adapter", "capture_hooks", "capture_sdpa", "capture_weights",
           "capturing", "measure", "measure_heads", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'attnscale.watch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # the name is bound to the object, not to a submodule of the same name
    return value
