"""The benchmarks ``robot-rl bench NAME`` runs: one entry each, read by the command and by the CLI's
help (a plain dict, so that listing them imports none of them)."""

from __future__ import annotations

# name -> (module under robot_rl.bench, what it compares)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "sim": ("sim", "render frames/s per camera (fast vs full meshes), physics steps/s, scripted-expert success"),
    "async": ("async_control", "sync vs async_naive vs async_rollforward at simulated inference latencies"),
    "transport": ("transport", "ingest steps/s and weight hot-swap latency: "
                               "ZeroMQ vs LeRobot gRPC (lerobot.transport)"),
    "realtime": ("realtime", "tick lateness p50/p99/max over a wall-clock soak of edge nodes beside a training "
                             "learner with swaps: inference in its own process vs in a thread"),
    "faults": ("faults", "the fault suite: wire fuzzing and impersonation, kill -9 of the learner with restarts, "
                         "damaged checkpoints and spools, a full disk: lost, duplicated, poisoned, admitted"),
    "store": ("store", "the learner's dataset writer: seconds per stored episode and the GIL it leaves, "
                       "store.commit_batch 1 vs 8, in-process vs own process"),
    "cameras": ("cameras", "the store fed 640x480 cameras of 4 robots in real time: video vs PNG, writer "
                           "frames/s and backlog, training read frames/s and bytes per frame"),
    "replan": ("replan", "held-out success of given weights at re-planning floors edge.min_request_threshold 0 vs N"),
    "learning": ("learning", "none vs rwr vs awr vs rl vs hgdagger, with/without interventions, "
                             "async learner vs sync loop"),
    "soak": ("soak", "a training learner fed 640x480 cameras of N robots for long: RSS of its processes over "
                     "time, lost steps, writer backlog, updates/s beside 96x96 frames"),
    "policies": ("policies", "FlowVLA vs ACT vs Diffusion vs SmolVLA, full vs LoRA: parameters, learner updates/s, "
                             "edge inference ms, publish bytes; an edge swaps the published weights in, rl updates "
                             "the flow policies"),
    "serve": ("serve", "1/4/16 robots against one policy server, batched vs one at a time: latency, chunks/s, stalls"),
    "detector": ("detector", "the success detector against the sim's ground truth: accuracy, ROC-AUC and the "
                             "share of verdicts it is unsure of, after 10/25/50/100 labelled episodes"),
}
