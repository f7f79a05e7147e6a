"""Weight hot-swap mechanism on the edge: one shadow policy, recycled; zero-copy loads.

No timing assertions: what is checked is the mechanism that keeps the control thread free
(no deepcopy or fresh policy per swap, weights copied in place from views of the received
bytes, the swapped-out policy reused as the next shadow) and that it loads exactly the
published weights.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

import robot_rl.edge.weight_loading as weight_loading
from robot_rl.bridges.zmq.weights import WeightsError, serialize_tensors, tensor_views
from robot_rl.core.clock import VirtualClock
from robot_rl.edge.config import EdgeConfig
from robot_rl.edge.learner_link import EdgeStreamer
from robot_rl.edge.node import EdgeNode
from robot_rl.edge.weight_loading import load_weights_into
from robot_rl.learner.publisher import snapshot
from tests.edge_fakes import KinematicRobot
from tests.learner_helpers import IMG, client_config, tiny_policy, wait_for

BALLAST = 6_000_000  # float32 elements: ~24 MB, so each load moves a large-ish model


def ballasted(seed: int, fill: float | None = None) -> torch.nn.Module:
    policy = tiny_policy(seed=seed)
    torch.manual_seed(seed + 100)
    ballast = torch.randn(BALLAST) if fill is None else torch.full((BALLAST,), fill)
    policy.register_buffer("ballast", ballast)
    return policy.eval()


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


class CameraRobot(KinematicRobot):
    def __init__(self) -> None:
        super().__init__(num_joints=6, fps=30)

    def get_observation(self):
        return {"images": {"front": np.zeros((IMG, IMG, 3), np.uint8)}, "state": self.state.copy()}


def test_zero_copy_load_gives_identical_weights_in_place():
    source, target = ballasted(seed=1), ballasted(seed=2)
    assert not same_weights(source, target)
    pointers = {k: v.data_ptr() for k, v in target.state_dict().items()}
    data = bytearray(serialize_tensors(source.state_dict()))
    assert load_weights_into(target, data, slice_bytes=1 << 20) == sum(v.nbytes for v in tensor_views(data).values())
    assert same_weights(source, target)
    assert {k: v.data_ptr() for k, v in target.state_dict().items()} == pointers  # written in place, nothing new
    # Read-only bytes work too (copied once), and reduced-precision transfers are cast by copy_ itself.
    for dtype, torch_dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        load_weights_into(target, serialize_tensors(source.state_dict(), transfer_dtype=dtype))
        for k, v in source.state_dict().items():
            expected = v.to(torch_dtype).to(v.dtype) if v.is_floating_point() else v
            assert torch.equal(target.state_dict()[k], expected), (dtype, k)


class MixedModule(torch.nn.Module):
    """bf16 and float32 weights, a non-contiguous one, a 0-d buffer and integer counts."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.bf16_weight = torch.nn.Parameter(torch.randn(40, 70, generator=g).to(torch.bfloat16))
        self.wide = torch.nn.Parameter(torch.randn(30, 50, generator=g).t())  # non-contiguous
        self.register_buffer("scale", torch.randn((), generator=g))
        self.register_buffer("counts", torch.randint(0, 1000, (17,), generator=g))


def test_bf16_weights_are_copied_bit_for_bit_beside_cast_and_non_contiguous_ones():
    source, target = MixedModule(seed=1), MixedModule(seed=2)
    load_weights_into(target, bytearray(serialize_tensors(source.state_dict(), transfer_dtype="bfloat16")),
                      slice_bytes=1 << 20)
    for k, v in source.state_dict().items():
        expected = v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v
        assert torch.equal(target.state_dict()[k], expected), k
    assert not target.wide.is_contiguous() and target.bf16_weight.dtype == torch.bfloat16


def test_load_refuses_other_architectures_and_bad_bytes_before_writing():
    target = tiny_policy(seed=2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    wrong = {k: v for k, v in tiny_policy(seed=1).state_dict().items()}
    wrong["extra"] = torch.zeros(3)
    with pytest.raises(ValueError, match="unexpected"):
        load_weights_into(target, bytearray(serialize_tensors(wrong)))
    with pytest.raises(WeightsError):
        load_weights_into(target, bytearray(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json"))
    good = bytearray(serialize_tensors(tiny_policy(seed=1).state_dict()))
    with pytest.raises(WeightsError):
        load_weights_into(target, good[:-4])  # truncated: a tensor runs past the end
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_swaps_reuse_one_shadow_policy(tmp_path, monkeypatch):
    class Nowhere:  # the link never connects; weights are handed to the streamer as the link would
        router_endpoint, pub_endpoint = "tcp://127.0.0.1:9", None

    policy, learner = ballasted(seed=0, fill=0.0), ballasted(seed=3)
    streamer = EdgeStreamer(client_config("edge-s", Nowhere, tmp_path / "spool", policy_version=0), policy)
    node = EdgeNode(CameraRobot(), policy, VirtualClock(), EdgeConfig(fps=30, simulated_latency_ms=40),
                    robot_id="edge-s", policy_version=0)
    node.step_sink = None  # only the weights path is under test here
    streamer.node = node
    streamer.start()  # the shadow is made here, once
    deepcopies = []
    real_deepcopy = weight_loading.copy.deepcopy

    def counting_deepcopy(obj, *args, **kwargs):
        if isinstance(obj, torch.nn.Module):
            deepcopies.append(type(obj).__name__)
        return real_deepcopy(obj, *args, **kwargs)

    monkeypatch.setattr(weight_loading.copy, "deepcopy", counting_deepcopy)
    running: list[torch.nn.Module] = []
    try:
        node.reset_episode("pick the cube")
        for version in (1, 2, 3, 4):
            with torch.no_grad():
                learner.ballast.fill_(float(version))
            blob = snapshot(learner, version, "")
            streamer._on_weights(blob.announce(), bytearray(blob.data))
            wait_for(lambda v=version: node.tick().policy_version == v, what=f"swap to v{version}")
            running.append(node.running_policy)
            assert same_weights(running[-1], learner)
        # Newer weights before the node took the pending swap: withdrawn and superseded, same shadow.
        for version in (5, 6):
            with torch.no_grad():
                learner.ballast.fill_(float(version))
            blob = snapshot(learner, version, "")
            streamer._on_weights(blob.announce(), bytearray(blob.data))
            wait_for(lambda v=version: streamer.swaps_requested == v, what=f"v{version} loaded")
        wait_for(lambda: node.tick().policy_version == 6, what="swap to v6")
        assert same_weights(node.running_policy, learner)
    finally:
        streamer.stop()
        node.close()
    assert deepcopies == []  # no module copied per swap
    assert len({id(p) for p in running}) == 2 and running[0] is running[2] and running[1] is running[3]
    assert policy in running  # the caller's policy is one of the two buffers
    assert node.swaps.recycled >= 3 and node.swaps.withdrawn == 1
    assert node.stats.swaps == 5 and node.stats.swap_failures == 0  # v5 never ran: superseded by v6


class FrozenBase(torch.nn.Module):
    """A trainable head on a frozen base that is never published (a VLM under train_expert_only,
    a LoRA adapter's base)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 6)
        self.base.requires_grad_(False)

    def published_state_dict(self) -> dict:
        return {k: v for k, v in self.state_dict().items() if k.startswith("head.")}


def test_the_shadow_shares_what_never_travels_and_owns_what_does():
    live = FrozenBase()
    shadow = weight_loading.shadow_of(live)
    assert shadow.base.weight is live.base.weight and shadow.base.bias is live.base.bias  # held once
    assert shadow.head.weight.data_ptr() != live.head.weight.data_ptr()
    new = {k: torch.full_like(v, 3.0) for k, v in live.published_state_dict().items()}
    load_weights_into(shadow, serialize_tensors(new))
    assert torch.equal(shadow.head.weight, torch.full_like(shadow.head.weight, 3.0))
    assert not torch.equal(live.head.weight, shadow.head.weight)  # the running head is untouched
    full = torch.nn.Linear(8, 8)  # a module that publishes everything shares nothing
    assert weight_loading.shadow_of(full).weight.data_ptr() != full.weight.data_ptr()
