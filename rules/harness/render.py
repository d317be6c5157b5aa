"""Render a verdict and its correctness evidence as the table people read (text only). It must never
change a verdict."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _fmt(x, spec: str = ".3g") -> str:
    return "null" if x is None else format(x, spec)


def _times(x) -> str:
    return "null" if x is None else f"{x:.3f}x"


def _pairs(n) -> str:
    return "none measured" if n is None else str(n)


def render(verdict: dict, check: dict) -> str:
    lines = [f"verdict: {verdict.get('verdict')}"]
    sp = verdict.get("speedup") or {}
    if sp:
        lines.append(
            f"speedup: {_fmt(sp.get('point'), '.3f')}x  "
            f"[{_fmt(sp.get('lo'), '.3f')}, {_fmt(sp.get('hi'), '.3f')}] at "
            f"{_fmt(sp.get('confidence'), '.0%')} ({sp.get('method')})"
        )
    else:
        lines.append("speedup: null")
    noise = verdict.get("noise_floor")
    delta = noise.get("delta") if isinstance(noise, dict) else noise
    lines.append(
        f"noise floor (A/A): {_fmt(delta, '.2%')}   "
        f"threshold: {_times(verdict.get('threshold'))}   "
        f"pairs: {_pairs(verdict.get('n_pairs'))}"
    )
    bw = verdict.get("bandwidth")
    if isinstance(bw, dict) and bw.get("achieved_gb_s") is not None:
        peak = (
            f"{_fmt(bw.get('fraction'), '.1%')} of peak {_fmt(bw.get('peak_gb_s'), '.0f')} GB/s"
            if bw.get("peak_gb_s")
            else "peak unknown"
        )
        lines.append(
            f"bandwidth: {_fmt(bw.get('achieved_gb_s'), '.1f')} GB/s ({peak}); "
            f"timing: {verdict.get('timing')}"
        )
    for r in verdict.get("reasons") or []:
        lines.append(f"reason: {r.get('code')}: {r.get('detail')}")
    lines.append("")
    lines.append(f"{'case':28} {'result':8} {'max abs err':>12} {'max rel err':>12}  reason")
    for case in check.get("cases") or []:
        lines.append(
            f"{case.get('name', '?'):28} {'pass' if case.get('passed') else 'FAIL':8} "
            f"{_fmt(case.get('max_abs_err')):>12} {_fmt(case.get('max_rel_err')):>12}  "
            f"{case.get('reason') or ''}"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--verdict", required=True, type=Path)
    ap.add_argument("--check", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    try:
        text = render(json.loads(args.verdict.read_text()), json.loads(args.check.read_text()))
        args.out.write_text(text)
    except (OSError, ValueError) as exc:
        print(f"rsi harness fault (render): {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
