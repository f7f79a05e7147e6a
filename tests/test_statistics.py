"""Paired comparison of two policies on the same scenes: the test that says "clearly above"."""

import pytest

from robot_rl.core.statistics import PairedComparison, compare_paired, wilson_interval


def test_only_the_discordant_scenes_decide_and_the_test_is_exact():
    # 9 scenes only A solves, 1 only B, 70 both: the exact two-sided sign test, 2 * 11 / 2**10
    a = [True] * 9 + [False] + [True] * 70
    b = [False] * 9 + [True] + [True] * 70
    result = compare_paired(a, b)
    assert (result.only_a, result.only_b, result.scenes) == (9, 1, 80)
    assert result.difference == pytest.approx(0.1)
    assert result.p_value == pytest.approx(22 / 1024)
    lo, hi = result.difference_ci95
    assert 0.0 < lo < result.difference < hi < 1.0  # significant: the interval excludes 0
    assert compare_paired(b, a).p_value == pytest.approx(result.p_value)  # two-sided


def test_the_same_wins_on_different_scenes_are_not_a_difference():
    # 8 of 10 for both, but they fail on different scenes: no evidence either way
    a = [True] * 8 + [False, False]
    b = [False, False] + [True] * 8
    result = compare_paired(a, b)
    assert result.difference == 0.0 and result.p_value == 1.0
    lo, hi = result.difference_ci95
    assert lo < 0.0 < hi


def test_identical_outcomes_cannot_tell_two_policies_apart():
    result = compare_paired([True] * 30 + [False] * 10, [True] * 30 + [False] * 10)
    assert result.p_value == 1.0 and result.only_a == result.only_b == 0
    lo, hi = result.difference_ci95
    assert lo < 0.0 < hi and hi - lo < 0.2  # narrower than unpaired intervals, but not a point


def test_the_interval_agrees_with_the_normal_approximation_when_scenes_are_many():
    # Agresti's 1,600-pair table: 794 both, 150 only A, 86 only B, 570 neither
    a = [True] * 944 + [False] * 656
    b = [True] * 794 + [False] * 150 + [True] * 86 + [False] * 570
    lo, hi = compare_paired(a, b).difference_ci95
    wald_half = 1.96 * ((150 + 86) - (150 - 86) ** 2 / 1600) ** 0.5 / 1600
    assert lo == pytest.approx(0.04 - wald_half, abs=0.002) and hi == pytest.approx(0.04 + wald_half, abs=0.002)


def test_all_against_none_stays_inside_the_possible_range():
    result = compare_paired([True] * 20, [False] * 20)
    lo, hi = result.difference_ci95
    assert result.difference == 1.0 and 0.5 < lo < 1.0 and hi == 1.0
    assert result.p_value == pytest.approx(2 / 2 ** 20)


@pytest.mark.parametrize(("a", "b", "match"), [([True], [True, False], "same scenes"), ([], [], "at least one")])
def test_scenes_that_do_not_pair_are_refused(a, b, match):
    with pytest.raises(ValueError, match=match):
        compare_paired(a, b)


def test_it_round_trips_through_json_and_describes_itself():
    import json

    result = compare_paired([True, True, False, True], [False, True, False, False])
    back = PairedComparison.from_dict(json.loads(json.dumps(result.as_dict())))
    assert back == result
    text = back.describe("the final", "the start")
    assert text.startswith("+50.0 points") and "2 scenes only the final solved, 0 only the start" in text


def test_heldout_scores_pair_only_when_both_cover_the_same_scenes():
    from robot_rl.app.evaluation import format_paired, paired_scores

    final = {"success": 0.75, "per_episode_success": [True, True, True, False]}
    start = {"success": 0.25, "per_episode_success": [False, True, False, False]}
    paired = paired_scores(final, start)
    assert paired["only_a"] == 2 and paired["difference"] == pytest.approx(0.5)
    assert format_paired(paired) == f"+50.0 (p={paired['p_value']:.2g})"
    assert paired_scores(final, None) is None and paired_scores(None, start) is None
    assert paired_scores(final, {"success": 0.5}) is None  # an older result: no per-scene successes
    assert paired_scores(final, {"per_episode_success": [True]}) is None  # other scenes
    assert format_paired(None) == "-"


def test_the_wilson_interval_stays_honest_at_the_edges():
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-3)  # 0/10 is not "0 %, certainly"
    low, high = wilson_interval(10, 10)
    assert high == 1.0 and low == pytest.approx(0.7225, abs=1e-3)
    low, high = wilson_interval(45, 50)
    assert low < 0.9 < high and high - low < 0.2
    assert wilson_interval(0, 0) == (0.0, 1.0)  # nothing measured: nothing known
