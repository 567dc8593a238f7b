"""The health check of the heads of pretrained models (``attnscale inspect``).

``engine`` measures every head from the q and k a model uses; ``hf`` reads them
out of Hugging Face models (transformers loads lazily, only here)."""
