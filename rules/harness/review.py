"""Independent review of a frozen candidate: what its source does, beside what its numbers say.

The referee judges behaviour (outputs, time); this step reads the candidate's source (and the
summary of its execution evidence) and looks for what a number cannot show:

- forbidden imports and calls: introspection of frames or the garbage collector, reading
  outside its scope, clock or process manipulation, threads beyond the binding, dynamic code;
- delegation to the baseline (importing it, or a copy of its computation) and an unchanged
  computation (the baseline's own code, renamed): no optimisation credit;
- special-casing of public shapes or seeds (the task's declared cases and workload).

Rules are the defaults below plus the task's declared `review` table (`forbid`, `allow`,
`reviewer`); an external reviewer command's output is evidence too and can only add findings.
A finding is `fail` or `inconclusive`; the review's verdict is the worst of them (`pass` when
there is none). An obfuscated form that cannot be resolved statically (`__import__` of a
computed name, `getattr` with a computed attribute, `eval`) is never a pass.

Stdlib only (`ast`): the candidate is parsed, never imported or run. Exit 2 only when the
review cannot be written (a harness fault); a candidate that cannot be parsed is a finding.
"""

from __future__ import annotations

import argparse
import importlib.util
import ast
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path


def _load_sibling(stem: str):
    path = Path(__file__).resolve().parent / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"_rsi_harness_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


A = _load_sibling("review_ast")
R = A.R
SCHEMA = R.SCHEMA
RANK = R.RANK


# ------------------------------------------------------------------------- the review


def public_context(spec: dict, rules: dict) -> dict:
    shapes, dims, seeds = set(), set(), set()

    def add_shape(shape) -> None:
        if isinstance(shape, list) and shape and all(isinstance(v, int) for v in shape):
            shapes.add(tuple(shape))
            dims.update(shape)

    for case in spec.get("cases") or []:
        if isinstance(case, dict):
            add_shape(case.get("shape"))
            if isinstance(case.get("seed"), int):
                seeds.add(case["seed"])
    measure = spec.get("measure") or {}
    workload = measure.get("workload") if isinstance(measure, dict) else None
    if isinstance(workload, dict):
        add_shape(workload.get("shape"))
    for value in (spec.get("seed"), measure.get("seed") if isinstance(measure, dict) else None):
        if isinstance(value, int):
            seeds.add(value)
    forbid = [str(f) for f in rules.get("forbid") or []]
    entry = spec.get("entry") or {}
    editable = [str(e) for e in spec.get("editable") or rules.get("editable") or []]
    return {
        "public_shapes": shapes,
        "public_dims": dims,
        "public_seeds": seeds,
        "threads": int(spec.get("threads") or 1),
        "allow": set(str(a) for a in rules.get("allow") or []),
        # NB: an entry forbids importing it (a module, or a name from one) and using it
        # (numpy.linalg.solve forbids the call; scipy.special the module and all in it)
        "forbid_modules": sorted(set(forbid)),
        "forbid_calls": sorted(set(forbid)),
        "entry": entry.get("function") or entry.get("class") or "",
        "own_modules": {Path(e).stem for e in editable},
        "runtime_modules": {"oracle", "workloads"},
        "baseline_names": {"baseline", *(str(b) for b in rules.get("baseline_names") or [])},
    }


def review_sources(cand_dir: Path, base_dir: Path | None, ctx: dict) -> tuple[list, dict]:
    findings, files = [], {}
    for path in sorted(p for p in cand_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(cand_dir).as_posix()
        data = path.read_bytes()
        files[rel] = hashlib.sha256(data).hexdigest()
        if not rel.endswith(".py"):
            continue
        try:
            tree = ast.parse(data, filename=rel)
        except (SyntaxError, ValueError) as exc:
            findings.append(
                R.finding(
                    "unparseable", "inconclusive", rel, getattr(exc, "lineno", 0) or 0, str(exc)
                )
            )
            continue
        walker = A.Reviewer(rel, ctx)
        walker.visit(tree)
        findings += walker.findings
        base_tree = None
        if base_dir is not None and (base_dir / rel).is_file():
            try:
                base_tree = ast.parse((base_dir / rel).read_bytes())
            except (SyntaxError, ValueError):
                base_tree = None
        if Path(rel).stem in ctx["own_modules"] and ctx["entry"]:
            for f in A.delegation(rel, tree, base_tree, ctx["entry"]):
                if f["rule"] not in ctx["allow"]:
                    findings.append(f)
    seen, unique = set(), []
    for f in findings:
        key = (f["rule"], f["file"], f["line"], f["detail"])
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, files


def run_reviewer(command: str, subst: dict, timeout: float) -> tuple[dict, list[dict]]:
    """The external reviewer: its argv, exit status and stdout digest are evidence; its
    JSON answer {verdict, findings} adds findings (it can never remove one)."""
    argv = [a.format(**subst) for a in shlex.split(command)]
    record: dict = {"argv": argv, "exit": None, "stdout_sha256": None, "verdict": None}
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        return record, [R.finding("reviewer_failed", "inconclusive", "", 0, record["error"])]
    record["exit"] = proc.returncode
    record["stdout_sha256"] = hashlib.sha256(proc.stdout).hexdigest()
    record["stderr_tail"] = proc.stderr.decode(errors="replace")[-2000:]
    try:
        answer = json.loads(proc.stdout.decode(errors="replace").strip().splitlines()[-1])
        verdict = answer["verdict"]
        if verdict not in RANK:
            raise ValueError(f"verdict {verdict!r} is not pass, fail or inconclusive")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        record["error"] = f"no answer: {type(exc).__name__}: {exc}"
        return record, [R.finding("reviewer_failed", "inconclusive", "", 0, record["error"])]
    if proc.returncode != 0:
        record["error"] = f"exited with {proc.returncode}"
        return record, [R.finding("reviewer_failed", "inconclusive", "", 0, record["error"])]
    record["verdict"] = verdict
    found = []
    for item in answer.get("findings") or []:
        if isinstance(item, dict):
            found.append(
                R.finding(
                    "reviewer",
                    item.get("severity")
                    if item.get("severity") in ("fail", "inconclusive")
                    else ("fail" if verdict == "fail" else "inconclusive"),
                    str(item.get("file") or ""),
                    int(item.get("line") or 0),
                    str(item.get("detail") or item.get("rule") or ""),
                )
            )
    if verdict != "pass" and not found:
        found.append(
            R.finding("reviewer", verdict, "", 0, f"the external reviewer answered {verdict}")
        )
    return record, found


def execution_summary(check: dict | None) -> dict | None:
    if check is None:
        return None
    return {
        "status": check.get("status"),
        "failure_kind": check.get("failure_kind"),
        "n_cases": check.get("n_cases"),
        "n_passed": check.get("n_passed"),
    }


def review(
    cand_dir: Path,
    base_dir: Path | None,
    spec: dict,
    rules: dict,
    check: dict | None = None,
    task_dir: str = ".",
) -> dict:
    ctx = public_context(spec, rules)
    findings, files = review_sources(cand_dir, base_dir, ctx)
    reviewer = None
    if rules.get("reviewer"):
        subst = {
            "candidate": str(cand_dir),
            "baseline": str(base_dir or ""),
            "task": task_dir,
            "python": sys.executable,
        }
        reviewer, more = run_reviewer(
            str(rules["reviewer"]), subst, float(rules.get("reviewer_timeout_s") or 300)
        )
        findings += more
    verdict = "pass"
    for f in findings:
        if RANK[f["severity"]] > RANK[verdict]:
            verdict = f["severity"]
    return {
        "schema": SCHEMA,
        "verdict": verdict,
        "findings": findings,
        "n_findings": len(findings),
        "rules": {
            "forbid": ctx["forbid_modules"],
            "allow": sorted(ctx["allow"]),
            "reviewer": rules.get("reviewer") or None,
            "threads": ctx["threads"],
            "public_shapes": sorted(list(s) for s in ctx["public_shapes"]),
        },
        "files": files,
        "execution": execution_summary(check),
        "reviewer": reviewer,
        "note": "a review inspects source; it never changes a verdict's numbers: a failed or "
        "inconclusive review only blocks acceptance (selection and the final)",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--task", required=True)
    ap.add_argument("--candidate", required=True, type=Path)
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--spec", required=True, type=Path)
    ap.add_argument("--rules", required=True, type=Path)
    ap.add_argument("--check", type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    try:
        spec = json.loads(args.spec.read_text())
        rules = json.loads(args.rules.read_text())
        check = json.loads(args.check.read_text()) if args.check else None
        doc = review(args.candidate, args.baseline, spec, rules, check, args.task)
        tmp = args.out.with_name(args.out.name + f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
        os.replace(tmp, args.out)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"rsi harness fault (review): {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
