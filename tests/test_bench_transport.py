"""`robot-rl bench transport`, shortened: each path of both transports runs once, tiny (so neither
the ZeroMQ side nor LeRobot's gRPC baseline breaks unnoticed), and what the report says is checked
against what must follow from it; the numbers themselves are BENCHMARKS.md's."""

from __future__ import annotations

import socket

import pytest

from robot_rl.bench.config import TransportBenchConfig
from robot_rl.bench.transport import (
    CAMERAS,
    IMAGE,
    SwapPayload,
    grpc_ingest,
    grpc_swap,
    received_bytes,
    zmq_fanout,
    zmq_ingest,
    zmq_swap,
)

pytestmark = pytest.mark.slow

RAW_STEP_BYTES = len(CAMERAS) * IMAGE * IMAGE * 3  # the pixels of one step, uncompressed


def test_received_bytes_counts_what_a_connection_on_the_port_received():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                client.sendall(b"x" * 10_000)
                got = 0
                while got < 10_000:
                    got += len(accepted.recv(65536))
                assert received_bytes(port) == 10_000  # the accepted end; the client's own port differs
                assert received_bytes(client.getsockname()[1]) == 0  # nothing came back to it


def test_both_ingest_paths_count_steps_and_the_bytes_their_learner_received(tmp_path):
    ours, theirs = zmq_ingest(1, 2.0, tmp_path / "zmq"), grpc_ingest(1, 2.0)
    assert (ours["frame_encoding"], theirs["frame_encoding"]) == ("JPEG q90", "raw uint8")
    for row in (ours, theirs):
        assert row["steps_in_window"] > 0
        assert row["steps_per_s"] == pytest.approx(row["steps_in_window"] / row["window_s"])
    # Raw frames carry their pixels per step, JPEG frames a fraction of them. The bytes are counted on
    # arrival and the steps once decoded, so the messages in between blur the window's edges a little.
    assert theirs["wire_bytes_per_step"] >= 0.8 * RAW_STEP_BYTES
    assert 0 < ours["wire_bytes_per_step"] < 0.5 * RAW_STEP_BYTES


def test_both_swap_paths_bring_one_version_into_use(tmp_path):
    cfg = TransportBenchConfig(swaps=1, swap_gap_s=0.1, swap_timeout_s=120.0)
    payload = SwapPayload("2", 2.0)
    ours = zmq_swap(payload, "process", cfg, tmp_path / "zmq")
    theirs = grpc_swap(payload, cfg)
    assert ours["swaps"] == theirs["swaps"] == 1
    assert ours["loaded_p95_s"] <= ours["in_use_p95_s"]  # verified and loaded before a tick runs on it
    for row in (ours, theirs):
        assert row["bytes_on_wire"] >= row["payload_mb"] * 1e6 * 0.9  # the whole state dict travelled


def test_a_short_fan_out_reaches_every_robot_once_per_version_and_reports_the_cpu_each_took(tmp_path):
    cfg = TransportBenchConfig(fanout_mb=2.0, swaps=2, swap_gap_s=0.2, swap_timeout_s=60.0)
    row = zmq_fanout(2, cfg, tmp_path)
    assert row["swaps"] == row["versions_published"] == 2  # every robot reported loading each version
    assert row["repeated_loads"] == 0  # and no robot loaded one twice
    assert 0.0 < row["loaded_p50_s"] <= row["loaded_p95_s"]
    # Two robots fetched, hashed and loaded 2 MB twice; the learner serialised and served it.
    assert row["edge_cpu_s_per_version"] > 0.0 and row["learner_cpu_s_per_version"] > 0.0
