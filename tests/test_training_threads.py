"""The trainer's thread count after the robots stop (robot_rl.app.training_threads): the fastest measured,
on a clock the test advances, with update rates that depend on the count as a busy or a quiet box's do."""

from __future__ import annotations

from collections.abc import Callable

from robot_rl.app.training_threads import ThreadChoice, most_threads


def test_after_the_robots_the_trainer_leaves_the_writer_a_core_until_it_has_written_everything():
    assert most_threads(cores=2, episodes_to_write=40) == 1  # a second thread would wait on the writer's core
    assert most_threads(cores=2, episodes_to_write=0) == 2
    assert most_threads(cores=1, episodes_to_write=40) == 1


def drive(choice: ThreadChoice, rate: Callable[[float, int], float], seconds: float, most: Callable[[float], int],
          poll_s: float = 0.5) -> list[tuple[float, int]]:
    """Poll ``choice`` as the run's loop does; updates accrue at ``rate(now, threads)``. (time, threads) per poll."""
    now, steps, threads, seen = 0.0, 0.0, 0, []
    while now < seconds:
        threads = choice.threads(now, int(steps), most(now))
        seen.append((now, threads))
        steps += rate(now, threads) * poll_s
        now += poll_s
    return seen


def test_on_a_busy_box_one_thread_is_kept_and_two_are_tried_again_later():
    busy = {2: 0.25, 1: 3.0}  # two threads, one sharing a core with another process: 12x slower
    choice = ThreadChoice(window_s=5.0, hold_s=60.0)
    seen = drive(choice, lambda _now, n: busy[n], 140.0, lambda _now: 2)
    threads_at = dict(seen)
    assert threads_at[0.0] == 2 and threads_at[5.0] == 1  # each count measured for its window
    assert all(threads_at[t] == 1 for t in (10.0, 30.0, 69.5))  # then the fastest held
    assert threads_at[70.0] == 2  # after hold_s, measured again: the box may have quietened
    time_on_two = sum(0.5 for _, n in seen if n == 2)
    assert time_on_two <= 15.0  # 3 windows of 5 s out of 140 s on the slow count


def test_on_a_quiet_box_two_threads_are_kept_and_a_change_of_load_is_followed():
    def rate(now: float, threads: int) -> float:
        quiet = now < 70.0
        return {2: 4.5, 1: 3.0}[threads] if quiet else {2: 0.3, 1: 3.0}[threads]

    seen = dict(drive(ThreadChoice(window_s=5.0, hold_s=60.0), rate, 160.0, lambda _now: 2))
    assert seen[20.0] == 2 and seen[60.0] == 2  # quiet: both cores
    assert seen[85.0] == 1 and seen[150.0] == 1  # another process came at 70 s: one thread from the next round on


def test_the_writer_catching_up_allows_a_second_thread_at_once():
    seen = dict(drive(ThreadChoice(window_s=5.0, hold_s=60.0), lambda _now, n: {2: 4.5, 1: 3.0}[n], 40.0,
                      lambda now: 1 if now < 20.0 else 2))
    assert all(seen[t] == 1 for t in (0.0, 10.0, 19.5))  # the writer holds a core: one thread
    assert seen[20.0] == 2 and seen[35.0] == 2  # written: two measured at once, and kept
