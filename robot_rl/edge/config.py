"""EdgeConfig: every knob of the edge runtime (the ``edge`` group of the configuration).

The three modes share one code path; ``ModeRules`` spells out the few decisions in
which they differ, so the control loop never branches on a mode name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MODES = ("sync", "async_naive", "async_rollforward")
REPLANS = ("auto", "thrifty", "continuous")
LATENCY_DISTRIBUTIONS = ("constant", "uniform", "lognormal", "measured")
INFERENCE_RUNNERS = ("auto", "virtual", "thread", "process", "remote")


@dataclass
class EdgeConfig:
    """Settings of one edge node.

    Timing is counted in control ticks (1 tick = 1/fps s) because that is the unit in
    which actions are consumed: a delay of d ticks means d actions of the old chunk
    were executed while the new one was being computed.
    """

    fps: int = 30
    mode: str = "async_rollforward"

    # Async modes: ask for the next chunk when `remaining <= threshold`.
    # None = adaptive: delay estimate + threshold_margin, so the new chunk lands just
    # before the old one runs out (no stall) without throwing away more of it than needed.
    request_threshold: int | None = None
    threshold_margin: int = 2
    # Async modes: the adaptive threshold never goes below this, so with fast inference the
    # policy still re-plans after at most H - min_request_threshold actions of a chunk (closed
    # loop, at one policy call per that many ticks). 0 = the adaptive threshold alone: a chunk
    # runs ~H - d - margin actions. On the push task a floor of 10 lifted the BC start from 62.5
    # to 71.2 % on unseen scenes but not the fine-tuned weights (+0.7 points over nine runs'
    # weights; BENCHMARKS.md "replan"), so it stays off by default.
    min_request_threshold: int = 0

    # Async modes: when to ask for the next chunk.
    # "thrifty": when `remaining <= threshold` above, one request in flight: one policy call per
    #   chunk, but a change in the world reaches the executed plan only after most of a chunk.
    # "continuous": whenever a request slot is free (max_inflight of them, started delay/slots
    #   ticks apart): the plan follows the world within ~1 + 1/(2 x slots) inferences, at one policy
    #   call per inference per slot (at 200 ms thrifty reacts in 2.7x the floor, continuous with 2
    #   slots in 1.46x: BENCHMARKS.md "async").
    # "auto": continuous with the most slots the policy can afford, else thrifty. Affordable: its
    #   measured compute time x slots within replan_duty of the time between two requests
    #   (the inference latency, at least one tick). A policy computing on this machine is busy for
    #   its whole latency and stays thrifty (it shares the CPU or GPU with the robot's other work);
    #   a remote or batched one, whose latency is mostly transfer and queueing, re-plans continuously.
    #   On the virtual clock the decision follows the simulated latency alone, so it is the same on
    #   any machine: above 0 ms a remote server (continuous), 0 ms or "measured" a local policy.
    #   A request_threshold or min_request_threshold set above means thrifty.
    replan: str = "auto"
    replan_duty: float = 0.5
    # Continuous re-planning: requests in flight at once. One in flight sees a change in the world
    # on average half an inference late (the running one was started before it); N staggered ones
    # cut that to 1/(2N). Worth it where the policy runs requests concurrently (sim latency, a GPU
    # server); "auto" uses fewer where they are not affordable. Thrifty re-planning keeps one.
    max_inflight: int = 2

    # Ask for the first chunk of an episode before tick 0 and start the episode's clock
    # when it is there. The arm stands at its start pose while the scene is set, so the
    # first inference costs no task time (no runtime can move the arm before a plan
    # exists). Waits at most first_chunk_timeout_s, then starts anyway holding, and the
    # chunk lands as an ordinary late one. Kept short: during the wait the operator
    # session reads no keys (Ctrl-C still stops it), and a cold GPU start is better
    # spent holding inside the episode, where the session stays responsive. All modes.
    plan_before_start: bool = True
    first_chunk_timeout_s: float = 5.0

    # Sync mode: execute this many actions of each chunk, then stop and wait for the
    # next inference (LeRobot's n_action_steps, openpi's replan_steps). None = whole chunk.
    execution_horizon: int | None = None

    # Delay estimator: high quantile of the last `delay_window` measured delays (ticks),
    # starting from a prior (written by the latency calibration).
    delay_window: int = 10
    delay_quantile: float = 0.9
    delay_prior_ticks: int = 3
    # Roll-forward: the measured joint state trails the commanded target by this many ticks
    # (servo, bus and driver; `robot-rl calibrate latency` measures it as command-to-motion).
    # The policy was trained on measured states, so the rolled state it gets is the target
    # commanded this many ticks before the new chunk starts: where the arm will be read to be.
    # 0 = the arm reads where it was told one tick ago (the sim, a kinematic arm).
    command_lag_ticks: int = 0
    # The file `robot-rl calibrate latency` wrote for this robot; its delay prior and command lag
    # replace delay_prior_ticks and command_lag_ticks. null = ${output_dir}/calibration/ROBOT/latency.yaml
    # when it exists.
    latency_calibration: str | None = None

    # Seam smoothing: linearly blend this many new actions with what the old plan
    # would have commanded at the same ticks. 0 = off.
    blend_ticks: int = 0
    # ACT's temporal ensembling (Zhao et al. 2023, LeRobot's ACTTemporalEnsembler): each tick's action
    # is the average of every prediction for that tick of the chunks spliced so far, the i-th oldest
    # weighted exp(-coeff * i) (0: equal weights; LeRobot's suggested 0.01). Smooths where chunks
    # overlap, so it pays off with continuous re-planning; for any chunking policy. None = off: a
    # new chunk replaces the plan. (A checkpoint's own temporal_ensemble_coeff is not read: set it here.)
    temporal_ensemble_coeff: float | None = None
    # Real-time chunking (LeRobot's RTC, for flow policies: FlowVLA, SmolVLA, pi0, pi0.5), with mode
    # async_naive: each request carries the actions the queue will execute from the request tick
    # on, and the policy's sampling is guided to agree with them over the estimated delay, so the
    # new chunk, which starts at the request tick, joins the executing one without a jump (the
    # policy sees the measured state; no roll-forward, no blend needed).
    real_time_chunking: bool = False

    # Safety: largest change of any joint target between two ticks (degrees, gripper
    # units); one number for every joint or a list with one per joint. None = off. A real
    # arm's own velocity limit (``robot.max_joint_velocity``, units/s) applies on top of it,
    # always: the tighter of the two bounds each joint (robot_rl.core.motion_limits).
    # (Typed Any: the config system has no union of a number and a list; JointDeltaClamp checks it.)
    max_joint_delta_per_tick: Any = None

    # Simulated inference latency for the virtual runner. "measured" releases the chunk
    # after the policy's real compute time (a CPU policy behaving as it would in real time).
    simulated_latency_ms: float = 0.0
    latency_jitter_ms: float = 0.0
    latency_distribution: str = "constant"
    latency_seed: int = 0

    # Where the policy computes chunks. "process": a child process of its own with the weights
    # loader (robot_rl.edge.process_runner), so nothing shares the control loop's interpreter lock;
    # `robot-rl session` / `robot-rl edge` build the policy there on the wall clock. "thread": a
    # thread of the control process. "virtual": computed at once, released after the simulated
    # latency (exact timing on a virtual clock). "remote": a policy server (robot-rl serve, or a
    # serving learner) at link.policy_server computes the chunks (robot_rl.edge.remote_runner; in
    # robot-rl run, the run's own learner at serve.endpoint).
    # "auto": process where the policy was built in one, remote where it is served,
    # else virtual on a virtual clock and thread on the wall clock.
    inference_runner: str = "auto"

    # A tick that starts more than this after its scheduled time counts as late.
    late_threshold_ms: float = 5.0
    # On the wall clock the control loop's thread runs under SCHED_FIFO at this priority while it
    # ticks, ahead of every thread of normal priority (the link, the recorder, a learner on the
    # same machine), as ros2_control's controller thread does; below the 50 of PREEMPT_RT's
    # interrupt threads, so the motor bus's USB interrupts still come first. Where the OS refuses
    # (no CAP_SYS_NICE, no rtprio limit) the loop runs at normal priority and says so once. A
    # simulated robot's loop (physics and rendering, no motor bus) is never raised, nor is the
    # switch interval below changed for it. 0: never ask (robot_rl.core.priority.realtime_thread).
    realtime_priority: int = 40
    # On the wall clock, while the loop ticks, the interpreter hands its lock to a waiting thread after
    # this long (sys.setswitchinterval; Python's default is 5 ms): a waking tick waits at most about
    # this for another thread of the control process that runs Python code (the link, the recorder).
    # 0: Python's default.
    switch_interval_ms: float = 1.0

    def __post_init__(self) -> None:
        problems = []
        if self.fps <= 0:
            problems.append(f"fps must be > 0, got {self.fps}")
        if self.mode not in MODES:
            problems.append(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.request_threshold is not None and self.request_threshold < 0:
            problems.append(f"request_threshold must be >= 0 or None, got {self.request_threshold}")
        if self.min_request_threshold < 0:
            problems.append(f"min_request_threshold must be >= 0, got {self.min_request_threshold}")
        if self.max_inflight < 1:
            problems.append(f"max_inflight must be >= 1, got {self.max_inflight}")
        if self.replan not in REPLANS:
            problems.append(f"replan must be one of {REPLANS}, got {self.replan!r}")
        if not 0.0 < self.replan_duty <= 1.0:
            problems.append(f"replan_duty must be in (0, 1], got {self.replan_duty}")
        if self.threshold_margin < 0:
            problems.append(f"threshold_margin must be >= 0, got {self.threshold_margin}")
        if self.first_chunk_timeout_s <= 0:
            problems.append(f"first_chunk_timeout_s must be > 0, got {self.first_chunk_timeout_s}")
        if self.execution_horizon is not None and self.execution_horizon < 1:
            problems.append(f"execution_horizon must be >= 1 or None, got {self.execution_horizon}")
        if self.delay_window < 1:
            problems.append(f"delay_window must be >= 1, got {self.delay_window}")
        if not 0.0 < self.delay_quantile <= 1.0:
            problems.append(f"delay_quantile must be in (0, 1], got {self.delay_quantile}")
        if self.delay_prior_ticks < 0:
            problems.append(f"delay_prior_ticks must be >= 0, got {self.delay_prior_ticks}")
        if self.command_lag_ticks < 0:
            problems.append(f"command_lag_ticks must be >= 0, got {self.command_lag_ticks}")
        if self.blend_ticks < 0:
            problems.append(f"blend_ticks must be >= 0, got {self.blend_ticks}")
        if self.temporal_ensemble_coeff is not None and (self.temporal_ensemble_coeff < 0 or self.blend_ticks):
            problems.append(f"temporal_ensemble_coeff must be >= 0 and replaces blend_ticks (one seam smoothing at a "
                            f"time), got {self.temporal_ensemble_coeff} with blend_ticks={self.blend_ticks}")
        if self.real_time_chunking and self.mode != "async_naive":
            problems.append(f"real_time_chunking guides chunks that start at their request tick: it needs "
                            f"mode async_naive, got {self.mode!r}")
        if self.simulated_latency_ms < 0 or self.latency_jitter_ms < 0:
            problems.append("simulated_latency_ms and latency_jitter_ms must be >= 0")
        if self.latency_distribution not in LATENCY_DISTRIBUTIONS:
            problems.append(
                f"latency_distribution must be one of {LATENCY_DISTRIBUTIONS}, got {self.latency_distribution!r}"
            )
        if not 0 <= self.realtime_priority <= 99:
            problems.append(f"realtime_priority must be 0 (off) or a SCHED_FIFO priority 1-99, got "
                            f"{self.realtime_priority}")
        if not 0 <= self.switch_interval_ms <= 5:
            problems.append(f"switch_interval_ms must be in [0, 5] (0: Python's default), "
                            f"got {self.switch_interval_ms}")
        if self.inference_runner not in INFERENCE_RUNNERS:
            problems.append(f"inference_runner must be one of {INFERENCE_RUNNERS}, got {self.inference_runner!r}")
        if problems:
            raise ValueError("invalid EdgeConfig: " + "; ".join(problems))

    @property
    def period_s(self) -> float:
        return 1.0 / self.fps

    @property
    def thrifty(self) -> bool:
        """Re-plan only when the queue runs low (explicitly, or because one of its thresholds is set);
        sync waits for each chunk, which is thrifty by nature."""
        return (self.rules.waits_for_chunk or self.replan == "thrifty" or self.request_threshold is not None
                or self.min_request_threshold > 0)

    @property
    def effective_max_inflight(self) -> int:
        """Slots the inference runner needs: one for a thrifty schedule, else ``max_inflight``."""
        return 1 if self.thrifty else self.max_inflight

    @property
    def rules(self) -> ModeRules:
        return ModeRules.for_mode(self.mode)


@dataclass(frozen=True)
class ModeRules:
    """The only decisions in which sync, async_naive and async_rollforward differ.

    rolls_forward: give the policy the planned target d ticks ahead instead of the
        measured state (and let the new chunk start d ticks after the request).
    drops_stale: time-align the new chunk on arrival: actions meant for ticks that
        already passed are dropped (async). Sync never drops: the robot held still
        while waiting, so nothing went stale.
    waits_for_chunk: sync semantics: execute `execution_horizon` actions, then hold
        until the next chunk; holding while the chunk is computed is by design and is
        counted as waiting, not as a stall.
    """

    rolls_forward: bool
    drops_stale: bool
    waits_for_chunk: bool

    @staticmethod
    def for_mode(mode: str) -> ModeRules:
        if mode == "sync":
            return ModeRules(rolls_forward=False, drops_stale=False, waits_for_chunk=True)
        if mode == "async_naive":
            return ModeRules(rolls_forward=False, drops_stale=True, waits_for_chunk=False)
        if mode == "async_rollforward":
            return ModeRules(rolls_forward=True, drops_stale=True, waits_for_chunk=False)
        raise ValueError(f"unknown edge mode {mode!r}; expected one of {MODES}")
