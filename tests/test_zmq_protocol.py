"""Wire protocol: message round trips, strict validation, segments, weights, keys (no sockets)."""

from __future__ import annotations

import contextlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robot_rl.bridges.zmq import (
    PROTOCOL_VERSION,
    Ack,
    ChunkAssembler,
    Error,
    Heartbeat,
    Hello,
    HelloOk,
    ImageEncoding,
    InsecureEndpointError,
    Limits,
    ProtocolError,
    Segment,
    Stats,
    WeightsAnnounce,
    WeightsBlob,
    WeightsChunk,
    WeightsError,
    WeightsFetch,
    decode_message,
    decode_segment,
    deserialize_tensors,
    encode_message,
    encode_segment,
    generate_keypair,
    is_loopback,
    load_keypair,
    load_public_key,
    serialize_tensors,
)
from robot_rl.bridges.zmq.codec import encode_frames
from robot_rl.bridges.zmq.keys import check_endpoint_security
from robot_rl.bridges.zmq.weights import tensor_views
from robot_rl.core import Step

pytestmark = pytest.mark.timeout(60)

SAMPLES = [
    Hello(robot_id="so101-a", config_hash="abc123", policy_version=-1,
          features={"fps": 30, "joint_names": ["a", "b"], "cameras": {"front": [24, 32]}}),
    HelloOk(server_id="learner", config_hash="abc123", latest_version=3, heartbeat_interval_s=1.0,
            max_message_bytes=1 << 20),
    Error(code="bad_message", message="what went wrong", in_reply_to="segment"),
    Segment(robot_id="r", episode_id=7, seq=2, episode_done=True, num_steps=0, columns={}, images={},
            arrays={"state": np.arange(12, dtype=np.float32).reshape(2, 6)}),
    Ack(robot_id="r", episode_id=7, seq=2, duplicate=True),
    Heartbeat(sender="r", policy_version=4, time_s=12.5, stats={"sent": 3, "ok": True, "rate": 0.5, "mode": "x"}),
    Stats(sender="r", stats={"stalls": 2}),
    WeightsAnnounce(version=5, sha256="ab" * 32, size=10, num_chunks=1, chunk_size=16, config_hash="h",
                    dtype="float16"),
    WeightsFetch(version=5, chunk=0),
    WeightsChunk(version=5, chunk=0, sha256="cd" * 32, data=np.arange(10, dtype=np.uint8)),
]


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _envelope(type_: str = "ack", body: dict | None = None, arrays: list | None = None,
              v: int = PROTOCOL_VERSION) -> bytes:
    body = {"robot_id": "r", "episode_id": 1, "seq": 0, "duplicate": False, "verdict": {}} if body is None else body
    return msgpack.packb({"v": v, "type": type_, "body": body, "arrays": arrays or []})


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.TYPE)
def test_every_message_type_round_trips(msg):
    frames = [bytes(f) for f in encode_message(msg)]
    back = decode_message(frames)
    assert type(back) is type(msg)
    for name in msg.__dataclass_fields__:
        assert _equal(getattr(msg, name), getattr(back, name)), name


def test_arrays_are_zero_copy_views_of_the_frames():
    data = bytearray(np.arange(6, dtype=np.float32).tobytes())
    frames = encode_frames("segment", {}, {})  # just to get a valid envelope shape
    env = msgpack.unpackb(frames[0])
    env["type"] = "weights_chunk"
    env["body"] = {"version": 1, "chunk": 0, "sha256": ""}
    env["arrays"] = [{"name": "data", "dtype": "|u1", "shape": [24], "frame": 1}]
    msg = decode_message([msgpack.packb(env), data])
    assert not msg.data.flags.writeable
    data[0] = 42  # the decoded array sees the receive buffer itself
    assert msg.data[0] == 42


def test_big_endian_arrays_are_sent_little_endian():
    arr = np.arange(4, dtype=">f4")
    back = decode_message(encode_message(WeightsChunk(version=1, chunk=0, sha256="", data=np.zeros(1, np.uint8))))
    assert back.data.dtype == np.uint8
    raw = decode_message(encode_message(Segment(robot_id="r", episode_id=0, seq=0, episode_done=False, num_steps=4,
                                                columns={}, images={}, arrays={"x": arr})))
    assert raw.arrays["x"].dtype.str == "<f4" and np.array_equal(raw.arrays["x"], arr)


# ---------------------------------------------------------------- strict validation


@pytest.mark.parametrize(
    ("frames", "needle"),
    [
        ([], "empty message"),
        ([b"\xc1garbage"], "not valid msgpack"),
        ([msgpack.packb([1, 2, 3])], "must be a msgpack map"),
        ([_envelope(v=PROTOCOL_VERSION + 1)], "protocol version mismatch"),
        ([msgpack.packb({"type": "ack"})], "protocol version mismatch"),
        ([_envelope("teleport")], "unknown message type 'teleport'"),
        ([_envelope(body={"robot_id": "r", "episode_id": 1, "seq": 0, "verdict": {}})],
         "missing fields ['duplicate']"),
        ([_envelope(body={"robot_id": "r", "episode_id": 1, "seq": 0, "duplicate": False, "verdict": {}, "x": 1})],
         "unexpected fields ['x']"),
        ([_envelope(body={"robot_id": "r", "episode_id": "1", "seq": 0, "duplicate": False, "verdict": {}})],
         "ack.episode_id must be an int"),
        ([_envelope(body={"robot_id": "r", "episode_id": True, "seq": 0, "duplicate": False, "verdict": {}})],
         "ack.episode_id must be an int"),
        ([_envelope(body={"robot_id": "r", "episode_id": 1, "seq": 0, "duplicate": 1, "verdict": {}})],
         "ack.duplicate must be a bool"),
        ([_envelope(), b"extra"], "describes 0 arrays but the message has 1"),
        ([msgpack.packb({"v": PROTOCOL_VERSION, "type": "ack", "body": {}, "arrays": [], "more": 1})],
         "unexpected ['more']"),
        ([msgpack.packb({"v": PROTOCOL_VERSION, "type": "ack", "body": msgpack.ExtType(5, b"x"), "arrays": []})],
         "extension type"),
        (
            [_envelope("weights_chunk", {"version": 1, "chunk": 0, "sha256": ""},
                       [{"name": "data", "dtype": "|O", "shape": [1], "frame": 1}]), b"\x00" * 8],
            "dtype '|O' is not allowed",
        ),
        (
            [_envelope("weights_chunk", {"version": 1, "chunk": 0, "sha256": ""},
                       [{"name": "data", "dtype": "|u1", "shape": [5], "frame": 1}]), b"1234"],
            "needs 5 bytes, frame 1 has 4",
        ),
        (
            [_envelope("weights_chunk", {"version": 1, "chunk": 0, "sha256": ""},
                       [{"name": "data", "dtype": "|u1", "shape": [-4], "frame": 1}]), b"1234"],
            "must be a list of at most",
        ),
        (
            [_envelope("weights_chunk", {"version": 1, "chunk": 0, "sha256": ""},
                       [{"name": "data", "dtype": "<f4", "shape": [1], "frame": 1}]), b"1234"],
            "weights_chunk.data must be 1-D uint8",
        ),
        ([_envelope("weights_chunk", {"version": 1, "chunk": 0, "sha256": ""})], "missing array 'data'"),
        ([_envelope("weights_fetch", {"version": 1, "chunk": -1})], "chunk must be >= 0"),
    ],
)
def test_malformed_messages_raise_clear_protocol_errors(frames, needle):
    with pytest.raises(ProtocolError) as info:
        decode_message(frames)
    assert needle in str(info.value)


def test_version_mismatch_has_its_own_code():
    with pytest.raises(ProtocolError) as info:
        decode_message([_envelope(v=99)])
    assert info.value.code == "version_mismatch"
    assert f"this side speaks {PROTOCOL_VERSION}" in str(info.value)


def test_oversized_messages_are_refused_before_parsing():
    frames = encode_message(WeightsChunk(version=1, chunk=0, sha256="", data=np.zeros(2000, np.uint8)))
    with pytest.raises(ProtocolError) as info:
        decode_message(frames, Limits(max_message_bytes=1000))
    assert info.value.code == "too_large" and "limit is 1000" in str(info.value)
    with pytest.raises(ProtocolError, match="array frames; the limit is 2"):
        decode_message([_envelope(), b"", b"", b""], Limits(max_arrays=2))


def test_encoder_refuses_dtypes_the_wire_does_not_carry():
    with pytest.raises(ProtocolError, match="does not carry"):
        encode_message(Segment(robot_id="r", episode_id=0, seq=0, episode_done=False, num_steps=1, columns={},
                               images={}, arrays={"x": np.array(["a"], dtype=object)}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=200), min_size=0, max_size=4))
def test_fuzz_random_frames_only_ever_raise_protocol_error(frames):
    with contextlib.suppress(ProtocolError):
        decode_message(frames)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_fuzz_mutated_valid_messages_only_ever_raise_protocol_error(msg, data):
    frames = [bytearray(bytes(f)) for f in encode_message(msg)]
    which = data.draw(st.integers(0, len(frames) - 1))
    if frames[which]:
        pos = data.draw(st.integers(0, len(frames[which]) - 1))
        frames[which][pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frames[0])))
    frames[0] = frames[0][:cut] if data.draw(st.booleans()) else frames[0]
    with contextlib.suppress(ProtocolError):
        decode_message([bytes(f) for f in frames])


# ---------------------------------------------------------------- segments


def _smooth_image(h: int, w: int, phase: float) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 / w, y * 255 / h, 128 + 100 * np.sin(x / 7 + y / 11 + phase)], axis=-1)
    return img.astype(np.uint8)


def _steps(n: int = 6, cameras: tuple[str, ...] = ("front", "wrist")) -> list[Step]:
    rng = np.random.default_rng(1)
    return [
        Step(
            tick=100 + i, time_s=3.0 + i / 30, state=rng.normal(size=6).astype(np.float32),
            action=rng.normal(size=6).astype(np.float32),
            images={c: _smooth_image(48, 64, i + k) for k, c in enumerate(cameras)},
            instruction="pick the red cube",
            policy_action=None if i % 3 == 0 else rng.normal(size=6).astype(np.float32),
            is_intervention=i == 2, reward=0.25 * i, done=i == n - 1, success=i == n - 1, policy_version=4,
            chunk_id=i // 2, chunk_index=i % 2, delay_ticks=3, rolled_state=rng.normal(size=6).astype(np.float32),
            stall=i == 1, lateness_s=0.001 * i,
        )
        for i in range(n)
    ]


def _round_trip_steps(steps: list[Step], enc: ImageEncoding) -> list[Step]:
    msg = encode_segment("so101-a", 9, 3, steps, episode_done=True, image_encoding=enc)
    back = decode_message([bytes(f) for f in encode_message(msg)])
    assert (back.robot_id, back.episode_id, back.seq, back.episode_done) == ("so101-a", 9, 3, True)
    return decode_segment(back)


@pytest.mark.parametrize("fmt", ["png", "raw"])
def test_segment_round_trip_is_exact_with_lossless_images(fmt):
    steps = _steps()
    out = _round_trip_steps(steps, ImageEncoding(format=fmt))
    assert len(out) == len(steps)
    for a, b in zip(steps, out, strict=True):
        for name in a.__dataclass_fields__:
            va, vb = getattr(a, name), getattr(b, name)
            if name == "images":
                assert va.keys() == vb.keys() and all(np.array_equal(va[c], vb[c]) for c in va)
            elif isinstance(va, np.ndarray) or va is None:
                assert (va is None and vb is None) or (vb.dtype == np.float32 and np.array_equal(va, vb)), name
            else:
                assert va == vb and type(va) is type(vb), name


def test_segment_jpeg_images_are_close_and_everything_else_exact():
    steps = _steps(3)
    out = _round_trip_steps(steps, ImageEncoding(format="jpeg", jpeg_quality=95))
    for a, b in zip(steps, out, strict=True):
        assert np.array_equal(a.state, b.state) and np.array_equal(a.action, b.action) and a.reward == b.reward
        for cam in a.images:
            assert b.images[cam].shape == a.images[cam].shape and b.images[cam].dtype == np.uint8
            assert np.abs(b.images[cam].astype(int) - a.images[cam]).mean() < 3.0


def test_segment_without_cameras_or_optional_arrays():
    steps = [Step(tick=i, time_s=float(i), state=np.zeros(3, np.float32), action=np.ones(2, np.float32))
             for i in range(2)]
    out = _round_trip_steps(steps, ImageEncoding())
    assert out[1].images == {} and out[1].policy_action is None and out[1].rolled_state is None


def test_segment_with_wrong_image_header_is_refused():
    msg = encode_segment("r", 0, 0, _steps(1, ("front",)), image_encoding=ImageEncoding("png"))
    lying = Segment(**{**msg.__dict__, "images": {"front": {"format": "png", "shape": [4000, 4000, 3]}}})
    with pytest.raises(ProtocolError, match="header says size"):
        decode_segment(lying)
    bad_cols = Segment(**{**msg.__dict__, "columns": {**msg.columns, "reward": ["x"]}})
    with pytest.raises(ProtocolError, match="column 'reward'"):
        decode_segment(bad_cols)


def test_segment_encoder_refuses_inconsistent_steps():
    steps = _steps(2)
    steps[1].images = {"front": steps[1].images["front"]}
    with pytest.raises(ValueError, match="cameras/shapes differ"):
        encode_segment("r", 0, 0, steps)


# ---------------------------------------------------------------- weights


def test_weights_numpy_round_trip_and_fp16_transfer():
    tensors = {"w": np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), "step": np.array([7], np.int64)}
    exact = deserialize_tensors(serialize_tensors(tensors))
    assert all(np.array_equal(exact[k], tensors[k]) for k in tensors)
    half = deserialize_tensors(serialize_tensors(tensors, transfer_dtype="float16"), cast_to="float32")
    assert half["w"].dtype == np.float32 and np.allclose(half["w"], tensors["w"], atol=1e-3)
    assert half["step"].dtype == np.int64
    with pytest.raises(WeightsError, match="not valid safetensors"):
        deserialize_tensors(b"\x00" * 20)


def test_weights_torch_bfloat16_transfer():
    torch = pytest.importorskip("torch")
    sd = {"layer.weight": torch.randn(4, 4), "count": torch.tensor([3])}
    back = deserialize_tensors(serialize_tensors(sd, transfer_dtype="bfloat16"), framework="pt", cast_to="float32")
    assert back["layer.weight"].dtype == torch.float32
    assert torch.allclose(back["layer.weight"], sd["layer.weight"], atol=0.05)
    assert back["count"].dtype == torch.int64


def test_snapshot_buffer_is_safetensors_that_safetensors_itself_reads():
    torch = pytest.importorskip("torch")
    from safetensors.torch import load as load_torch

    from robot_rl.bridges.zmq.weights import snapshot_buffer, tensor_views

    sd = {"b.weight": torch.randn(5, 3).t(),  # not contiguous
          "a.bias": torch.randn(7), "count": torch.tensor([3, 4]), "mask": torch.tensor([True, False]),
          "empty": torch.zeros(0, 4), "half": torch.randn(3, dtype=torch.float16)}
    exact = load_torch(bytes(snapshot_buffer(sd, metadata={"version": "3"})))
    assert set(exact) == set(sd) and all(torch.equal(exact[k], sd[k].float() if k == "half" else sd[k]) for k in sd)
    small = load_torch(bytes(snapshot_buffer(sd, transfer_dtype="bfloat16")))
    assert small["a.bias"].dtype == torch.bfloat16 and small["count"].dtype == torch.int64
    assert torch.equal(small["a.bias"], sd["a.bias"].to(torch.bfloat16))
    # What a reference writer's bytes decode to, ours do too (same tensors, both readable by tensor_views).
    reference = serialize_tensors(sd)
    assert {k: (v.dtype, v.shape) for k, v in tensor_views(reference).items()} == \
        {k: (v.dtype, v.shape) for k, v in tensor_views(snapshot_buffer(sd)).items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_non_finite_element_in_any_tensor_of_a_snapshot_is_found_and_named(dtype):
    """Tensors back to back are read as one run; the one holding the NaN/inf is the one named,
    wherever it lies (first, between ints, last) and whatever the run around it holds."""
    torch = pytest.importorskip("torch")
    from robot_rl.bridges.zmq.weights import non_finite_tensor_in, snapshot_buffer

    generator = torch.Generator().manual_seed(5)
    sd = {f"layer{i:02d}.weight": torch.randn(300 + i, generator=generator) for i in range(12)}
    sd |= {"layer05.count": torch.tensor([1, 2, 3]), "layer05.empty": torch.zeros(0)}  # an int splits the run
    data = snapshot_buffer(sd, transfer_dtype=dtype)
    assert non_finite_tensor_in(data) is None
    views = tensor_views(data)
    for name, bad in (("layer00.weight", float("nan")), ("layer06.weight", float("inf")),
                      ("layer11.weight", float("-inf"))):
        place = torch.frombuffer(data, dtype=getattr(torch, dtype), count=views[name].numel,
                                 offset=views[name].offset)
        kept = place[-1].item()
        place[-1] = bad
        assert non_finite_tensor_in(data) == name
        place[-1] = kept
    assert non_finite_tensor_in(data) is None


def test_the_version_digest_covers_every_chunk_and_the_chunking():
    data = bytearray(os.urandom(10_000))
    blob = WeightsBlob(version=2, data=bytes(data), config_hash="h", chunk_size=3000)
    data[9_999] ^= 1  # the last byte of the last chunk
    assert WeightsBlob(version=2, data=bytes(data), config_hash="h", chunk_size=3000).sha256 != blob.sha256
    assert WeightsBlob(version=2, data=blob.data, config_hash="h", chunk_size=2000).sha256 != blob.sha256
    assert WeightsBlob(version=9, data=blob.data, config_hash="h", chunk_size=3000).sha256 == blob.sha256


def _reassemble(blob: WeightsBlob, tamper: dict[int, bytes] | None = None) -> ChunkAssembler:
    """Every chunk received, then verified on two threads at once, as the link does."""
    asm = ChunkAssembler(blob.announce())
    for i in range(blob.num_chunks):
        chunk = blob.chunk_message(i)
        if tamper and i in tamper:
            chunk = WeightsChunk(version=chunk.version, chunk=i, sha256=chunk.sha256,
                                 data=np.frombuffer(tamper[i], np.uint8))
        asm.receive(chunk)
    assert asm.missing() == [] and asm.received == blob.num_chunks  # none is requested again meanwhile
    with ThreadPoolExecutor(2) as workers:
        errors = asm.store_received(workers)
    if errors:
        raise errors[0]
    return asm


def test_weights_chunking_reassembles_and_verifies():
    data = os.urandom(10_000)
    blob = WeightsBlob(version=2, data=data, config_hash="h", chunk_size=3000)
    assert blob.num_chunks == 4 and blob.announce().size == 10_000
    assert _reassemble(blob).result() == data


def test_corrupted_chunk_is_refused():
    blob = WeightsBlob(version=2, data=os.urandom(10_000), config_hash="h", chunk_size=3000)
    bad = bytearray(blob.chunk(1))
    bad[5] ^= 0xFF
    with pytest.raises(WeightsError, match="chunk 1: sha256 mismatch"):
        _reassemble(blob, {1: bytes(bad)})


def test_a_corrupt_chunk_verified_beside_good_ones_is_the_only_one_missing_and_its_refetch_completes():
    blob = WeightsBlob(version=2, data=os.urandom(10_000), config_hash="h", chunk_size=3000)
    asm = ChunkAssembler(blob.announce())
    tampered = blob.chunk_message(1)
    tampered = WeightsChunk(version=2, chunk=1, sha256=tampered.sha256,
                            data=np.frombuffer(bytes(b ^ 1 for b in blob.chunk(1)), np.uint8))
    for chunk in (blob.chunk_message(0), tampered, blob.chunk_message(2), blob.chunk_message(3)):
        asm.receive(chunk)
    with ThreadPoolExecutor(2) as workers:
        errors = asm.store_received(workers)
        assert [str(e) for e in errors] == ["weights v2 chunk 1: sha256 mismatch (corrupted in transit); refetch it"]
        assert asm.missing() == [1] and not asm.complete
        asm.receive(blob.chunk_message(1))
        assert asm.missing() == [] and asm.store_received(workers) == []
    assert asm.complete and bytes(asm.result()) == bytes(blob.data)


def test_a_chunk_of_the_wrong_length_or_version_is_refused_when_it_arrives():
    blob = WeightsBlob(version=2, data=os.urandom(10_000), config_hash="h", chunk_size=3000)
    asm = ChunkAssembler(blob.announce())
    good = blob.chunk_message(0)
    with pytest.raises(WeightsError, match="2999 bytes, expected 3000"):
        asm.receive(WeightsChunk(version=2, chunk=0, sha256=good.sha256, data=good.data[:-1]))
    with pytest.raises(WeightsError, match="does not belong to v2"):
        asm.receive(WeightsChunk(version=3, chunk=0, sha256=good.sha256, data=good.data))
    assert asm.received == 0 and asm.missing() == [0, 1, 2, 3]


def test_payload_not_matching_announced_sha256_is_refused():
    blob = WeightsBlob(version=2, data=os.urandom(5000), config_hash="h", chunk_size=3000)
    lying = WeightsAnnounce(**{**blob.announce().__dict__, "sha256": "00" * 32})
    asm = ChunkAssembler(lying)
    for i in range(blob.num_chunks):
        asm.receive(blob.chunk_message(i))
    assert asm.store_received() == []
    with pytest.raises(WeightsError, match="differs from announced"):
        asm.result()
    with pytest.raises(WeightsError, match="inconsistent announce"):
        ChunkAssembler(WeightsAnnounce(**{**lying.__dict__, "num_chunks": 7}))


# ---------------------------------------------------------------- keys


def test_keypair_files_and_permissions(tmp_path):
    public, secret = generate_keypair(tmp_path, "robot-a")
    assert public.name == "robot-a.key" and secret.name == "robot-a.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    pair = load_keypair(secret)
    assert pair.public == load_public_key(public) and len(pair.secret) == 40
    with pytest.raises(ValueError, match="holds no secret key"):
        load_keypair(public)


@pytest.mark.parametrize(
    ("endpoint", "local"),
    [
        ("tcp://127.0.0.1:5555", True), ("tcp://127.0.0.1:*", True), ("tcp://localhost:5", True),
        ("tcp://[::1]:5555", True), ("ipc:///tmp/x", True), ("inproc://a", True),
        ("tcp://*:5555", False), ("tcp://0.0.0.0:5555", False), ("tcp://10.0.0.5:5555", False),
        ("tcp://learner.lab:5555", False),
    ],
)
def test_loopback_detection(endpoint, local):
    assert is_loopback(endpoint) is local


def test_plain_tcp_off_loopback_is_refused_unless_explicitly_allowed():
    with pytest.raises(InsecureEndpointError, match="CURVE keys are required"):
        check_endpoint_security("tcp://*:5555", None, allow_insecure=False)
    check_endpoint_security("tcp://*:5555", None, allow_insecure=True)
    check_endpoint_security("tcp://127.0.0.1:5555", None, allow_insecure=False)


_SEGMENT_FRAMES = [bytes(f) for f in encode_message(encode_segment("r", 1, 0, _steps(2),
                                                                  image_encoding=ImageEncoding("png")))]
_JPEG_FRAMES = [bytes(f) for f in encode_message(encode_segment("r", 1, 0, _steps(1, ("front",))))]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([_SEGMENT_FRAMES, _JPEG_FRAMES]), st.data())
def test_fuzz_corrupted_segments_only_ever_raise_protocol_error(frames, data):
    frames = [bytearray(f) for f in frames]
    for _ in range(data.draw(st.integers(1, 4))):
        which = data.draw(st.integers(0, len(frames) - 1))
        if frames[which]:
            pos = data.draw(st.integers(0, len(frames[which]) - 1))
            frames[which][pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(ProtocolError):
        decode_segment(decode_message([bytes(f) for f in frames]))
