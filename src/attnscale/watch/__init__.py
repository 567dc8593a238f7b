"""attnscale.watch: attention health, per layer and head, from any model's own forward.

    from attnscale import watch
    numbers = watch.measure(model, batch)          # {"attn/layer_0/head_0/max_score": ..., "attn/max_score": ...}
    stats = watch.measure_heads(model, batch)      # HeadStats: values (layers, measures, heads), rows per head

The package sits just above ``core`` (it imports only ``core``, ``errors`` and
``files``); transformers is imported only when a Hugging Face model is captured.
``capture.py`` reads q and k, ``pool.py`` turns them into per-head numbers,
``measure.py`` runs one probe.
"""

from attnscale.watch.capture import Adapter, AttentionCall, capture_adapter, capture_hooks, capture_weights
from attnscale.watch.sdpa_capture import capture_sdpa
from attnscale.watch.measure import HeadStats, capturing, measure, measure_heads

__all__ = ["Adapter", "AttentionCall", "HeadStats", "capture_adapter", "capture_hf", "capture_hooks", "capture_sdpa",
           "capture_weights", "capturing", "measure", "measure_heads"]


def capture_hf(model, on_call):
    """``hf_capture.capture_hf``, imported on first use (it needs transformers)."""
    from attnscale.watch.hf_capture import capture_hf as capture

    return capture(model, on_call)
