"""LoRA fine-tuning of a LeRobot policy through LeRobot's own PEFT path.

Why adapters: a VLA's weights are 0.9 GB (SmolVLA, bf16) to 7 GB (pi0); its LoRA adapters are a
few MB. With ``policy.lora_rank > 0`` the checkpoint's weights stay frozen on the learner and on
every robot (each loads the same base checkpoint), only the adapters (plus any
``lora_full_training`` modules) train, and only they are published and swapped.

Everything goes through LeRobot and PEFT: ``PreTrainedPolicy.wrap_with_peft`` picks each policy
type's default target modules (SmolVLA: its action expert's q/v projections and its state/action
projections), the learner's checkpoints are LeRobot's PEFT layout (``adapter_config.json`` naming
the base checkpoint, ``adapter_model.safetensors``, the policy's ``config.json`` with
``use_peft``), which ``lerobot.policies.factory.make_policy`` loads, and the published state is
PEFT's adapter state dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lerobot.policies.pretrained import PreTrainedPolicy
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model_state_dict, set_peft_model_state_dict

from robot_rl.core.errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_lora_checkpoint(directory: Path) -> bool:
    return (directory / ADAPTER_CONFIG).is_file()


def wrap_with_lora(policy: PreTrainedPolicy, source: str, rank: int, alpha: int | None,
                   targets: list[str] | None, full_training: list[str] | None) -> PeftModel:
    """Freeze ``policy`` (loaded from ``source``) and add rank-``rank`` adapters where LeRobot's
    defaults for its type (or ``targets``) say."""
    policy.config.pretrained_path = source  # the adapters' config names the base they belong to
    overrides: dict[str, Any] = {"r": rank, "lora_alpha": alpha, "target_modules": targets,
                                 "full_training_modules": full_training}
    try:
        return policy.wrap_with_peft(peft_cli_overrides={k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:  # e.g. a policy type without default target modules
        raise ConfigError(f"LoRA on LeRobot policy {policy.config.type!r}: {exc} (policy.lora_targets)") from exc


def load_lora_checkpoint(directory: Path, policy_class: type[PreTrainedPolicy], **load_kwargs: Any) -> PeftModel:
    """A PEFT checkpoint: its base (named in ``adapter_config.json``) with its trained adapters on top."""
    config = PeftConfig.from_pretrained(str(directory))
    if not config.base_model_name_or_path:
        raise FileNotFoundError(f"{directory / ADAPTER_CONFIG} names no base checkpoint to put the adapters on")
    base = policy_class.from_pretrained(config.base_model_name_or_path, **load_kwargs)
    return PeftModel.from_pretrained(base, str(directory), config=config, is_trainable=True)


def adapter_state_dict(model: PeftModel) -> dict[str, Any]:
    """The adapters' tensors (PEFT's names, the live tensors): what the learner publishes."""
    return get_peft_model_state_dict(model)


def load_adapter_state(model: PeftModel, state: Any) -> None:
    """Copy published adapters into ``model``; a key that is not one of its adapters is an error."""
    result = set_peft_model_state_dict(model, state)
    unexpected = sorted(result.unexpected_keys)  # type: ignore[attr-defined]  # torch's load result, untyped in peft
    if unexpected:
        raise ValueError(f"weights do not fit the running adapters (unexpected {unexpected[:5]})")


def lora_signature(model: PeftModel) -> dict[str, Any]:
    """What must match between learner and robots for their adapters to fit each other."""
    config = model.peft_config["default"]
    if not isinstance(config, LoraConfig):
        raise TypeError(f"expected LoRA adapters, got {type(config).__name__}")
    targets = config.target_modules
    return {"r": config.r, "lora_alpha": config.lora_alpha,
            "target_modules": sorted(targets) if isinstance(targets, set | list) else targets,
            "modules_to_save": sorted(config.modules_to_save or [])}


def save_lora_checkpoint(model: PeftModel, policy: PreTrainedPolicy, directory: Path) -> None:
    """LeRobot's PEFT layout: the adapters, and the policy's config marked ``use_peft``."""
    model.save_pretrained(str(directory))
    policy.config.use_peft = True
    policy.config.save_pretrained(directory)
