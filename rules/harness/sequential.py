"""The sequential design of a paired measurement: looks after pre-registered numbers of pairs,
alpha spent by a declared function, and the order-statistic interval valid at every look at once.

Pure functions of their arguments, stdlib only. It never decides a verdict: measure.py stops on
its `decide`, assess.py judges the interval `interval_at` gives at the look the run stopped at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DESIGNS = ("peto", "pocock", "obrien_fleming", "fixed")
# NB: a Haybittle-Peto-type design (peto): PETO_FIRST of alpha open from the first look, a
# further PETO_SHARE spent linearly over the interim looks, the rest at the last
PETO_FIRST, PETO_SHARE = 0.16, 0.1
REASONS = ("decided_gain", "decided_loss", "max_pairs")
METHOD = (
    "group-sequential sign-test interval: at the look after n pairs, the order statistics "
    "x(c), x(n-c+1) of the per-pair log ratios, c the largest index for which the exact chance "
    "(binomial random walk, p = 1/2) that any look so far misses the true median stays within "
    "the alpha the spending function allows by then; all looks together hold the true median "
    "with probability >= the confidence, whatever rule stopped the run"
)


def looks(pairs: int, first: int, every: int, design: str) -> list[int]:
    """The pair counts at which the rule looks: first, first + every, ... and always `pairs`
    (the only one of a fixed design)."""
    pairs, first, every = int(pairs), int(first), int(every)
    if pairs < 1 or first < 1 or every < 1:
        raise ValueError("pairs, first_look and look_every must be >= 1")
    if design not in DESIGNS:
        raise ValueError(f"sequential must be one of {', '.join(DESIGNS)}, not {design!r}")
    if design == "fixed":
        return [pairs]
    return sorted({n for n in range(first, pairs, every)} | {pairs})


def spent(design: str, t: float, alpha: float) -> float:
    """The alpha a design may have spent by information fraction t (pairs so far / all)."""
    t = min(max(float(t), 0.0), 1.0)
    if t <= 0.0:
        return 0.0
    if design == "fixed":
        return alpha if t >= 1.0 else 0.0
    if design == "peto":
        # NB: 16 % of alpha from the first look on: at 0.95 a decision after 8 pairs, all on
        # one side (exact miss chance 2 / 2^8 = 0.0078 <= 0.16 * 0.05; 0.2 * t, the design
        # before, first allowed it after 10); a tenth more, linearly, over the interim looks
        # (looks 10 and 12 keep c = 1, which costs nothing more: B(10) = 0 implies B(8) = 0);
        # the rest at the last, whose interval stays the fixed design's (on 30 pairs c = 10,
        # 0.0493 spent in all), so a run that goes the distance is judged exactly as before
        return alpha if t >= 1.0 else alpha * (PETO_FIRST + PETO_SHARE * t)
    if design == "pocock":  # Lan-DeMets Pocock-type: spends early, for early decisions
        return alpha * math.log(1.0 + (math.e - 1.0) * t)
    if design == "obrien_fleming":  # Lan-DeMets O'Brien-Fleming-type: keeps alpha for the end
        z = _norm_ppf(1.0 - alpha / 2.0)
        return 2.0 - 2.0 * _norm_cdf(z / math.sqrt(t))
    raise ValueError(f"unknown design {design!r}")


def _norm_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _norm_ppf(p: float) -> float:
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _norm_cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2.0


def plan(pairs: int, first: int, every: int, design: str, confidence: float) -> dict:
    """Per look: the pairs n, the order index c (0: no interval yet) and the alpha spent by then
    (exact, <= the spending function's allowance).

    B(n), the number of pairs below the true median, is a binomial random walk with p = 1/2
    for any continuous distribution; the look after n pairs misses the median when
    B(n) <= c - 1 or B(n) >= n - c + 1. The walk's law over paths that no earlier look stopped
    is carried from look to look, so the spent alpha is the exact chance that some look so far
    missed, and every c is the largest that keeps it within the allowance."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie in (0, 1)")
    alpha = 1.0 - float(confidence)
    at = looks(pairs, first, every, design)
    dist = [1.0]  # NB: dist[b] = P(B(n) = b and no look so far missed)
    done, total, out = 0, 0.0, []
    for n in at:
        for _ in range(n - done):
            nxt = [0.0] * (len(dist) + 1)
            for b, p in enumerate(dist):
                nxt[b] += p / 2.0
                nxt[b + 1] += p / 2.0
            dist = nxt
        done = n
        allowed = spent(design, n / at[-1], alpha) if design != "fixed" else alpha
        c, miss = 0, 0.0
        while c + 1 <= n // 2:
            # NB: c + 1 adds the outcomes B = c and B = n - c to the misses (once when equal)
            extra = dist[c] + (dist[n - c] if n - c != c else 0.0)
            if total + miss + extra > allowed * (1 + 1e-12):
                break
            c, miss = c + 1, miss + extra
        for b in range(c):
            dist[b] = 0.0
            dist[n - b] = 0.0
        total += miss
        out.append({"n": n, "c": c, "spent_alpha": total})
    return {
        "design": design,
        "confidence": float(confidence),
        "looks": out,
        "alpha_spent": total,
        "method": METHOD,
    }


def look_for(the_plan: dict, n_pairs: int) -> dict | None:
    """The last look at or before `n_pairs` complete pairs (None: before the first)."""
    done = [look for look in the_plan["looks"] if look["n"] <= n_pairs]
    return done[-1] if done else None


def interval_at(log_ratios: Sequence[float], look: dict) -> tuple[float, float] | None:
    """The look's interval (log scale) from its first `look['n']` pairs; None when the look
    may not decide yet (c = 0)."""
    n, c = int(look["n"]), int(look["c"])
    if c < 1 or len(log_ratios) < n:
        return None
    x = sorted(float(v) for v in log_ratios[:n])
    return x[c - 1], x[n - c]


def decide(
    lo: float, hi: float, stop_improvement: float, stop_loss: float | None = None
) -> str | None:
    """Why to stop at a valid look whose interval (log scale) is [lo, hi]: the whole interval
    above 1 + stop_improvement (a gain) or below 1 / (1 + stop_loss) (a loss; stop_loss None:
    stop_improvement's mirror); None: measure on.

    NB: the two bars need not mirror each other. A gain stopped too early may be judged
    INCONCLUSIVE once the assessment adds the run shift and noise floor, and a real gain is
    lost, so its bar keeps room above min_improvement for the shift and the floor; a loss
    stopped near the verdict's FAIL bar can at worst be judged INCONCLUSIVE instead of FAIL (a
    stop needs hi < 0, so never PASS), so its bar keeps room for the shift alone. The interval
    holds at every look whatever rule stops the run, so neither bar costs coverage."""
    bar = math.log1p(float(stop_improvement))
    loss_bar = bar if stop_loss is None else math.log1p(float(stop_loss))
    if lo > bar:
        return "decided_gain"
    if hi < -loss_bar:
        return "decided_loss"
    return None
