"""LeRobot's pi0 and pi0.5 built offline: their PaliGemma at full size or at a small stand-in size,
and a local tokenizer in place of google/paligemma-3b-pt-224's.

LeRobot's PI0/PI05 fix their VLM: ``paligemma_variant`` and ``action_expert_variant`` accept only
``gemma_2b`` and ``gemma_300m`` (``get_gemma_config``), and ``PaliGemmaWithExpertModel`` fixes the
vocabulary (257,152 tokens) and the SigLIP So400m vision tower. At ``full`` nothing is changed: the
real architecture (PaliGemma 2B, SigLIP So400m, the 300 M action expert; 4.0 B parameters as
LeRobot builds them, 0.8 B of them in two output heads pi0 never uses) with random weights. ``tiny``
is a size stand-in for CPU smoke runs, as the bench's tiny SmolVLM is: while
``paligemma_size("tiny")`` is active, LeRobot's own classes build those two variants at the widths of
``TINY_GEMMA``, with a 1-layer vision tower and a vocabulary of ``TINY_VOCAB``; the model code
that runs is LeRobot's. A tiny checkpoint still names ``gemma_2b`` in its config.json, so it is
loaded under the stand-in too (LeRobot would otherwise build the full model and only warn that the
weights do not fit).

Their processors tokenise with ``TokenizerProcessorStep(tokenizer_name="google/paligemma-3b-pt-224")``,
a Hub download. ``tokenizer_from(directory)`` points that step of LeRobot's processor factories at a
local directory (``paligemma_tokenizer_directory``: a word-level tokenizer); the step loads it with
``AutoTokenizer.from_pretrained`` as it would the Hub's, and a saved processor names the directory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from lerobot.policies.pi0 import modeling_pi0, processor_pi0
from lerobot.policies.pi05 import modeling_pi05, processor_pi05
from lerobot.processor import TokenizerProcessorStep

from robot_rl.bench.word_tokenizer import WORDS, word_level_tokenizer

# LeRobot's variant -> its tiny stand-in (width, depth, mlp_dim, num_heads, num_kv_heads, head_dim). Both
# share depth and attention shape (each layer attends over the VLM's and the expert's tokens together),
# and 8 heads (LeRobot's joint attention reshapes to 8 * head_dim); the expert is half the VLM's width.
TINY_GEMMA = {"gemma_2b": (64, 2, 128, 8, 1, 8), "gemma_300m": (32, 2, 64, 8, 1, 8)}
TINY_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
               "patch_size": 16}
TINY_VOCAB = 512  # above the tokenizer's ids (its words, pi0.5's prompt words and state bins)
TINY_IMAGE = 64  # ``image_resolution`` at tiny: 16 patches per camera
# LeRobot's config fields at each size: 224x224 frames (SigLIP's) and its token lengths at full.
PALIGEMMA_OPTIONS: dict[str, dict[str, Any]] = {
    "full": {}, "tiny": {"image_resolution": (TINY_IMAGE, TINY_IMAGE), "tokenizer_max_length": 32}}
MODELING = (modeling_pi0, modeling_pi05)
PROCESSORS = (processor_pi0, processor_pi05)
# What pi0.5's prompt adds to the instruction: "Task: ..., State: 12 130 ...;\nAction: " (256 state bins).
PI05_PROMPT_WORDS = ["Task", "State", "Action", ":", ",", ";", *map(str, range(256))]


def paligemma_tokenizer_directory(directory: Path) -> Path:
    """A word-level tokenizer saved in ``directory`` (``AutoTokenizer`` loads it), knowing the
    instructions' words and pi0.5's prompt; padded on the right as PaliGemma's."""
    word_level_tokenizer(["<pad>", "<unk>", "<bos>", "<eos>"], WORDS + PI05_PROMPT_WORDS, bos_token="<bos>",
                         eos_token="<eos>", model_max_length=512).save_pretrained(directory)
    return directory


@contextmanager
def paligemma_size(size: str) -> Iterator[None]:
    """Within it, LeRobot's PI0/PI05 build their PaliGemma and action expert at ``size`` (full: as they are)."""
    if size not in ("full", "tiny"):
        raise ValueError(f"a PaliGemma size is full or tiny, got {size!r}")
    with ExitStack() as stack:
        if size == "tiny":
            for module in MODELING:
                stack.enter_context(_replaced(module, "get_gemma_config", _tiny_gemma_config(module)))
                stack.enter_context(_replaced(module, "PaliGemmaForConditionalGenerationWithPiGemma",
                                              _tiny_paligemma(module.PaliGemmaForConditionalGenerationWithPiGemma)))
                stack.enter_context(_replaced(module, "PiGemmaForCausalLM", _tiny_expert(module.PiGemmaForCausalLM)))
        yield


@contextmanager
def tokenizer_from(directory: Path) -> Iterator[None]:
    """Within it, the tokenizer step of LeRobot's pi0/pi0.5 processor factories loads ``directory``."""

    def local_step(**settings: Any) -> TokenizerProcessorStep:
        return TokenizerProcessorStep(**{**settings, "tokenizer_name": str(directory)})

    with ExitStack() as stack:
        for module in PROCESSORS:
            stack.enter_context(_replaced(module, "TokenizerProcessorStep", local_step))
        yield


@contextmanager
def _replaced(module: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def _tiny_gemma_config(module: Any) -> Callable[[str], Any]:
    def lookup(variant: str) -> Any:
        width, depth, mlp_dim, num_heads, num_kv_heads, head_dim = TINY_GEMMA[variant]
        return module.GemmaConfig(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads,
                                  num_kv_heads=num_kv_heads, head_dim=head_dim)
    return lookup


def _tiny_paligemma(paligemma_class: type) -> Callable[..., Any]:
    """LeRobot's PaliGemma class, built from its config with the vision tower and vocabulary shrunk
    (the projection maps the tower's width onto the language model's, as LeRobot's 2048 does at full)."""
    def build(config: Any) -> Any:
        for key, value in TINY_VISION.items():
            setattr(config.vision_config, key, value)
        config.vision_config.projection_dim = config.text_config.hidden_size
        config.text_config.vocab_size = TINY_VOCAB
        return paligemma_class(config=config)
    return build


def _tiny_expert(expert_class: type) -> Callable[..., Any]:
    def build(config: Any) -> Any:
        config.vocab_size = TINY_VOCAB  # the expert's embedding is dropped; its output head is not used
        return expert_class(config=config)
    return build
