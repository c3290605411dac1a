"""The verdict rules of `vitlab reproduce`: comparisons of per-seed numbers that say "reproduced", "not
reproduced at this scale" or "inconclusive", their text, and the mean +- std text of the report's tables.

The VERDICT RULES block below was fixed before any experiment was run, and is kept verbatim.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

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
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced at this scale", "inconclusive"


@dataclass
class Verdict:
    status: str
    detail: str

    def to_dict(self) -> dict:
        return {"status": self.status, "detail": self.detail}


def _stats(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample std, n); std is nan for a single value."""
    v = [float(x) for x in values]
    if not v:
        return float("nan"), float("nan"), 0
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else float("nan")), len(v)


def _diff(a: Sequence[float], b: Sequence[float] | float) -> tuple[float, float, bool]:
    """Difference of means, its standard error, and whether there are enough seeds for one."""
    ma, sa, na = _stats(a)
    if isinstance(b, (int, float)):
        mb, var_b, ok_b = float(b), 0.0, True
    else:
        mb, sb, nb = _stats(b)
        var_b, ok_b = (sb**2 / nb if nb > 1 else float("nan")), nb > 1
    ok = na > 1 and ok_b
    se = math.sqrt(sa**2 / na + var_b) if ok else float("nan")
    return ma - mb, se, ok


def _num(x: float, unit: str) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{100 * x:+.1f} points" if unit == "points" else f"{x:+.3g} {unit}"


def _interval(d: float, se: float, unit: str) -> str:
    two_se = 2 * se * (100 if unit == "points" else 1)
    return f"{_num(d, unit)} (2 se = {two_se:.3g})"


def greater(
    a: Sequence[float], b: Sequence[float] | float, margin: float = 0.0, *, what: str = "a - b", unit: str = "points"
) -> Verdict:
    """ "a beats b by at least `margin`" (see VERDICT RULES). Accuracies are fractions, shown in points."""
    d, se, ok = _diff(a, b)
    text = f"{what} = {_interval(d, se, unit)}, needed > 0 and >= {_num(margin, unit).lstrip('+')}"
    if not ok:
        return Verdict(INCONCLUSIVE, text + "; fewer than 2 seeds")
    if d - 2 * se > 0 and d >= margin:
        return Verdict(REPRODUCED, text)
    if d + 2 * se < margin:
        return Verdict(NOT_REPRODUCED, text)
    return Verdict(INCONCLUSIVE, text)


def close(
    a: Sequence[float],
    b: Sequence[float] | float,
    tol: float = TOL,
    *,
    what: str = "a - b",
    unit: str = "points",
    floor: float | None = None,
) -> Verdict:
    """ "a and b are about equal (within `tol`)" (see VERDICT RULES). With `floor` (chance + MARGIN),
    two arms that both stay below it learned nothing, and their equality says nothing: inconclusive."""
    d, se, ok = _diff(a, b)
    text = f"{what} = {_interval(d, se, unit)}, needed |d| <= {_num(tol, unit).lstrip('+')}"
    if not ok:
        return Verdict(INCONCLUSIVE, text + "; fewer than 2 seeds")
    if floor is not None and max(_stats(a)[0], _stats(b)[0] if not isinstance(b, (int, float)) else b) < floor:
        return Verdict(
            INCONCLUSIVE,
            text + f"; but neither arm reaches {100 * floor:.0f}% (chance + 3): nothing learned to compare",
        )
    if abs(d) <= tol:
        return Verdict(REPRODUCED, text)
    if abs(d) - 2 * se > tol:
        return Verdict(NOT_REPRODUCED, text)
    return Verdict(INCONCLUSIVE, text)


def at_least(a: Sequence[float], threshold: float, *, what: str = "mean") -> Verdict:
    """ "the mean of a reaches `threshold`": reproduced if it does, not reproduced if mean + 2se < threshold."""
    m, s, n = _stats(a)
    text = f"{what} = {100 * m:.1f}% (+- {200 * s / math.sqrt(n) if n > 1 else float('nan'):.1f}), needed >= {100 * threshold:.0f}%"
    if n < 2:
        return Verdict(INCONCLUSIVE, text + "; fewer than 2 seeds")
    if m >= threshold:
        return Verdict(REPRODUCED, text)
    if m + 2 * s / math.sqrt(n) < threshold:
        return Verdict(NOT_REPRODUCED, text)
    return Verdict(INCONCLUSIVE, text)


def near(a: Sequence[float], target: float, tol: float, *, what: str = "mean") -> Verdict:
    """ "the mean of a is within `tol` of `target`" (the one-sample `close`)."""
    return close(a, target, tol, what=what)


def combine(*parts: Verdict) -> Verdict:
    detail = "; ".join(f"({i + 1}) {p.status}: {p.detail}" for i, p in enumerate(parts))
    statuses = [p.status for p in parts]
    if NOT_REPRODUCED in statuses:
        return Verdict(NOT_REPRODUCED, detail)
    if all(s == REPRODUCED for s in statuses):
        return Verdict(REPRODUCED, detail)
    return Verdict(INCONCLUSIVE, detail)


def _ms(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
    m, s, n = _stats(values)
    if n == 0:
        return "n/a"
    return f"{scale * m:.{digits}f} +- {scale * s:.{digits}f}" if n > 1 else f"{scale * m:.{digits}f}"
