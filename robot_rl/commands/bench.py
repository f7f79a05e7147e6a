"""`robot-rl bench NAME`: run a benchmark, print its table, write its JSON.

Benchmarks compare alternatives side by side in one run (ratios), because these machines are
shared and noisy: absolute numbers from separate runs do not compare.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

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
                             "edge inference ms, publish bytes"),
}


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<10} {what}" for name, (_, what) in BENCHMARKS.items())
    result = argparse.ArgumentParser(
        prog="robot-rl bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a benchmark; print a table; write JSON. The benchmark's own settings are "
                    "bench.KEY=VALUE (`robot-rl bench NAME --cfg job` lists them); every other override "
                    f"applies to the configuration as usual.\n\nbenchmarks:\n{listing}\n\n"
                    "  robot-rl bench transport bench.swaps=20 --json bench_results/transport.json\n"
                    "  robot-rl bench learning bench.arms=[rwr,hgdagger] bench.minutes_per_arm=8")
    result.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    result.add_argument("--json", type=Path, default=None,
                        help="where to write results (default bench_results/NAME.json)")
    result.add_argument("--quick", action="store_true",
                        help="the NAME_quick preset: a smoke run, not for BENCHMARKS.md")
    result.add_argument("--cfg", choices=("job", "all"), default=None, help="print the composed config and exit")
    result.add_argument("--resolve", action="store_true", help="with --cfg: fill in interpolations")
    return result


def name_taken(overrides: list[str], key: str) -> bool:
    return any(item.partition("=")[0].lstrip("+") == key for item in overrides)


def main(argv: list[str]) -> int:
    from robot_rl.config import ConfigError, config_yaml, load_config

    args, overrides = parser().parse_known_args(argv)
    preset = f"+bench={args.name}_quick" if args.quick else f"+bench={args.name}"
    if args.cfg:
        print(config_yaml([preset, *overrides], resolve=args.resolve), end="")
        return 0
    cfg = load_config([preset, *overrides])
    module = importlib.import_module(f"robot_rl.bench.{BENCHMARKS[args.name][0]}")
    path = args.json or Path("bench_results") / f"{args.name}.json"
    if name_taken(overrides, "learner") and args.name == "learning":
        raise ConfigError("the arms choose the learner (bench.arms=[...]); drop learner=...")
    # Benchmarks that write files beside their JSON (plots) take its path; those that compose the
    # config again (one learner per arm) take this command line to compose it from.
    wants = inspect.signature(module.run_from_cli).parameters
    extra: dict[str, Any] = {"json_path": path, "compose": lambda more: load_config([preset, *overrides, *more])}
    results = module.run_from_cli(cfg, **{key: value for key, value in extra.items() if key in wants})
    results["quick"] = args.quick
    results["overrides"] = overrides
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=True, default=str))
    print(f"wrote {path}")
    return 0
