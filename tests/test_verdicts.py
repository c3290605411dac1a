"""The verdict rules: v1 (the committed report's) unchanged, and v2's t-intervals, TOST equivalence, explicit margins
and error-ratio scale, each on a constructed case where the two disagree."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from scipy import stats as sps

from vitlab.errors import VitlabError
from vitlab.experiments.reproduce.verdicts import (
    INCONCLUSIVE,
    MARGIN,
    NOT_REPRODUCED,
    REPRODUCED,
    TOL,
    Rule,
    at_least,
    at_least_v1,
    close,
    close_v1,
    combine,
    estimate,
    gap_shrinks,
    greater,
    greater_v1,
    log_error_ratio,
    mean_std,
    near,
    near_v1,
    stats,
    t_quantile,
    welch_df,
)

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "reproduce" / "v1" / "results"


def test_t_quantiles_are_the_tables():
    assert t_quantile(0.975, 2) == pytest.approx(4.303, abs=5e-4)
    assert t_quantile(0.95, 4) == pytest.approx(2.132, abs=5e-4)
    assert t_quantile(0.975, 1e9) == pytest.approx(1.960, abs=5e-4)


def test_two_standard_errors_cover_82_to_88_percent_with_3_seeds():
    # v1's d +- 2 se: with 3 seeds per arm the Welch df is between 2 and 4
    cover = {df: sps.t.cdf(2, df) - sps.t.cdf(-2, df) for df in (2, 4)}
    assert 0.81 < cover[2] < 0.82 and 0.88 < cover[4] < 0.89


def test_welch_df():
    assert welch_df(1.0, 3, 1.0, 3) == pytest.approx(4.0)  # equal variances and sizes: n_a + n_b - 2
    assert welch_df(1.0, 3, 4.0, 3) == pytest.approx(50 / 17)  # (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2)
    assert welch_df(1.0, 3, 0.0, 5) == pytest.approx(2.0)  # one arm without spread: the other's n - 1


def test_intervals_match_scipy():
    a, b = [0.81, 0.84, 0.86, 0.80], [0.78, 0.80, 0.79, 0.77]
    lo, hi = estimate(a, b, paired=False).interval(0.95)
    ref = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ref.low, ref.high), rel=1e-9)
    lo, hi = estimate(a, b, paired=True).interval(0.90)
    ref = sps.ttest_rel(a, b).confidence_interval(0.90)
    assert (lo, hi) == pytest.approx((ref.low, ref.high), rel=1e-9)
    est = estimate(a, 0.8, paired=False)
    ref = sps.ttest_1samp(a, 0.8).confidence_interval(0.95)
    assert est.interval(0.95) == pytest.approx((ref.low - 0.8, ref.high - 0.8), rel=1e-9) and est.df == 3


def test_interval_v1_reproduced_welch_t_inconclusive():
    a, b = [0.82, 0.84, 0.86], [0.78, 0.80, 0.82]  # d = 4 points, se = 1.63: d / se = 2.45, between 2 and t(4) = 2.78
    assert greater_v1(a, b, 0.0).status == REPRODUCED
    v2 = greater(a, b, margin=0.0, paired=False, what="a - b")
    assert v2.status == INCONCLUSIVE
    assert "Welch t, df 4" in v2.detail and "95% CI [-0.534, +8.53] points" in v2.detail


def test_paired_interval_uses_the_seeds_shared_data():
    # seeds move both arms together (their data): the differences are tight though each arm spreads by 10 points
    a, b = [0.70, 0.80, 0.90], [0.68, 0.785, 0.88]
    assert greater(a, b, margin=0.0, paired=False, what="a - b").status == INCONCLUSIVE
    paired = greater(a, b, margin=0.0, paired=True, what="a - b")
    assert paired.status == REPRODUCED and "seed-paired t, df 2" in paired.detail
    with pytest.raises(VitlabError, match="one value per seed"):
        greater(a, b[:2], margin=0.0, paired=True, what="a - b")


def test_equivalence_v1_reproduced_tost_inconclusive():
    a, b = [0.70, 0.80, 0.90], [0.72, 0.78, 0.86]  # |d| = 1.3 points <= 3, but the arms spread by 8-10 points
    assert close_v1(a, b, TOL).status == REPRODUCED
    assert close(a, b, tol=TOL, paired=False, what="a - b").status == INCONCLUSIVE


def test_equivalence_tost_decides_both_ways_when_the_interval_is_tight():
    a = [0.800, 0.802, 0.798]
    assert close(a, [0.790, 0.792, 0.788], tol=0.03, paired=False, what="d").status == REPRODUCED  # 90% CI in +-3
    far = close(a, [0.700, 0.702, 0.698], tol=0.03, paired=False, what="d")  # 10 points apart, 95% CI beyond 3
    assert far.status == NOT_REPRODUCED
    # inside +-tol, but its 90% interval reaches past tol: TOST is not reproduced, and not refuted either
    edge = close([0.83, 0.80, 0.86], [0.80, 0.80, 0.80], tol=0.03, paired=False, what="d")
    assert edge.status == INCONCLUSIVE


def test_equivalence_floor_nothing_learned():
    v = close([0.10, 0.11, 0.10], [0.10, 0.10, 0.11], tol=0.03, paired=False, what="d", floor=0.13)
    assert v.status == INCONCLUSIVE and "neither arm reaches 13.0%" in v.detail


def test_stated_margin_decides_differently_from_the_passed_zero():
    # v1's header states MARGIN = 3 points for "clearly"; its claims passed margin 0. A tight 1.5-point lead:
    a, b = [0.815, 0.816, 0.814], [0.800, 0.801, 0.799]
    assert greater_v1(a, b, 0.0).status == REPRODUCED  # what the code passed
    assert greater_v1(a, b, MARGIN).status == NOT_REPRODUCED  # what its header said
    stated = greater(a, b, margin=MARGIN, paired=False, what="a - b")
    assert stated.status == NOT_REPRODUCED and "needed above 3.0 points" in stated.detail
    assert greater(a, b, margin=0.0, paired=False, what="a - b").status == REPRODUCED


def test_v2_rules_take_every_margin_explicitly():
    a, b = [0.8, 0.81, 0.82], [0.7, 0.71, 0.72]
    with pytest.raises(TypeError):
        greater(a, b, 0.0, what="a - b")  # v1's positional margin: refused, never silently re-read
    with pytest.raises(TypeError):
        greater(a, b, paired=False, what="a - b")  # no margin: refused
    with pytest.raises(TypeError):
        close(a, b, paired=False, what="a - b")  # no tol
    with pytest.raises(TypeError):
        Rule("greater", 0.0)  # no pairing
    with pytest.raises(VitlabError, match="against a number use at_least"):
        greater(a, 0.5, margin=0.0, paired=False, what="a - b")


def test_rule_text_states_the_arguments_it_decides_by():
    r = Rule("greater", 0.03, True)
    assert r.text().startswith("greater, margin 3.0 points: reproduced if the 95% seed-paired t-interval")
    assert "Welch t-interval" in Rule("greater", 0.0, False).text()
    assert "margin 0.1 cosine" in Rule("greater", 0.1, False, unit="cosine").text()
    c = Rule("close", 0.03, False, floor=0.13).text()
    assert "tol 3.0 points (TOST)" in c and "90% Welch t-interval" in c and "95% one lies outside" in c
    assert "neither arm reaches 13.0%" in c
    assert (
        "99% one" in Rule("close", 0.03, False, level=0.99).text()
        and "98% Welch" in Rule("close", 0.03, False, level=0.99).text()
    )
    assert Rule("at_least", 0.95, False).text().startswith("at least 95.0%: reproduced if the 95% t-interval")
    assert Rule("near", 0.05, False, target=0.5).text().startswith("within 5.0 points of 50.0% (TOST)")
    # the rule decides by what its text says: the same object does both
    a, b = [0.82, 0.83, 0.84], [0.78, 0.79, 0.80]
    assert r.decide(a, b, what="d").status == greater(a, b, margin=0.03, paired=True, what="d").status
    with pytest.raises(VitlabError, match="one-sample"):
        Rule("at_least", 0.95, True)
    with pytest.raises(VitlabError, match="target"):
        Rule("near", 0.05, False)


def test_one_sample_rules():
    assert at_least([1.0, 1.0, 1.0], threshold=0.95, what="acc").status == REPRODUCED  # no spread: the point
    # mean 96% >= 95% (v1 reproduced), but its t-interval reaches below 95%
    wide = [0.93, 0.96, 0.99]
    assert at_least_v1(wide, 0.95).status == REPRODUCED
    assert at_least(wide, threshold=0.95, what="acc").status == INCONCLUSIVE
    assert at_least([0.80, 0.81, 0.79], threshold=0.95, what="acc").status == NOT_REPRODUCED
    assert near([0.50, 0.51, 0.49], target=0.5, tol=0.05, what="acc").status == REPRODUCED
    noisy = [0.40, 0.55, 0.65]  # mean 53.3%, within 5 of 50 (v1 reproduced); TOST inconclusive
    assert near_v1(noisy, 0.5, 0.05).status == REPRODUCED
    assert near(noisy, target=0.5, tol=0.05, what="acc").status == INCONCLUSIVE
    assert near([0.70, 0.71, 0.69], target=0.5, tol=0.05, what="acc").status == NOT_REPRODUCED


def test_fewer_than_two_seeds_is_inconclusive():
    assert greater([0.9], [0.1], margin=0.0, paired=False, what="d").status == INCONCLUSIVE
    assert close([0.9], [0.9], tol=0.03, paired=True, what="d").status == INCONCLUSIVE
    assert at_least([0.99], threshold=0.95, what="acc").status == INCONCLUSIVE


def test_ratio_scale_points_say_the_gap_shrinks_the_error_ratio_says_it_grows():
    vit_small, vit_large = [0.750, 0.745, 0.755], [0.884, 0.882, 0.886]
    cnn_small = [v + g for v, g in zip(vit_small, (0.070, 0.068, 0.072))]  # CNN ahead by 7 points at small N
    cnn_large = [v + g for v, g in zip(vit_large, (0.048, 0.047, 0.049))]  # and by 4.8 at large N
    gap_small = [c - v for c, v in zip(cnn_small, vit_small)]
    gap_large = [c - v for c, v in zip(cnn_large, vit_large)]
    assert greater_v1(gap_small, gap_large, 0.0).status == REPRODUCED  # in points the lead shrinks
    assert greater(gap_small, gap_large, margin=0.0, paired=True, what="gap").status == REPRODUCED
    # in errors: 25% vs 18% (1.39x) at small N, 11.6% vs 6.8% (1.71x) at large N: the ViT's excess grows
    r_small, r_large = log_error_ratio(vit_small, cnn_small), log_error_ratio(vit_large, cnn_large)
    assert math.exp(stats(r_small)[0]) == pytest.approx(1.39, abs=0.01)
    assert math.exp(stats(r_large)[0]) == pytest.approx(1.71, abs=0.01)
    v = gap_shrinks(vit_small, cnn_small, vit_large, cnn_large, margin=0.0, paired=True, what="r_small - r_large")
    assert v.status == NOT_REPRODUCED and "log error ratio" in v.detail
    with pytest.raises(VitlabError, match=r"in \[0, 1\)"):
        log_error_ratio([1.0, 0.9], [0.9, 0.9])


def test_combine_and_mean_std():
    r = greater([0.9, 0.91], [0.1, 0.11], margin=0.0, paired=False, what="d")
    assert combine(r, r).status == REPRODUCED
    nr = greater([0.1, 0.11], [0.9, 0.91], margin=0.0, paired=False, what="d")
    assert combine(r, nr).status == NOT_REPRODUCED
    assert combine(r, greater([0.9], [0.1], margin=0.0, paired=False, what="d")).status == INCONCLUSIVE
    assert mean_std([0.5, 0.7]) == "60.0 +- 14.1" and mean_std([0.5]) == "50.0" and mean_std([]) == "n/a"


def _csv(name: str) -> list[dict]:
    with open(RESULTS / name, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(not (RESULTS / "verdicts.csv").exists(), reason="no committed report in docs/reproduce")
def test_v1_gives_the_committed_reports_claim5_verdict():
    rows = _csv("claim5_data_scale.csv")
    acc = {}
    for r in rows:
        acc.setdefault((r["model"], int(r["n_train"])), []).append(float(r["val_acc"]))
    ns = sorted({n for _, n in acc})
    small, large = ns[0], ns[-1]
    gap = {n: [c - v for c, v in zip(acc[("resnet_mini", n)], acc[("vit_mini", n)])] for n in (small, large)}
    v1 = combine(
        greater_v1(acc[("resnet_mini", small)], acc[("vit_mini", small)], 0.0, what=f"CNN - ViT at N={small:,}"),
        greater_v1(gap[small], gap[large], 0.0, what=f"gap (CNN - ViT) at N={small:,} minus gap at N={large:,}"),
    )
    assert v1.detail in (RESULTS / "verdicts.csv").read_text()


def test_a_tolerance_relative_to_a_measured_effect():
    rule = Rule("close", 1 / 3, paired=True, relative_to="the effect E0")
    assert "tol 0.333 E" in rule.text() and "where E is the effect E0" in rule.text()
    with pytest.raises(VitlabError, match="scaled"):
        rule.decide([0.5, 0.6], [0.5, 0.6], what="d")
    at = rule.scaled(0.06)  # a 6-point effect: a 2-point tolerance
    assert at.bound == pytest.approx(0.02) and at.relative_to is None and "tol 2.0 points" in at.text()
    a, b = [0.80, 0.81, 0.82], [0.79, 0.80, 0.81]  # 1 point apart on every seed
    assert at.decide(a, b, what="d").status == REPRODUCED
    assert rule.scaled(0.015).decide(a, b, what="d").status == NOT_REPRODUCED  # tol 0.5 points
    assert rule.scaled(-0.05).bound == 0.0  # no effect: no tolerance
    with pytest.raises(VitlabError, match="relative_to"):
        Rule("greater", 0.0, paired=True, relative_to="x")
