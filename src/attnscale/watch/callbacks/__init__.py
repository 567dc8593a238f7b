"""The watch inside a framework's training loop: a Hugging Face Trainer (``hf``) or Lightning (``lightning``)
callback, both thin over ``attach``."""
