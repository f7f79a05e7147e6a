"""`robot-rl bench NAME`: run a benchmark, print its table, write its JSON.

Benchmarks compare alternatives side by side in one run (ratios), because these
machines are shared and noisy: absolute numbers from separate runs do not compare.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from pathlib import Path

# name -> (module under robot_rl.bench, what it compares)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "sim": ("sim", "render frames/s per camera (fast vs full meshes), physics steps/s, scripted-expert success"),
    "async": ("async_control", "sync vs async_naive vs async_rollforward at simulated inference latencies"),
    "transport": ("transport", "ingest steps/s and weight hot-swap latency: ZeroMQ vs LeRobot gRPC (lerobot.transport)"),
    "store": ("store", "the learner's dataset writer: seconds per stored episode and the GIL it leaves, store.commit_batch 1 vs 8, in-process vs own process"),
    "replan": ("replan", "held-out success of given weights at re-planning floors edge.min_request_threshold 0 vs N, paired"),
    "learning": ("learning", "none vs rwr vs awr vs rl vs hgdagger, with/without interventions, async learner vs sync loop"),
}
PLANNED: dict[str, int] = {}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="robot-rl bench", description="Run a benchmark; print a table; write JSON.")
    parser.add_argument("name", choices=sorted([*BENCHMARKS, *PLANNED]), help="which benchmark")
    parser.add_argument("--json", type=Path, default=None, help="where to write results (default bench_results/NAME.json)")
    parser.add_argument("--quick", action="store_true", help="fewer episodes: a smoke run, not for BENCHMARKS.md")
    args, overrides = parser.parse_known_args(argv)
    if args.name in PLANNED:
        print(f"robot-rl bench {args.name}: not built yet (issue #{PLANNED[args.name]}).", file=sys.stderr)
        return 2
    module = importlib.import_module(f"robot_rl.bench.{BENCHMARKS[args.name][0]}")
    path = args.json or Path("bench_results") / f"{args.name}.json"
    # Benchmarks that write files beside their JSON (plots) take its path.
    extra = {"json_path": path} if "json_path" in inspect.signature(module.run_from_cli).parameters else {}
    results = module.run_from_cli(quick=args.quick, overrides=overrides, **extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=True))
    print(f"wrote {path}")
    return 0
