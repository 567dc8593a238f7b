"""The health check of the heads of pretrained models (``attnscale inspect``).

``engine`` measures every head from the q and k a model uses; the adapters feed
it: ``hf`` reads Hugging Face models (transformers loads lazily, only there),
``native`` attnscale's own models, checkpoints and run folders. ``check``
picks the adapter (``inspect_model``); ``show`` prints and draws the result."""
