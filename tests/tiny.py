"""Tiny random-initialised models and a small real BPE tokenizer, for tests without weights.

``tiny_tokenizer()`` trains a byte-level BPE (a few hundred tokens, ChatML special
tokens and chat template) on a built-in text in milliseconds. ``tiny_model(kind)``
builds a 2-layer Llama or Qwen2 with that vocabulary. ``save_tiny`` writes both to a
folder that the engine loads like any local model.
"""

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from engine.models.loading import LoadedModel, end_of_turn_ids

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TRAINING_TEXT = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Speculative decoding drafts tokens cheaply and verifies them in one pass.",
    "for i in range(10):\n    print(i * i)\n",
    "Please summarise the following document in two sentences.",
    "Zürich café naïve résumé – 東京 😀",
]


def tiny_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(TRAINING_TEXT, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        bos_token=None, unk_token=None,
    )
    tok.chat_template = CHATML
    return tok


def tiny_model(
    kind: str = "llama", vocab_size: int = 320, seed: int = 0, layers: int = 2,
    dtype: torch.dtype = torch.float64, max_positions: int = 256, scale: float = 1.0,
) -> Any:
    """A random-init causal LM; ``scale`` sharpens its output distribution."""
    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        eos_token_id=2, bos_token_id=None, pad_token_id=0, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.to(dtype).eval()


def tiny_loaded(name: str = "tiny", **kwargs: Any) -> LoadedModel:
    tok = tiny_tokenizer(kwargs.get("vocab_size", 320))
    model = tiny_model(**kwargs)
    return LoadedModel(
        name, model, tok, None, model.config.max_position_embeddings, end_of_turn_ids(model, tok)
    )


def save_tiny(folder: Path, **kwargs: Any) -> Path:
    """Write a tiny model and tokenizer as a local model folder (float32)."""
    kwargs.setdefault("dtype", torch.float32)
    tiny_model(**kwargs).save_pretrained(folder)
    tiny_tokenizer(kwargs.get("vocab_size", 320)).save_pretrained(folder)
    return folder
