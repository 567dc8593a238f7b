"""QK-Clip: shrinking W_q and W_k of a head whose scores pass tau (``qk_clip``), in the rows each
head keeps (``projections``)."""
