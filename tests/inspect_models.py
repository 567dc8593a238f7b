"""The tiny models and texts the inspect tests share: a two-layer attnscale model at unit init, token ids for it,
two texts, and an ``on_layer`` that keeps the patterns a measurement sees."""

import torch

from attnscale.lm.model import ModelConfig, build_model

TEXTS = [
    "The scale keeps the scores small, so the softmax stays soft and the head can still learn.",
    "Short one.",
]


def tiny_lm(**kw):
    base = {"vocab_size": 50, "context": 32, "d_model": 32, "n_layers": 2, "n_heads": 4, "head_dim": 16, "init": "unit"}
    return build_model(ModelConfig(**{**base, **kw}), seed=0)


def ids(B=3, T=32):
    return torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(0))


def collect(store):
    def on_layer(layer, scheme, scores_BHTT, pattern_BHTT):
        if scheme == "model":
            store.setdefault(layer, []).append(pattern_BHTT)

    return on_layer


def save_tiny_llama(folder, tokenizer=True):
    """A ``LlamaForCausalLM`` saved as a Hugging Face folder (config.json, model.safetensors) at seed 0, with
    a word-level tokenizer over ``TEXTS``' words beside it where ``tokenizer``: made here, no download."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for t in TEXTS for w in t.replace(",", " ").replace(".", " ").split()})
    vocab = {"[UNK]": 0, "[PAD]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    cfg = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=1)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    if tokenizer:
        words_only = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        words_only.pre_tokenizer = pre_tokenizers.Whitespace()
        transformers.PreTrainedTokenizerFast(tokenizer_object=words_only, unk_token="[UNK]",
                                             pad_token="[PAD]").save_pretrained(folder)
    return folder
