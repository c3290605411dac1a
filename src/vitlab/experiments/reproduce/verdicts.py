"""The verdict rules of `vitlab reproduce`: comparisons of per-seed numbers that say "reproduced", "not
reproduced at this scale" or "inconclusive", their text, and the mean +- std text of the report's tables.

Two sets of rules live here, and the report shows both.

v1 (`greater_v1`, `close_v1`, `at_least_v1`, `near_v1`) decided the v1 report. Its block below is kept as
it was written, and it says less than the truth about itself:
  - it calls itself "fixed before any experiment was run", but it was amended once after a full run had been seen
    (`close`'s `floor`: two arms that both stay at chance are inconclusive); the claims' history (history.json)
    records that and every later change to a claim;
  - it says "MARGIN = TOL = 3 points", but only the tolerance of `close` is 3 points: after 2026-11-30 no claim
    passes MARGIN to `greater` (claim 2 did until its margin became 0, after a report had shown "not reproduced"
    under it); every `greater` passes margin 0, but claim 8's second part (0.1 cosine); MARGIN survives as the
    offset of `close`'s chance floor;
  - its interval d +- 2 se is no 95% interval with 3 seeds: the difference of two 3-seed means has 2-4 degrees of
    freedom (Welch), and 2 se covers 82-88% of the time, not 95%;
  - its `close` says "reproduced" whenever |d| <= tol, however wide the interval: not an equivalence test.

v2 (`Rule`; `greater`, `close`, `at_least`, `near`, `gap_shrinks`) was written on 2026-12-03, after v1's verdicts
of the v1 report had been seen: it is a change made after the results, and is on the record as one. Its
rules are stated in full by `Rule.text()`, from the same fields that decide, and take every margin, tolerance and
pairing as an explicit argument:
  - intervals are Student-t intervals at a stated level, d +- t_{(1 + level)/2, df} se: Welch's (se^2 = s_a^2/n_a +
    s_b^2/n_b, Welch-Satterthwaite df) for independent arms, or seed-paired (the per-seed differences, df = n - 1)
    where the two arms share each seed's data;
  - `greater`: reproduced if the level-interval of a - b lies above the margin, not reproduced if it lies below;
  - `close`: two one-sided tests (TOST): reproduced if the (2 level - 1)-interval (90% at level 95%) lies inside
    [-tol, +tol], not reproduced if the level-interval lies outside it, inconclusive otherwise;
  - `at_least` / `near`: the one-sample versions (t-interval of the mean, df = n - 1);
  - `gap_shrinks`: a gap between two models compared on the error-ratio scale, log(err_a / err_b) per seed, which
    a ceiling does not squeeze (a 2-point lead at 95% accuracy is a larger one than at 75%).
A claim with several parts is reproduced if every part is, not reproduced if any part is (`combine`, both sets).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import t as student_t

from vitlab.errors import VitlabError

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced at this scale", "inconclusive"


@dataclass(frozen=True)
class Part:
    """One decided comparison of a verdict, as numbers: the contrast `d` (a - b, or the mean less the rule's origin),
    its interval at the rule's level [`lo`, `hi`], the rule (`rule`: its name; `bound`: its margin or tolerance, or
    None where it has none to move against: a threshold, or a count), seeds `n`, and the part's status. What the
    budget check (`budgetcheck`) and the leave-one-seed-out test read; nan where a part was decided without one."""

    what: str
    status: str
    rule: str = ""
    d: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    bound: float | None = None
    n: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Verdict:
    status: str
    detail: str
    # The decided comparisons, in order (one for a rule's verdict; combine's lists its parts'); empty where a verdict
    # was written by hand.
    parts: tuple[Part, ...] = ()

    def to_dict(self) -> dict:
        return {"status": self.status, "detail": self.detail}

    def part_list(self) -> tuple[Part, ...]:
        """The parts, or the verdict itself as one part without numbers where none were recorded."""
        return self.parts or (Part(self.detail, self.status),)


def combine(*parts: Verdict) -> Verdict:
    """A claim of several parts: reproduced if every part is, not reproduced if any part is, else inconclusive."""
    detail = "; ".join(f"({i + 1}) {p.status}: {p.detail}" for i, p in enumerate(parts))
    statuses = [p.status for p in parts]
    numbers = tuple(q for p in parts for q in p.part_list())
    if NOT_REPRODUCED in statuses:
        return Verdict(NOT_REPRODUCED, detail, numbers)
    if all(s == REPRODUCED for s in statuses):
        return Verdict(REPRODUCED, detail, numbers)
    return Verdict(INCONCLUSIVE, detail, numbers)


def stats(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample std, n); std is nan for a single value."""
    v = [float(x) for x in values]
    if not v:
        return float("nan"), float("nan"), 0
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else float("nan")), len(v)


def mean_std(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
    """ "mean +- std" of `values` times `scale` (accuracies in %), or the one value."""
    m, s, n = stats(values)
    if n == 0:
        return "n/a"
    return f"{scale * m:.{digits}f} +- {scale * s:.{digits}f}" if n > 1 else f"{scale * m:.{digits}f}"


def _num(x: float, unit: str) -> str:
    """A signed difference: fractions in points, anything else in its unit."""
    if not math.isfinite(x):
        return "n/a"
    return f"{100 * x:+.1f} points" if unit == "points" else f"{x:+.3g} {unit}"


# ====================================================================================================
# v1: the rules of the v1 report, as written (see the module docstring for what its header gets wrong)
# ----------------------------------------------------------------------------------------------------
# VERDICT RULES. Fixed before any experiment was run; never tuned to a result.
#
# Every comparison uses the mean over seeds and se = sqrt(var_a/n_a + var_b/n_b) (sample variances),
# and the interval d +- 2 se of the difference d. With fewer than 2 seeds there is no se: inconclusive.
#   greater(a, b, margin)  "a beats b (clearly, by >= margin)":
#       reproduced      if d - 2se > 0 and d >= margin
#       not reproduced  if d + 2se < margin  (confidently less than the claimed advantage)
#       inconclusive    otherwise
#   close(a, b, tol)       "a and b are about equal":
#       reproduced      if |d| <= tol
#       not reproduced  if |d| - 2se > tol   (confidently further apart than tol)
#       inconclusive    otherwise, or when both arms stay below chance + MARGIN (nothing was learned)
#   at_least(a, t) / near(a, t, tol): the one-sample versions (mean >= t; |mean - t| <= tol).
#   A claim with several parts is reproduced if every part is, not reproduced if any part is not.
# The scale of "clearly" and "about equal" comes from the paper's own Table 8: having a position
# embedding is worth ~3 points and the choice among them ~0.2 points, so MARGIN = TOL = 3 points.

MARGIN = 0.03
TOL = 0.03


def _diff_v1(a: Sequence[float], b: Sequence[float] | float) -> tuple[float, float, bool]:
    """Difference of means, its standard error, and whether there are enough seeds for one."""
    ma, sa, na = stats(a)
    if isinstance(b, (int, float)):
        mb, var_b, ok_b = float(b), 0.0, True
    else:
        mb, sb, nb = stats(b)
        var_b, ok_b = (sb**2 / nb if nb > 1 else float("nan")), nb > 1
    ok = na > 1 and ok_b
    se = math.sqrt(sa**2 / na + var_b) if ok else float("nan")
    return ma - mb, se, ok


def _interval_v1(d: float, se: float, unit: str) -> str:
    two_se = 2 * se * (100 if unit == "points" else 1)
    return f"{_num(d, unit)} (2 se = {two_se:.3g})"


def greater_v1(
    a: Sequence[float], b: Sequence[float] | float, margin: float = 0.0, *, what: str = "a - b", unit: str = "points"
) -> Verdict:
    """v1's "a beats b by at least `margin`" (see VERDICT RULES). Accuracies are fractions, shown in points."""
    d, se, ok = _diff_v1(a, b)
    text = f"{what} = {_interval_v1(d, se, unit)}, needed > 0 and >= {_num(margin, unit).lstrip('+')}"
    if not ok:
        return Verdict(INCONCLUSIVE, text + "; fewer than 2 seeds")
    if d - 2 * se > 0 and d >= margin:
        return Verdict(REPRODUCED, text)
    if d + 2 * se < margin:
        return Verdict(NOT_REPRODUCED, text)
    return Verdict(INCONCLUSIVE, text)


def close_v1(
    a: Sequence[float],
    b: Sequence[float] | float,
    tol: float = TOL,
    *,
    what: str = "a - b",
    unit: str = "points",
    floor: float | None = None,
) -> Verdict:
    """v1's "a and b are about equal (within `tol`)" (see VERDICT RULES). With `floor` (chance + MARGIN),
    two arms that both stay below it learned nothing, and their equality says nothing: inconclusive."""
    d, se, ok = _diff_v1(a, b)
    text = f"{what} = {_interval_v1(d, se, unit)}, needed |d| <= {_num(tol, unit).lstrip('+')}"
    if not ok:
        return Verdict(INCONCLUSIVE, text + "; fewer than 2 seeds")
    if floor is not None and max(stats(a)[0], stats(b)[0] if not isinstance(b, (int, float)) else b) < floor:
        return Verdict(
            INCONCLUSIVE,
            text + f"; but neither arm reaches {100 * floor:.0f}% (chance + 3): nothing learned to compare",
        )
    if abs(d) <= tol:
        return Verdict(REPRODUCED, text)
    if abs(d) - 2 * se > tol:
        return Verdict(NOT_REPRODUCED, text)
    return Verdict(INCONCLUSIVE, text)


def at_least_v1(a: Sequence[float], threshold: float, *, what: str = "mean") -> Verdict:
    """v1's "the mean of a reaches `threshold`": reproduced if it does, not reproduced if mean + 2se < threshold."""
    m, s, n = stats(a)
    two_se = 200 * s / math.sqrt(n) if n > 1 else float("nan")
    text = f"{what} = {100 * m:.1f}% (+- {two_se:.1f}), needed >= {100 * threshold:.0f}%"
    if n < 2:
        return Verdict(INCONCLUSIVE, text + "; fewer than 2 seeds")
    if m >= threshold:
        return Verdict(REPRODUCED, text)
    if m + 2 * s / math.sqrt(n) < threshold:
        return Verdict(NOT_REPRODUCED, text)
    return Verdict(INCONCLUSIVE, text)


def near_v1(a: Sequence[float], target: float, tol: float, *, what: str = "mean") -> Verdict:
    """v1's "the mean of a is within `tol` of `target`" (the one-sample `close_v1`)."""
    return close_v1(a, target, tol, what=what)


# ====================================================================================================
# v2: t-intervals at a stated level, equivalence by TOST, every margin explicit (2026-12-03, after v1's results)

LEVEL = 0.95  # the two-sided level of every v2 "confidently" interval; TOST's inner interval is 2 * LEVEL - 1 (90%)


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (t_{0.975, 2} = 4.303)."""
    return float(student_t.ppf(p, df))


@dataclass(frozen=True)
class Estimate:
    """A difference of means (or a mean less a target), its standard error and degrees of freedom, and how they were
    computed ("Welch t", "seed-paired t", "one-sample t")."""

    d: float
    se: float
    df: float
    n: int  # seeds in the smaller arm (the pairs, for a paired estimate)
    method: str

    def interval(self, level: float) -> tuple[float, float]:
        """The two-sided `level` t-interval d +- t_{(1 + level)/2, df} se."""
        if self.se == 0:  # every seed gave the same difference: the interval is the point
            return self.d, self.d
        half = t_quantile((1 + level) / 2, self.df) * self.se
        return self.d - half, self.d + half


def welch_df(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """Welch-Satterthwaite degrees of freedom of a difference of two means with sample variances var_a, var_b."""
    qa, qb = var_a / n_a, var_b / n_b
    if qa + qb == 0:
        return float(n_a + n_b - 2)  # no spread at all: the df does not matter (se = 0)
    return (qa + qb) ** 2 / (qa**2 / (n_a - 1) + qb**2 / (n_b - 1))


def estimate(a: Sequence[float], b: Sequence[float] | float, *, paired: bool) -> Estimate | None:
    """a - b with its t statistics; None with fewer than 2 seeds. `b` a number: the one-sample estimate of
    mean(a) - b. `paired`: the arms share each seed's data, so the per-seed differences a_i - b_i are the sample."""
    if isinstance(b, (int, float)):
        m, s, n = stats(a)
        return Estimate(m - float(b), s / math.sqrt(n), n - 1, n, "one-sample t") if n > 1 else None
    if paired:
        if len(a) != len(b):
            raise VitlabError(f"paired: both arms need one value per seed; found {len(a)} and {len(b)}", arg="paired")
        m, s, n = stats([x - y for x, y in zip(a, b)])
        return Estimate(m, s / math.sqrt(n), n - 1, n, "seed-paired t") if n > 1 else None
    (ma, sa, na), (mb, sb, nb) = stats(a), stats(b)
    if na < 2 or nb < 2:
        return None
    se = math.sqrt(sa**2 / na + sb**2 / nb)
    return Estimate(ma - mb, se, welch_df(sa**2, na, sb**2, nb), min(na, nb), "Welch t")


def _amount(x: float, unit: str) -> str:
    """An unsigned size (a margin, a tolerance): fractions in points."""
    return f"{100 * x:.1f} points" if unit == "points" else f"{x:g} {unit}"


def _value(x: float, unit: str) -> str:
    """A level (a threshold, a target, a mean): fractions in %."""
    return f"{100 * x:.1f}%" if unit == "points" else f"{x:.3g} {unit}"


def _ci(lo: float, hi: float, level: float, unit: str) -> str:
    scale, end = (100, " points") if unit == "points" else (1, f" {unit}")
    return f"{100 * level:g}% CI [{scale * lo:+.3g}, {scale * hi:+.3g}]{end}"


RULES = ("greater", "close", "at_least", "near")


@dataclass(frozen=True)
class Rule:
    """One v2 rule as data. `bound`: greater's margin, close's and near's tolerance, at_least's threshold; `target`:
    near's; `paired`: the two-sample rules' interval (seed-paired, else Welch); `level`: the two-sided level of the
    interval that decides "confidently"; `floor`: close's chance floor (both arms below it: inconclusive);
    `relative_to`: close's tolerance as a fraction (`bound`) of a quantity measured in the same results, named here
    (`scaled` makes the rule at its measured value, and decides). `text()` is the rule as the report prints it,
    `decide` applies it."""

    name: str
    bound: float
    paired: bool
    level: float = LEVEL
    unit: str = "points"
    target: float | None = None
    floor: float | None = None
    relative_to: str | None = None

    def __post_init__(self) -> None:
        if self.name not in RULES:
            raise VitlabError(f"name must be one of {', '.join(RULES)}; found {self.name!r}", arg="name")
        if not 0.5 < self.level < 1:
            raise VitlabError(f"level must be in (0.5, 1); found {self.level}", arg="level")
        if self.name in ("close", "near") and not self.bound >= 0:
            raise VitlabError(f"tol must be >= 0; found {self.bound}", arg="tol")
        if (self.name == "near") != (self.target is not None):
            raise VitlabError("target: near needs one and only near takes one", arg="target")
        if self.paired and self.name in ("at_least", "near"):
            raise VitlabError(f"paired: {self.name} is a one-sample rule; pass paired=False", arg="paired")
        if self.relative_to is not None and self.name != "close":
            raise VitlabError(f"relative_to: only close's tolerance can be relative; found {self.name}", arg="name")

    def scaled(self, reference: float) -> Rule:
        """The rule with its relative tolerance made absolute: `bound` times `reference` (the measured value of
        `relative_to`; below 0 counts as 0: no effect to be a fraction of)."""
        if self.relative_to is None:
            raise VitlabError("scaled: the rule's tolerance is not relative (relative_to is None)", arg="relative_to")
        return dataclasses.replace(self, bound=self.bound * max(float(reference), 0.0), relative_to=None)

    @property
    def tost_level(self) -> float:
        """The level of the interval TOST reads, 2 level - 1 (90% for 95%): inside +-tol, both one-sided tests
        (d > -tol, d < +tol) pass at (1 - level)."""
        return 2 * self.level - 1

    def _interval_name(self) -> str:
        if self.name in ("at_least", "near"):
            return "t-interval of the mean (df n-1)"
        return "seed-paired t-interval (per-seed differences, df n-1)" if self.paired else "Welch t-interval"

    def text(self) -> str:
        """The rule in words, with every number it decides by."""
        lv, tl, iv = f"{100 * self.level:g}%", f"{100 * self.tost_level:g}%", self._interval_name()
        if self.name == "greater":
            m = _amount(self.bound, self.unit)
            return (
                f"greater, margin {m}: reproduced if the {lv} {iv} of the difference lies above {m}, "
                "not reproduced if it lies below"
            )
        if self.name == "at_least":
            t = _value(self.bound, self.unit)
            return f"at least {t}: reproduced if the {lv} {iv} lies at or above {t}, not reproduced if it lies below"
        tol = _amount(self.bound, self.unit)
        relative = ""
        if self.relative_to is not None:
            tol, relative = f"{self.bound:.3g} E", f", where E is {self.relative_to}"
        if self.name == "near":
            return (
                f"within {tol} of {_value(self.target, self.unit)} (TOST): reproduced if the {tl} {iv}, less "
                f"{_value(self.target, self.unit)}, lies inside +-{tol}, not reproduced if the {lv} one lies outside"
            )
        floor = (
            f"; inconclusive if neither arm reaches {_value(self.floor, self.unit)}" if self.floor is not None else ""
        )
        return (
            f"about equal, tol {tol} (TOST): reproduced if the {tl} {iv} of the difference lies inside +-{tol}, "
            f"not reproduced if the {lv} one lies outside{floor}{relative}"
        )

    def decide(self, a: Sequence[float], b: Sequence[float] | None = None, *, what: str) -> Verdict:
        """The verdict on `a` (and `b`, for greater and close; the one-sample rules take `a` alone), with its one
        `Part`."""
        v = self._decide(a, b, what=what)
        return dataclasses.replace(v, parts=(dataclasses.replace(v.parts[0], what=what, status=v.status),))

    def _decide(self, a: Sequence[float], b: Sequence[float] | None, *, what: str) -> Verdict:
        if self.relative_to is not None:
            raise VitlabError(f"decide: the tolerance is relative to {self.relative_to}; decide with scaled(value)")
        one_sample = self.name in ("at_least", "near")
        if one_sample and b is not None:
            raise VitlabError(f"b: {self.name} is a one-sample rule and takes no second arm", arg="b")
        if not one_sample and (b is None or isinstance(b, (int, float))):
            instead = "at_least" if self.name == "greater" else "near"
            raise VitlabError(
                f"b: {self.name} compares two arms of per-seed values; against a number use {instead}", arg="b"
            )
        # the one-sample rules compare the mean with a number: the threshold (at_least) or the target (near)
        origin = {"at_least": self.bound, "near": self.target}.get(self.name, 0.0)
        est = estimate(a, origin if one_sample else b, paired=self.paired)
        bound = None if self.name == "at_least" or (self.name == "greater" and self.bound == 0) else self.bound
        if est is None:
            return Verdict(INCONCLUSIVE, f"{what}: fewer than 2 seeds", (Part(what, INCONCLUSIVE, self.name),))
        lo, hi = est.interval(self.level)  # of the difference (one-sample: of mean - origin)
        part = (Part(what, "", self.name, est.d, lo, hi, bound, est.n),)
        method = f"{est.method}, df {est.df:.3g}"
        if self.name == "greater":
            text = f"{what} = {_num(est.d, self.unit)}, {_ci(lo, hi, self.level, self.unit)} ({method})"
            return Verdict(
                _above(lo, hi, self.bound, strict=True), f"{text}, needed above {_amount(self.bound, self.unit)}", part
            )
        if self.name == "at_least":
            mean_ci = f"{100 * self.level:g}% CI [{_value(lo + origin, self.unit)}, {_value(hi + origin, self.unit)}]"
            text = f"{what} = {_value(est.d + origin, self.unit)}, {mean_ci} ({method})"
            return Verdict(
                _above(lo, hi, 0.0, strict=False), f"{text}, needed at or above {_value(origin, self.unit)}", part
            )
        tlo, thi = est.interval(self.tost_level)
        head = f"{what} = {_num(est.d, self.unit)}"
        if self.name == "near":
            head = f"{what} = {_value(est.d + origin, self.unit)}"
            head += f", {_num(est.d, self.unit)} from {_value(origin, self.unit)}"
        tol = self.bound
        text = (
            f"{head}, {_ci(tlo, thi, self.tost_level, self.unit)}, {_ci(lo, hi, self.level, self.unit)} ({method}), "
            f"needed the {100 * self.tost_level:g}% one inside +-{_amount(tol, self.unit)}"
        )
        if self.floor is not None and max(stats(a)[0], stats(b)[0]) < self.floor:
            nothing = f"; but neither arm reaches {_value(self.floor, self.unit)}: nothing learned to compare"
            return Verdict(INCONCLUSIVE, text + nothing, part)
        if -tol <= tlo and thi <= tol:
            return Verdict(REPRODUCED, text, part)
        if lo > tol or hi < -tol:
            return Verdict(NOT_REPRODUCED, text, part)
        return Verdict(INCONCLUSIVE, text, part)


def _above(lo: float, hi: float, bound: float, *, strict: bool) -> str:
    """Reproduced if the interval [lo, hi] lies above `bound` (or at it, not strict), not reproduced if below."""
    if lo > bound or (not strict and lo >= bound):
        return REPRODUCED
    if hi < bound:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def greater(
    a: Sequence[float],
    b: Sequence[float],
    *,
    margin: float,
    paired: bool,
    what: str,
    unit: str = "points",
    level: float = LEVEL,
) -> Verdict:
    """ "a beats b by more than `margin`": the v2 rule `Rule("greater", margin, paired, level, unit)`."""
    return Rule("greater", margin, paired, level, unit).decide(a, b, what=what)


def close(
    a: Sequence[float],
    b: Sequence[float],
    *,
    tol: float,
    paired: bool,
    what: str,
    unit: str = "points",
    level: float = LEVEL,
    floor: float | None = None,
) -> Verdict:
    """ "a and b are about equal, within `tol`" by TOST: the v2 rule `Rule("close", tol, paired, ...)`."""
    return Rule("close", tol, paired, level, unit, floor=floor).decide(a, b, what=what)


def at_least(a: Sequence[float], *, threshold: float, what: str, unit: str = "points", level: float = LEVEL) -> Verdict:
    """ "the mean of a is at least `threshold`", on the t-interval of the mean."""
    return Rule("at_least", threshold, False, level, unit).decide(a, what=what)


def near(
    a: Sequence[float], *, target: float, tol: float, what: str, unit: str = "points", level: float = LEVEL
) -> Verdict:
    """ "the mean of a is within `tol` of `target`" by TOST on the t-interval of the mean."""
    return Rule("near", tol, False, level, unit, target=target).decide(a, what=what)


def log_error_ratio(acc_a: Sequence[float], acc_b: Sequence[float]) -> list[float]:
    """Per seed, log(err_a / err_b) with err = 1 - accuracy: how many times more errors `a` makes than `b`, on a scale
    the 100% ceiling does not squeeze (0: equal; log 2 = 0.69: twice the errors)."""
    if len(acc_a) != len(acc_b):
        raise VitlabError(
            f"acc_b: one accuracy per seed of acc_a ({len(acc_a)}) expected; found {len(acc_b)}", arg="acc_b"
        )
    out = []
    for x, y in zip(acc_a, acc_b):
        if not (0 <= x < 1 and 0 <= y < 1):
            raise VitlabError(f"accuracies must be in [0, 1) for an error ratio; found {x} and {y}", arg="acc_a")
        out.append(math.log((1 - x) / (1 - y)))
    return out


def gap_shrinks(
    a_small: Sequence[float],
    b_small: Sequence[float],
    a_large: Sequence[float],
    b_large: Sequence[float],
    *,
    margin: float,
    paired: bool,
    what: str,
    level: float = LEVEL,
) -> Verdict:
    """ "b's lead over a shrinks from the small data to the large", on the error-ratio scale: the per-seed
    r = log(err_a / err_b) at each size, and `greater` on r_small - r_large (margin in log units; `paired`: the two
    sizes share each seed's data, as nested training sets do)."""
    r_small, r_large = log_error_ratio(a_small, b_small), log_error_ratio(a_large, b_large)
    return greater(r_small, r_large, margin=margin, paired=paired, what=what, unit="log error ratio", level=level)
