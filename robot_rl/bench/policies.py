"""`robot-rl bench policies`: what each policy type costs the learner, the edge and the wire, and
whether it makes the whole round trip.

For every type, side by side in one process: parameters (all, and those the optimiser updates),
learner updates per second (the ``bc`` algorithm's update on a fixed synthetic batch, the same
code the learner runs), edge inference milliseconds per chunk (``predict_chunk``, batch 1), and
the bytes one weight publish puts on the wire (``learner.publisher.snapshot`` at the trainer's
transfer dtype), with LoRA rows beside the full fine-tuning ones. Then the round trip:
``edge_ok``: an ``EdgeNode`` runs the untrained weights, takes the published ones through the edge
loader's own path (``load_weights_into`` the node's shadow, ``request_policy_swap``) and runs on
with them; ``rl_ok``: one update of the ``rl`` algorithm, best-of-N candidates from the policy's
own flow sampler, changes its weights (None for ACT and Diffusion, which have no sampler).

Policies are built from scratch with random weights (nothing is downloaded): FlowVLA of the
configured ``policy.model``; LeRobot's ACT, Diffusion, SmolVLA, pi0 and pi0.5 through
``LeRobotChunkPolicy.from_scratch`` on synthetic episodes of the sim's layout (two 96x96 cameras,
6 joints). ``bench.vla_size=full`` gives the VLAs their real architectures: SmolVLA's VLM written to a
local directory (``smolvlm_directory``) as SmolVLM2-500M (~450 M parameters with its action
expert), pi0's and pi0.5's PaliGemma as LeRobot builds it (4.0 B); ``tiny`` a 64-wide SmolVLM and
PaliGemma's tiny stand-in (``bench.paligemma``) for a CPU smoke run. pi0 and pi0.5 tokenise with a
local word-level tokenizer in place of their Hub one. Random weights cost what trained ones cost.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import (
    Idefics3ImageProcessor,
    Idefics3Processor,
    LlamaConfig,
    SmolVLMConfig,
)
from transformers.models.smolvlm.configuration_smolvlm import SmolVLMVisionConfig

from robot_rl.bench.paligemma import PALIGEMMA_OPTIONS, paligemma_size, paligemma_tokenizer_directory, tokenizer_from
from robot_rl.bench.progress import timed_run
from robot_rl.bench.transport import BenchArm
from robot_rl.bench.word_tokenizer import word_level_tokenizer
from robot_rl.bridges.zmq.weights import WeightsBlob, deserialize_tensors
from robot_rl.core.clock import VirtualClock
from robot_rl.core.errors import ConfigError
from robot_rl.core.types import Step
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.node import EdgeNode
from robot_rl.edge.weight_loading import load_weights_into
from robot_rl.learner.algorithms.bc import WeightedBC
from robot_rl.learner.algorithms.config import RLConfig
from robot_rl.learner.algorithms.rl import ChunkQLearning
from robot_rl.learner.publisher import snapshot
from robot_rl.learner.streams import STREAMS
from robot_rl.learner.trainer import training_device
from robot_rl.policies.base import ObservationHistory
from robot_rl.policies.flow_vla.config import FlowVLAConfig, FlowVLAPolicyConfig
from robot_rl.policies.flow_vla.model import FlowVLA
from robot_rl.policies.lerobot_adapter import LeRobotChunkPolicy
from robot_rl.policies.lerobot_config import LeRobotPolicyConfig
from robot_rl.policies.trainable import published_state

if TYPE_CHECKING:
    from robot_rl.config import RobotRLConfig
    from robot_rl.policies.trainable import TrainablePolicy

CAMERAS, IMAGE, JOINTS, CHUNK = ("front", "wrist"), 96, 6, 20
INSTRUCTION = "push the red cube to the left"
SPECIAL_TOKENS = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                  "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}

# SmolVLM2-500M's architecture (the VLM SmolVLA fine-tunes), and a 64-wide stand-in for CPU smoke runs.
SMOLVLM_SIZES: dict[str, dict[str, Any]] = {
    "full": {"text": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                          num_key_value_heads=5, head_dim=64, vocab_size=49280),
             "vision": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                            image_size=512, patch_size=16),
             "scale_factor": 4, "image_seq_len": 64, "num_vlm_layers": 16},
    "tiny": {"text": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, vocab_size=128),
             "vision": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                            image_size=64, patch_size=16),
             "scale_factor": 2, "image_seq_len": 4, "num_vlm_layers": 2},
}


def smolvlm_directory(directory: Path, size: str) -> Path:
    """A SmolVLM config, a word-level tokenizer and a processor, written to ``directory``: what
    SmolVLA reads from ``vlm_model_name`` when ``load_vlm_weights`` is false (no download)."""
    spec = SMOLVLM_SIZES[size]
    specials = ["<pad>", "<unk>", "<|im_start|>", "<video>", *SPECIAL_TOKENS.values()]
    specials += [f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2)]
    tokenizer = word_level_tokenizer(specials, bos_token="<|im_start|>", eos_token="<end_of_utterance>",
                                     extra_special_tokens=dict(SPECIAL_TOKENS), model_max_length=512)
    # Their fields arrive through **kwargs (transformers' configs declare few in their signatures).
    text = LlamaConfig(**{"max_position_embeddings": 8192, "pad_token_id": 0, "tie_word_embeddings": False,
                          **spec["text"]})
    vision = SmolVLMVisionConfig(**spec["vision"])
    SmolVLMConfig(**{"text_config": text.to_dict(), "vision_config": vision.to_dict(),
                     "scale_factor": spec["scale_factor"], "image_token_id": tokenizer.convert_tokens_to_ids("<image>"),
                     "vocab_size": spec["text"]["vocab_size"], "pad_token_id": 0}).save_pretrained(directory)
    side = spec["vision"]["image_size"]
    # Idefics3's processor is SmolVLM's without its video part (which needs num2words at import).
    Idefics3Processor(image_processor=Idefics3ImageProcessor(size={"longest_edge": side},
                                                             max_image_size={"longest_edge": side}),
                      tokenizer=tokenizer, image_seq_len=spec["image_seq_len"]).save_pretrained(directory)
    return directory


def synthetic_episodes(count: int = 2, length: int = 40) -> list[dict]:
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(count):
        state = rng.normal(0, 20, (length, JOINTS)).astype(np.float32)
        episode = {"state": state, "action": state + 1, "instruction": INSTRUCTION}
        episode.update({f"images.{cam}": rng.integers(0, 256, (length, IMAGE, IMAGE, 3), dtype=np.uint8)
                        for cam in CAMERAS})
        episodes.append(episode)
    return episodes


def build_policies(cfg: RobotRLConfig, workdir: Path) -> dict[str, Callable[[], TrainablePolicy]]:
    """Name -> builder, for the names in ``bench.types`` (``+lora`` rows: LoRA adapters of rank ``bench.lora_rank``)."""
    bench = cfg.bench
    episodes = synthetic_episodes()

    def flow_vla() -> TrainablePolicy:
        model = cfg.policy.model if isinstance(cfg.policy, FlowVLAPolicyConfig) else FlowVLAConfig()
        return FlowVLA(model)

    def lerobot(kind: str, options: dict[str, Any], lora_targets: list[str] | None = None,
                lora: bool = False) -> Callable[[], TrainablePolicy]:
        def build() -> TrainablePolicy:
            config = LeRobotPolicyConfig(type=kind, options=options)
            policy = LeRobotChunkPolicy.from_scratch(config, episodes)
            if not lora:
                return policy
            # LoRA needs a saved base (the adapters name it): save the new policy, add adapters on load.
            base = workdir / f"{kind}_base"
            policy.save_pretrained(base)
            return LeRobotChunkPolicy.from_policy_config(LeRobotPolicyConfig(
                path=str(base), lora_rank=bench.lora_rank, lora_targets=lora_targets))
        return build

    def paligemma(kind: str) -> Callable[[], TrainablePolicy]:
        """pi0 or pi0.5, built under PaliGemma's size and over the local tokenizer (``bench.paligemma``)."""
        new = lerobot(kind, {**chunked, **PALIGEMMA_OPTIONS[bench.vla_size]})

        def build() -> TrainablePolicy:
            tokenizer = paligemma_tokenizer_directory(workdir / "paligemma_tokenizer")
            with paligemma_size(bench.vla_size), tokenizer_from(tokenizer):
                return new()
        return build

    vlm = {"vlm_model_name": str(smolvlm_directory(workdir / "smolvlm", bench.vla_size)),
           "load_vlm_weights": False, "num_vlm_layers": SMOLVLM_SIZES[bench.vla_size]["num_vlm_layers"],
           "resize_imgs_with_padding": (SMOLVLM_SIZES[bench.vla_size]["vision"]["image_size"],) * 2}
    if bench.vla_size == "tiny":
        vlm.update(self_attn_every_n_layers=2, expert_width_multiplier=0.75, tokenizer_max_length=16)
    act_targets = ["linear1", "linear2"]  # ACT has no LeRobot default: its transformer's feed-forward layers
    chunked = {"chunk_size": CHUNK, "n_action_steps": CHUNK}
    # LeRobot's default two observations (the edge stacks them); group norm, as without pretrained weights.
    diffusion = {"n_obs_steps": 2, "horizon": 2 * CHUNK, "n_action_steps": CHUNK, "drop_n_last_frames": CHUNK - 1,
                 "use_group_norm": True}
    builders = {
        "flow_vla": flow_vla,
        "act": lerobot("act", chunked),
        "act+lora": lerobot("act", chunked, act_targets, lora=True),
        "diffusion": lerobot("diffusion", diffusion),
        "smolvla": lerobot("smolvla", {**chunked, **vlm}),
        "smolvla+lora": lerobot("smolvla", {**chunked, **vlm}, lora=True),
        "pi0": paligemma("pi0"),
        "pi05": paligemma("pi05"),
    }
    unknown = [name for name in bench.types if name not in builders]
    if unknown:
        raise ValueError(f"bench.types: unknown {unknown}; known: {list(builders)}")
    return {name: builders[name] for name in bench.types}


def synthetic_batch(size: int, horizon: int, history: ObservationHistory) -> dict[str, Any]:
    """A training batch of random frames and states, with the past observations ``history`` asks for."""
    rng = np.random.default_rng(1)
    state = torch.as_tensor(rng.normal(0, 20, (size, JOINTS)), dtype=torch.float32)
    batch: dict[str, Any] = {"state": state, "actions": state[:, None].repeat(1, horizon, 1) + 1,
                             "action_is_pad": torch.zeros(size, horizon, dtype=torch.bool),
                             "instruction": [INSTRUCTION] * size, "weight": torch.ones(size)}
    for cam in CAMERAS:
        batch[f"images.{cam}"] = torch.as_tensor(rng.integers(0, 256, (size, IMAGE, IMAGE, 3), dtype=np.uint8))
    if history.steps > 1:
        batch["past.state"] = state[:, None].repeat(1, history.steps - 1, 1)
        for cam in CAMERAS:
            batch[f"past.images.{cam}"] = batch[f"images.{cam}"][:, None].repeat(1, history.steps - 1, 1, 1, 1)
    return batch


def with_transitions(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with what ``rl`` reads: each chunk's reward and discount, the next chunk's observation
    (here the same frames, a step further on), and the stream and outcome its rejection stage reads
    (online steps of finished, successful episodes: all kept)."""
    size = len(batch["state"])
    done = torch.ones(size, dtype=torch.bool)
    transitions = {"chunk_reward": torch.linspace(0.0, 1.0, size), "chunk_discount": torch.full((size,), 0.9),
                   "transition_valid": done, "next.state": batch["state"] + 1,
                   "stream": torch.full((size,), STREAMS.index("online")), "episode_success": done,
                   "episode_finished": done}
    transitions.update({f"next.images.{cam}": batch[f"images.{cam}"] for cam in CAMERAS})
    return {**batch, **transitions}


def rl_update(policy: TrainablePolicy, batch: dict[str, Any], cfg: RobotRLConfig) -> bool | None:
    """One update of the ``rl`` algorithm on ``policy``: True if it ran, distilled best-of-N candidates
    from the policy's own sampler and changed the trainable weights; None for a policy without a flow
    sampler (``rl`` refuses it). ``warmup_updates=0``: the first update already distils."""
    trainer = cfg.learner.trainer
    try:
        algorithm = ChunkQLearning(RLConfig(warmup_updates=0), policy, trainer, training_device(trainer))
    except ConfigError:  # rl's own refusal of a policy without a flow sampler (ACT, Diffusion)
        return None
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    policy.train()
    metrics = algorithm.update(with_transitions(batch))
    changed = any(not torch.equal(old, new) for old, new in zip(before, policy.trainable_parameters(), strict=True))
    return bool(metrics["distilling"] == 1.0 and metrics["skipped"] == 0.0 and np.isfinite(metrics["critic_loss"])
                and changed)


def edge_swap(running: TrainablePolicy, blob: WeightsBlob, ticks: int) -> bool:
    """An edge node runs ``running`` (the untrained weights) for ``ticks`` ticks, takes ``blob`` as the
    edge's weights loader does (decoded into the node's shadow policy, offered with
    ``request_policy_swap``) and runs on until a chunk of the new version is executed (at most
    ``3 * ticks`` ticks). True if chunks of the policy were executed before and after, the swap went
    through without a failed or rejected chunk, and the policy running at the end holds the published
    weights. A kinematic stand-in arm (no hardware here); the virtual clock makes the run deterministic."""
    config = EdgeConfig(fps=BenchArm.fps, simulated_latency_ms=100.0, inference_runner="virtual")
    with EdgeNode(BenchArm(), running, VirtualClock(), config, robot_id="bench-policies", policy_version=0) as node:
        node.reset_episode(INSTRUCTION)
        before = [node.tick() for _ in range(ticks)]
        shadow = node.swaps.prepare()  # the second policy object the edge loads weights into
        load_weights_into(shadow, blob.data)
        node.request_policy_swap(shadow, blob.version)
        after: list[Step] = []
        while len(after) < 3 * ticks and not any(step.policy_version == blob.version for step in after):
            after.append(node.tick())
        stats, swapped = node.stats, node.running_policy is shadow
    final = published_state(shadow)
    published = deserialize_tensors(bytes(blob.data), framework="pt")

    def from_policy(steps: list[Step], version: int) -> bool:
        return any(step.chunk_id >= 0 and step.policy_version == version for step in steps)

    holds_published = final.keys() == published.keys() and all(
        torch.equal(final[k].cpu(), published[k].to(final[k].dtype)) for k in final)
    return (from_policy(before, 0) and from_policy(after, blob.version) and swapped and stats.swaps == 1
            and stats.swap_failures == 0 and stats.chunks_rejected == 0 and holds_published)


def measure(policy: TrainablePolicy, cfg: RobotRLConfig) -> dict[str, Any]:
    bench, trainer = cfg.bench, cfg.learner.trainer
    device = training_device(trainer)
    if policy.needs_statistics():
        episodes = synthetic_episodes()
        policy.fit_statistics(np.concatenate([e["state"] for e in episodes]),
                              np.concatenate([e["action"] for e in episodes]), [INSTRUCTION])
    edge_policy = copy.deepcopy(policy).eval()  # the edge's own copy of the untrained weights (version 0)
    policy.to(device).train()
    algorithm = WeightedBC(None, policy, trainer, device)
    batch = synthetic_batch(bench.batch_size, policy.training_horizon, policy.observation_history)
    algorithm.update(batch)  # warm-up: allocations, kernels, the text encoder's cache
    started = time.perf_counter()
    for _ in range(bench.updates):
        algorithm.update(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    updates_per_s = bench.updates / (time.perf_counter() - started)
    policy.eval()
    observation = {cam: batch[f"images.{cam}"][0].numpy() for cam in CAMERAS}
    state = batch["state"][0].numpy()
    policy.predict_chunk(observation, state, INSTRUCTION)
    times = []
    for _ in range(bench.inferences):
        started = time.perf_counter()
        policy.predict_chunk(observation, state, INSTRUCTION)
        times.append(time.perf_counter() - started)
    blob = snapshot(policy, 1, policy.config_hash(), trainer.transfer_dtype)
    return {"params": sum(p.numel() for p in policy.parameters()),
            "trainable_params": sum(p.numel() for p in policy.trainable_parameters()),
            "updates_per_s": round(updates_per_s, 3), "inference_ms": round(1000 * statistics.median(times), 2),
            "publish_bytes": len(blob.data), "edge_ok": edge_swap(edge_policy, blob, bench.edge_ticks),
            "rl_ok": rl_update(policy, batch, cfg), "batch_size": bench.batch_size, "device": str(device)}


def run_policies_bench(cfg: RobotRLConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-policies-") as workdir:
        for name, build in build_policies(cfg, Path(workdir)).items():
            progress(f"{name}: building")
            policy = build()
            results[name] = measure(policy, cfg)
            progress(f"{name}: {results[name]}")
            del policy
    return {"policies": results, "vla_size": cfg.bench.vla_size, "transfer_dtype":
            cfg.learner.trainer.transfer_dtype}


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{'policy':<14}{'params':>14}{'trainable':>14}{'updates/s':>11}{'infer ms':>10}{'publish MB':>12}"
          f"{'edge swap':>11}{'rl':>6}")
    for name, row in report["policies"].items():
        rl = "-" if row["rl_ok"] is None else ("ok" if row["rl_ok"] else "FAIL")
        print(f"{name:<14}{row['params']:>14,}{row['trainable_params']:>14,}{row['updates_per_s']:>11.2f}"
              f"{row['inference_ms']:>10.1f}{row['publish_bytes'] / 1e6:>12.3f}"
              f"{'ok' if row['edge_ok'] else 'FAIL':>11}{rl:>6}")
    batch = next(iter(report["policies"].values()))["batch_size"]
    print(f"(VLAs at size {report['vla_size']!r}; batch {batch}; publish at {report['transfer_dtype']})")


def run_from_cli(cfg: RobotRLConfig) -> dict[str, Any]:
    report = timed_run(lambda progress: run_policies_bench(cfg, progress=progress))
    print_table(report)
    return report
