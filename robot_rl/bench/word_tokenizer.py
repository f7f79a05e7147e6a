"""Word-level tokenizers for the VLAs the benches and tests build offline: whole words of the
instructions they use, each one token, anything else ``<unk>``; a real tokenizer's vocabulary comes
from the Hub, and only the token ids' range matters to a model with random weights."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

WORDS = ["push", "pick", "place", "the", "a", "cube", "block", "red", "green", "blue", "yellow", "to", "left",
         "right", "front", "back", "of", "and", "on"]


def word_level_tokenizer(specials: list[str], words: list[str] = WORDS, **kwargs: Any) -> PreTrainedTokenizerFast:
    """``specials`` first (``<pad>`` and ``<unk>`` among them), then ``words``; the specials are whole
    tokens, never split by the whitespace pre-tokenizer. ``kwargs``: the tokenizer's own settings."""
    vocab = {token: i for i, token in enumerate(specials + words)}
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, pad_token="<pad>", unk_token="<unk>", **kwargs)
    unsplit = [token for token in specials if token not in ("<pad>", "<unk>")]
    tokenizer.add_special_tokens({"additional_special_tokens": unsplit}, replace_extra_special_tokens=False)
    return tokenizer
