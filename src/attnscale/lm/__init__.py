"""A tiny decoder-only language model, its corpora and tokenizers, and its training loop.

Built on ``attnscale.core``; knows nothing of run folders or reports."""
