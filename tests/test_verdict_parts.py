"""A verdict's parts as numbers (what the budget check and the leave-one-seed-out test read), and the scales
that ask for their own seeds alone or leave one out."""

import math

from vitlab.experiments.reproduce.claims.base import Scale
from vitlab.experiments.reproduce.claims.shared import seeds_at
from vitlab.experiments.reproduce.verdicts import REPRODUCED, Rule, combine, estimate


def test_a_rule_records_its_contrast_interval_and_bound():
    a, b = [0.80, 0.82, 0.81], [0.70, 0.73, 0.71]
    v = Rule("greater", 0.02, paired=True).decide(a, b, what="a - b")
    (p,) = v.parts
    est = estimate(a, b, paired=True)
    assert v.status == REPRODUCED and p.status == REPRODUCED and p.what == "a - b"
    assert math.isclose(p.d, est.d) and (p.lo, p.hi) == est.interval(0.95)
    assert p.bound == 0.02 and p.n == 3 and p.rule == "greater"
    # no margin to move against: a threshold, or a margin of 0
    assert Rule("at_least", 0.5, paired=False).decide(a, what="a").parts[0].bound is None
    assert Rule("greater", 0.0, paired=True).decide(a, b, what="a - b").parts[0].bound is None


def test_combine_lists_every_part_in_order():
    a, b = [0.80, 0.82, 0.81], [0.70, 0.73, 0.71]
    v = combine(
        Rule("greater", 0.0, paired=True).decide(a, b, what="one"),
        Rule("close", 0.01, paired=True).decide(a, b, what="two"),
    )
    assert [p.what for p in v.parts] == ["one", "two"]
    assert [p.status for p in v.parts] == [REPRODUCED, "not reproduced at this scale"]


def test_seeds_at_keeps_the_scales_own_seeds_or_leaves_one_out():
    base = Scale("default", (0, 1, 2))
    assert seeds_at(1000, base) == (0, 1, 2, 3, 4) and seeds_at(4000, base) == (0, 1, 2)
    assert seeds_at(1000, Scale("default", (0, 1, 2), more_seeds=False)) == (0, 1, 2)
    # seed 2 left out: the 1,000-image arms keep their extension (3, 4), the others their two other seeds
    out = Scale("default", (0, 1), dropped=(2,))
    assert seeds_at(1000, out) == (0, 1, 3, 4) and seeds_at(4000, out) == (0, 1)
    assert seeds_at(1000, Scale("default", (0, 1, 2), dropped=(4,))) == (0, 1, 2, 3)
