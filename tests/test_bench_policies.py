"""bench policies: every type is built offline, trained, run and published; an edge swaps the published
weights in, ``rl`` updates a flow policy from its own sampler; LoRA puts less on the wire."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bench.policies import build_policies, rl_update, run_policies_bench, synthetic_batch
from robot_rl.config import ConfigError, load_config


def quick(*overrides: str):
    return load_config(["+bench=policies_quick", "bench.updates=1", "bench.inferences=1", "learner.trainer.device=cpu",
                        *overrides])


def test_each_type_reports_its_costs_swaps_on_an_edge_trains_with_rl_and_lora_publishes_only_adapters():
    report = run_policies_bench(quick("bench.types=[smolvla,smolvla+lora,pi0]"), progress=lambda msg: None)["policies"]
    full, lora = report["smolvla"], report["smolvla+lora"]
    for row in (full, lora, report["pi0"]):
        assert row["updates_per_s"] > 0 and row["inference_ms"] > 0 and row["params"] >= row["trainable_params"] > 0
        # An edge ran it, swapped in the published weights and ran on with them; rl distilled its own samples.
        assert row["edge_ok"] is True and row["rl_ok"] is True
    # SmolVLA freezes its VLM by default; LoRA trains only adapters, and only they travel.
    assert full["trainable_params"] < full["params"]
    assert lora["trainable_params"] < full["trainable_params"] and lora["publish_bytes"] < full["publish_bytes"] / 2


def test_rl_does_not_apply_to_a_policy_without_a_flow_sampler(tmp_path):
    cfg = quick("bench.types=[act]")
    act = build_policies(cfg, tmp_path)["act"]()
    batch = synthetic_batch(2, act.training_horizon, act.observation_history)
    assert rl_update(act, batch, cfg) is None


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="full or tiny"):
        load_config(["+bench=policies", "bench.vla_size=huge"])
    with pytest.raises(ConfigError, match="edge_ticks"):
        load_config(["+bench=policies", "bench.edge_ticks=0"])
    with pytest.raises(ValueError, match="unknown"):
        run_policies_bench(load_config(["+bench=policies_quick", "bench.types=[gpt]"]), progress=lambda msg: None)
