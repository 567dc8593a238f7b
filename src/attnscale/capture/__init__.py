"""attnscale.capture: the q, k, mask, bias and scale of every attention call, from any model, and the one
per-head reduction that turns them into numbers in O(T) memory.

The floor below the watch, training's step measures and inspect, above ``core``:

- ``call``: ``AttentionCall`` and the visible-key rule (``HIDDEN_AT``);
- the captures, each a context manager that hands every call of a forward to ``on_call``:
  ``own`` (attnscale's models), ``hf`` (transformers' AttentionInterface; imports transformers
  when entered), ``sdpa`` (``scaled_dot_product_attention``, and ``multi_head_attention_forward`` read by
  ``mha``: ``nn.MultiheadAttention`` and the ``nn.Transformer*`` layers), ``flex`` (flex_attention, with its
  score_mod and block mask), ``flash`` (flash-attn's functions, varlen included), ``adapter``
  (anything else); ``intercept`` is what the captures of functions share; ``route`` picks one;
- ``reduce``: ``reduce_call``, a call in blocks of query rows, folded into ``sums``: ``HeadSums``, the only
  code that computes the head measures; ``rows``: the keys each query row sees, and the rule for rows that
  see one key; ``fused``: ``measure_call``, a sampled probe's route that reads every
  row's effective words from the attention kernel's log-sum-exp, where the call allows it;
- ``probe``: one forward, every call reduced (``measure_heads``); ``stats``: ``HeadStats``, the one result
  type of every measurement (a probe's, a training step's record, each inspect scheme), read back from
  the sums by ``pack``/``unpack``;
- ``ranks``: the same numbers across ``torch.distributed`` ranks, in one collective.
"""
