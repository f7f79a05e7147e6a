"""bench policies: every type is built offline, trained, run and published; LoRA puts less on the wire."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bench.policies import run_policies_bench
from robot_rl.config import ConfigError, load_config


def test_each_type_reports_its_costs_and_lora_publishes_only_adapters():
    cfg = load_config(["+bench=policies_quick", "bench.types=[smolvla,smolvla+lora]", "bench.updates=1",
                       "bench.inferences=1", "learner.trainer.device=cpu"])
    report = run_policies_bench(cfg, progress=lambda msg: None)["policies"]
    full, lora = report["smolvla"], report["smolvla+lora"]
    for row in (full, lora):
        assert row["updates_per_s"] > 0 and row["inference_ms"] > 0 and row["params"] >= row["trainable_params"] > 0
    # SmolVLA freezes its VLM by default; LoRA trains only adapters, and only they travel.
    assert full["trainable_params"] < full["params"]
    assert lora["trainable_params"] < full["trainable_params"] and lora["publish_bytes"] < full["publish_bytes"] / 2


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="full or tiny"):
        load_config(["+bench=policies", "bench.smolvla_size=huge"])
    with pytest.raises(ValueError, match="unknown"):
        run_policies_bench(load_config(["+bench=policies_quick", "bench.types=[gpt]"]), progress=lambda msg: None)
