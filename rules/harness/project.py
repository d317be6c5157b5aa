"""External-project harness: assemble a tree (frozen baseline + candidate overlay) in a fresh
scratch copy, run the project's own quality or benchmark command there, and judge its output.

Writes evidence in the task harness's schemas (rsi.check/1, rsi.measure/1, rsi.assess/1) so the
same assessment and rendering apply. Never imports `rsi` or `rules`. Exit 2 means a harness fault
(retryable); a command that fails, prints garbage or times out is the candidate's failure.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INFRA_EXIT = 2
MAX_KEPT_OUTPUT = 65536
# NB: a project whose spec env sets RSI_RESULT=file writes its result document to the file
# named by RSI_RESULT_FILE (a 0700 folder of this harness's) and its stdout is a log only: a
# process beside the command (a server) that reaches the command's stdout cannot forge it
RESULT_MODE_VAR = "RSI_RESULT"
RESULT_FILE_VAR = "RSI_RESULT_FILE"
MAX_RESULT_BYTES = 4 << 20


class HarnessError(Exception):
    """The evidence could not be produced for a reason that is not the candidate's."""


# ------------------------------------------------------------------------------------ helpers


def write_json(path: Path, doc) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)


def read_json(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HarnessError(f"cannot read JSON from {path}: {exc}") from exc


def derive_seed(*parts) -> int:
    text = json.dumps(parts, separators=(",", ":"), sort_keys=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def tree_digest(root: Path) -> tuple[str, list[str]]:
    """sha256 over the sorted (relative path, content) of every regular file (as _common.py)."""
    files = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    )
    h = hashlib.sha256(b"rsi-tree-v1\0")
    for rel in files:
        data = (root / rel).read_bytes()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest(), files


def _copy_tree(src: Path, dest: Path) -> None:
    """Copy a (read-only) input tree into a writable one; links are kept as links."""
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in dirnames:
            s = Path(dirpath) / name
            if s.is_symlink():
                os.symlink(os.readlink(s), dest / rel / name)
        for name in filenames:
            s = Path(dirpath) / name
            d = dest / rel / name
            if s.is_symlink():
                os.symlink(os.readlink(s), d)
                continue
            shutil.copyfile(s, d)
            os.chmod(d, 0o755 if os.access(s, os.X_OK) else 0o644)


def snapshot(root: Path) -> dict[str, tuple[str, bytes, bool]]:
    """A tree held in this process's memory: relative path -> (kind, content, executable),
    kind `file` or `link` (content: the link's target). Nothing on disk to rewrite."""
    out: dict[str, tuple[str, bytes, bool]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if rel != Path(".") and not dirnames and not filenames:
            out[(rel.as_posix()) + "/"] = ("dir", b"", False)
        for name in dirnames + filenames:
            s = Path(dirpath) / name
            key = (rel / name).as_posix()
            if s.is_symlink():
                out[key] = ("link", os.readlink(s).encode(), False)
            elif name in filenames:
                out[key] = ("file", s.read_bytes(), os.access(s, os.X_OK))
    return out


def materialise(tree: dict[str, tuple[str, bytes, bool]], dest: Path) -> None:
    """Write a snapshot out as a fresh, writable tree (a run's own copy)."""
    dest.mkdir(parents=True)
    for key in sorted(tree):
        kind, data, exe = tree[key]
        d = dest / key
        d.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            d.mkdir(exist_ok=True)
        elif kind == "link":
            os.symlink(data.decode(), d)
        else:
            d.write_bytes(data)
            os.chmod(d, 0o755 if exe else 0o644)


def make_non_dumpable() -> bool:
    """PR_SET_DUMPABLE 0: no process of this uid (a run's, a server's) can open this process's
    /proc/<pid>/mem or fds, where the pristine trees and the results are held."""
    try:
        return ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """PR_SET_CHILD_SUBREAPER: a helper a command started that left its session (setsid) and
    its parent is re-parented here, not to init, so it stays findable and is ended with the run."""
    global _SUBREAPER
    try:
        _SUBREAPER = ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _SUBREAPER = False
    return _SUBREAPER


# NB: only a subreaper ends what lies below it after a run: called in-process (tests), the
# harness must not kill its host's other children
_SUBREAPER = False


def _descendants() -> list[tuple[int, int]]:
    """(pid, process group) of every process below this one, by the parent links in /proc."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat_line = f.read()
        except OSError:
            continue
        # NB: the command name may hold spaces and parentheses: the fields follow the last ")"
        fields = stat_line[stat_line.rfind(b")") + 2 :].split()
        if len(fields) > 2:
            children.setdefault(int(fields[1]), []).append((int(entry), int(fields[2])))
    found, todo = [], [os.getpid()]
    while todo:
        for pid, group in children.get(todo.pop(), []):
            found.append((pid, group))
            todo.append(pid)
    return found


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def end_descendants(rounds: int = 20, group: int | None = None) -> list[int]:
    """SIGKILL whatever a run left below this process and reap it; returns the pids that had
    left the run's process group `group` (escaped: the group's SIGKILL could not reach them).
    A member of the group still dying of that SIGKILL, or a zombie re-parented here, is ended
    the same way but is not an escape."""
    escaped: list[int] = []
    if not _SUBREAPER:
        return escaped
    _reap()
    for _ in range(rounds):
        alive = _descendants()
        if not alive:
            break
        for pid, pgrp in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            if pgrp != group and pid not in escaped:
                escaped.append(pid)
        time.sleep(0.01)
        _reap()
    return escaped


def assemble(base: Path, overlay: Path | None, dest: Path) -> None:
    """The frozen baseline with the candidate's editable files laid over it."""
    dest.mkdir(parents=True)
    if base.is_dir():
        _copy_tree(base, dest)
    if overlay is not None:
        if not overlay.is_dir():
            raise HarnessError(f"candidate folder {overlay} does not exist")
        _copy_tree(overlay, dest)


def command_env(spec: dict, work: Path, seed: int, extra: dict | None = None) -> dict:
    home = work / "home"
    tmp = work / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    # NB: `python3` in a project command is the toolchain's interpreter, not whatever /usr has
    path = os.path.dirname(sys.executable) + ":/usr/bin:/bin"
    env = {
        "PATH": path,
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "RSI_SEED": str(seed),
    }
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    env.update(extra or {})
    return env


def run_command(cmd: str, cwd: Path, env: dict, timeout_s: float) -> dict:
    """Run `sh -c cmd` in its own session; the whole group dies on timeout or at the end."""
    out_path, err_path = cwd.parent / f".{cwd.name}.stdout", cwd.parent / f".{cwd.name}.stderr"
    t0 = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", cmd],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise HarnessError(f"cannot start /bin/sh: {exc}") from exc
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            # NB: a helper that called setsid left the group: as subreaper it is still ours
            escaped = end_descendants(group=proc.pid)
    wall = time.perf_counter() - t0
    stdout = out_path.read_bytes()
    stderr = err_path.read_bytes()
    out_path.unlink()
    err_path.unlink()
    tail = "\n".join(stderr.decode("utf-8", "replace").rstrip().splitlines()[-15:]) or None
    return {
        "exit_code": proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(wall, 6),
        "stdout": stdout.decode("utf-8", "replace"),
        "stderr_tail": tail,
        "escaped": escaped,
    }


def read_result(path: Path) -> str:
    """The result file's text (bounded), or "" when it is missing, not a regular file or too
    big: the run then has no samples, never a fallback to stdout."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        data = f.read(MAX_RESULT_BYTES + 1)
    return "" if len(data) > MAX_RESULT_BYTES else data.decode("utf-8", "replace")


def parse_json_output(text: str):
    """The whole stdout as JSON, else its last line that is a JSON object."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise ValueError("the output holds no JSON object")


def bench_output(text: str) -> dict | None:
    """What a benchmark run printed beside its samples, kept as the arm's evidence: the fields of
    a JSON object on stdout other than `samples` (latency percentiles, the engine's version, a
    server log tail), also when the run failed. Output over MAX_KEPT_OUTPUT is named, not kept."""
    try:
        doc = parse_json_output(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    fields = {k: v for k, v in doc.items() if k != "samples"}
    if not fields:
        return None
    size = len(json.dumps(fields, sort_keys=True))
    if size > MAX_KEPT_OUTPUT:
        return {"not_kept": f"{size} bytes of JSON, over {MAX_KEPT_OUTPUT}", "keys": sorted(fields)}
    return fields


def lookup(doc, dotted: str):
    cur = doc
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(dotted)
        cur = cur[part]
    return cur


def _is_samples_object(line: str) -> bool:
    try:
        doc = json.loads(line)
    except ValueError:
        return False
    return isinstance(doc, dict) and "samples" in doc


def parse_samples(text: str) -> list[float]:
    """A JSON list, a JSON object with `samples`, or one number per line (other lines ignored)."""
    stripped = text.strip()
    values = None
    try:
        doc = json.loads(stripped)
        if isinstance(doc, dict):
            doc = doc.get("samples")
        if isinstance(doc, list):
            values = doc
    except ValueError:
        pass
    if values is None and any(_is_samples_object(line) for line in stripped.splitlines()):
        # NB: a command that prints its samples as a JSON object owns its stdout: anything else
        # there (numbers or a second object, which another process could write through
        # /proc/<pid>/fd/1) is interference, never a fallback to numeric lines
        raise ValueError("stdout holds a samples object and other output; refusing to choose")
    if values is None:
        values = []
        for line in stripped.splitlines():
            try:
                values.append(float(line.strip()))
            except ValueError:
                continue
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"sample {v!r} is not a number")
        out.append(float(v))
    return out


def load_spec(path: Path) -> dict:
    spec = read_json(path)
    if not isinstance(spec, dict) or spec.get("schema") != "rsi.project.spec/1":
        raise HarnessError(f"{path} is not an rsi.project.spec/1 document")
    return spec


# ------------------------------------------------------------------------------------ quality


def quality(spec: dict, base: Path, overlay: Path | None, work: Path) -> dict:
    started = time.monotonic()
    tree = work / "tree"
    assemble(base, overlay, tree)
    digest, files = tree_digest(tree)
    q = spec["quality"]
    extra = {}
    result_dir = None
    if (spec.get("env") or {}).get(RESULT_MODE_VAR) == "file":
        result_dir = Path(tempfile.mkdtemp(prefix="result-quality-", dir=work))
        extra[RESULT_FILE_VAR] = str(result_dir / "result.json")
    env = command_env(spec, work, derive_seed(spec["seed"], "quality"), extra)
    run = run_command(q["cmd"], tree, env, float(q["timeout_s"]))
    if result_dir is not None:
        # NB: the result file is the answer; stdout is a log only
        run["stdout"] = read_result(result_dir / "result.json")
    case = {
        "name": "quality",
        "passed": False,
        "reason": None,
        "detail": None,
        "max_abs_err": None,
        "max_rel_err": None,
        "output": None,
        "wall_s": run["wall_s"],
        "log_tail": run["stderr_tail"],
        "exit_code": run["exit_code"],
    }
    parsed = None
    if run["escaped"]:
        case.update(
            reason="escaped_process",
            detail=f"processes outlived the command's process group (ended): {run['escaped']}",
        )
    elif run["timed_out"]:
        case.update(
            reason="timeout",
            detail=f"no result within {q['timeout_s']} s; the process group was killed",
        )
    elif run["exit_code"] != 0:
        last = (run["stderr_tail"] or "").splitlines()[-1:] or [""]
        case.update(
            reason="quality_command_failed",
            detail=f"`{q['cmd']}` exited with {run['exit_code']}: {last[0][:300]}",
        )
    else:
        try:
            parsed = parse_json_output(run["stdout"])
            value = lookup(parsed, q["field"])
        except ValueError as exc:
            case.update(reason="quality_output_invalid", detail=str(exc))
        except KeyError:
            case.update(
                reason="quality_output_invalid", detail=f"the output has no field {q['field']!r}"
            )
        else:
            if not isinstance(value, bool):
                case.update(
                    reason="quality_output_invalid",
                    detail=f"field {q['field']!r} is {value!r}, not true or false",
                )
            elif value:
                case.update(passed=True, reason="ok")
            else:
                case.update(reason="quality_failed", detail=f"field {q['field']!r} is false")
    if parsed is not None and len(json.dumps(parsed)) <= MAX_KEPT_OUTPUT:
        case["output"] = parsed
    failed = not case["passed"]
    return {
        "schema": "rsi.check/1",
        "status": "candidate_failure" if failed else "ok",
        "failure_kind": case["reason"] if failed else None,
        "reasons": (
            [{"code": case["reason"], "case": "quality", "detail": case["detail"]}]
            if failed
            else []
        ),
        "impl": {"digest": digest, "files": files, "extra_files": [], "missing_files": []},
        "quality": {"cmd": q["cmd"], "field": q["field"]},
        "cases": [case],
        "n_cases": 1,
        "n_passed": int(case["passed"]),
        "wall_s": round(time.monotonic() - started, 3),
    }


# -------------------------------------------------------------------------------------- bench


def bench(spec: dict, base: Path, overlay: Path | None, work: Path) -> dict:
    """Paired runs of the benchmark command, AB on even pairs and BA on odd ones, each run a fresh
    process in a fresh copy of its arm's tree, both arms of a pair given the same RSI_SEED."""
    started = time.monotonic()
    b = spec["benchmark"]
    m = spec["measure"]
    # NB: the pristine trees are held in this (non-dumpable) process's memory, not on disk
    # beside the runs: no run, and nothing a run starts, can rewrite what a later run copies
    pristine = {}
    for arm, ov in (("baseline", None), ("candidate", overlay)):
        staging = work / f"assemble-{arm}"
        assemble(base, ov, staging)
        pristine[arm] = snapshot(staging)
        shutil.rmtree(staging)
    digests = {}
    for arm, tree in pristine.items():
        staging = work / f"digest-{arm}"
        materialise(tree, staging)
        digests[arm] = tree_digest(staging)
        shutil.rmtree(staging)
    result_mode = (spec.get("env") or {}).get(RESULT_MODE_VAR) == "file"
    invalid: dict[str, list] = {"baseline": [], "candidate": []}
    pairs = []
    n_pairs = int(m["pairs"])
    if n_pairs < 1:
        raise HarnessError("measure.pairs must be at least 1")
    for i in range(n_pairs):
        order = ["baseline", "candidate"] if i % 2 == 0 else ["candidate", "baseline"]
        seed = derive_seed(spec["seed"], "pair", i)
        if any(r["code"] == "pristine_tree_changed" for r in invalid["candidate"]):
            break
        arms = {}
        for arm in order:
            run_dir = work / f"p{i:03d}-{arm}"
            materialise(pristine[arm], run_dir)
            if tree_digest(run_dir)[0] != digests[arm][0]:
                # NB: the run's copy changed between its writing and its start: only something
                # left behind by an earlier run could have done that
                invalid["candidate"].append(
                    {
                        "code": "pristine_tree_changed",
                        "detail": f"the {arm} run's tree changed before it started",
                        "pair": i,
                    }
                )
                break
            extra = {"RSI_PAIR": str(i)}
            result_dir = None
            if result_mode:
                result_dir = Path(tempfile.mkdtemp(prefix=f"result-{i:03d}-{arm}-", dir=work))
                extra[RESULT_FILE_VAR] = str(result_dir / "result.json")
            env = command_env(spec, work, seed, extra)
            run = run_command(b["cmd"], run_dir, env, float(b["timeout_s"]))
            shutil.rmtree(run_dir, ignore_errors=True)
            if result_dir is not None:
                run["stdout"] = read_result(result_dir / "result.json")
                shutil.rmtree(result_dir, ignore_errors=True)
            # NB: `samples` are in the benchmark command's own unit (often seconds), never
            # relabelled as nanoseconds: the assessment compares them only with each other
            record = {
                "valid": False,
                "reasons": [],
                "samples": [],
                "wall_s": run["wall_s"],
                "exit_code": run["exit_code"],
                "log_tail": run["stderr_tail"],
                "output": bench_output(run["stdout"]),
            }
            if run["escaped"]:
                # NB: a process that outlived its run could reach the next one's folder
                record["reasons"].append(
                    {
                        "code": "escaped_process",
                        "detail": f"processes outlived the command's group: {run['escaped']}",
                    }
                )
            elif run["timed_out"]:
                record["reasons"].append(
                    {"code": "timeout", "detail": f"no result within {b['timeout_s']} s"}
                )
            elif run["exit_code"] != 0:
                record["reasons"].append(
                    {
                        "code": "bench_command_failed",
                        "detail": f"exit {run['exit_code']}: "
                        + ((run["stderr_tail"] or "").splitlines()[-1:] or [""])[0][:300],
                    }
                )
            else:
                try:
                    samples = parse_samples(run["stdout"])
                except ValueError as exc:
                    samples = []
                    record["reasons"].append({"code": "bad_samples", "detail": str(exc)})
                if not samples and not record["reasons"]:
                    where = "wrote no result file" if result_mode else "printed no samples"
                    record["reasons"].append(
                        {"code": "no_samples", "detail": f"the command {where}"}
                    )
                elif any(not math.isfinite(s) or s <= 0 for s in samples):
                    record["reasons"].append(
                        {"code": "bad_samples", "detail": "samples must be finite and positive"}
                    )
                else:
                    record["samples"] = samples
                    record["valid"] = not record["reasons"]
            arms[arm] = record
            invalid[arm].extend(dict(r, pair=i) for r in record["reasons"])
        pairs.append(
            {
                "index": i,
                "order": order,
                "seed": seed,
                "complete": all(a["valid"] for a in arms.values()),
                "arms": arms,
            }
        )
    status = "ok"
    if invalid["candidate"]:
        status = "candidate_invalid"
    elif invalid["baseline"]:
        status = "baseline_invalid"
    return {
        "schema": "rsi.measure/1",
        "status": status,
        "calibration": overlay is None,
        "invalid": invalid,
        "baseline": {"digest": digests["baseline"][0], "files": digests["baseline"][1]},
        "candidate": {"digest": digests["candidate"][0], "files": digests["candidate"][1]},
        "measure": m,
        "threads": spec.get("threads"),
        "benchmark": {"cmd": b["cmd"]},
        "sample_unit": "as printed by the benchmark command",
        "n_pairs": n_pairs,
        "n_complete_pairs": sum(p["complete"] for p in pairs),
        "pairs": pairs,
        "wall_s": round(time.monotonic() - started, 3),
    }


# ------------------------------------------------------------------------------------- assess


def _load_sibling(stem: str):
    path = Path(__file__).resolve().parent / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"_rsi_harness_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _as_task_samples(doc):
    """The task assessment reads each arm's `samples_ns`; a project's samples are in its own
    unit, which its `latency` summary (a median) and the paired ratios do not depend on."""
    if not isinstance(doc, dict) or not isinstance(doc.get("pairs"), list):
        return doc
    pairs = []
    for p in doc["pairs"]:
        if isinstance(p, dict) and isinstance(p.get("arms"), dict):
            arms = {
                k: (
                    dict(v, samples_ns=v["samples"])
                    if isinstance(v, dict) and "samples" in v and "samples_ns" not in v
                    else v
                )
                for k, v in p["arms"].items()
            }
            p = dict(p, arms=arms)
        pairs.append(p)
    return dict(doc, pairs=pairs)


def _arm_notes(samples) -> list[dict]:
    """The one-line `note` a bench command's output may carry on an arm (the serving judge: which
    bound of its objective requests missed), as reasons beside the verdict: they explain a
    figure, never change it."""
    out = []
    for p in (samples or {}).get("pairs") or []:
        for arm, rec in sorted(((p or {}).get("arms") or {}).items()):
            note = (rec.get("output") or {}).get("note") if isinstance(rec, dict) else None
            if isinstance(note, str) and note:
                out.append(
                    {"code": "arm_note", "detail": f"{arm}: {note[:300]}", "pair": p["index"]}
                )
    return out


def assess(spec_path: Path, paths: dict[str, Path]) -> dict:
    spec = load_spec(spec_path)
    blobs = {}
    for name in ("spec", "samples", "check", "baseline_check", "calibration"):
        path = spec_path if name == "spec" else paths[name]
        try:
            blobs[name] = path.read_bytes()
        except OSError as exc:
            raise HarnessError(f"cannot read {name} evidence: {exc}") from exc
    docs = {name: read_json(paths[name]) for name in paths}
    for name in ("samples", "calibration"):
        docs[name] = _as_task_samples(docs[name])
    a = _load_sibling("assess")
    # NB: the task harness's `latency` summary is the median of positive samples in any unit;
    # the direction alone decides which way is better, so it serves any project metric.
    aspec = {
        "measure": {
            "metric": "latency",
            "direction": spec["measure"]["direction"],
            "units_per_call": None,
        },
        "assess": spec["assess"],
    }
    seed = a.S.seed_from(*blobs.values())
    try:
        doc = a.assess(
            aspec, docs["samples"], docs["check"], docs["baseline_check"], docs["calibration"], seed
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise HarnessError(f"malformed evidence: {type(exc).__name__}: {exc}") from exc
    except a.C.HarnessError as exc:
        raise HarnessError(str(exc)) from exc
    doc["metric"] = spec["measure"]["metric"]
    doc["reasons"].extend(_arm_notes(docs["samples"]))
    doc["evidence_sha256"] = {n: hashlib.sha256(b).hexdigest() for n, b in blobs.items()}
    return doc


# --------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    for step in ("quality", "bench"):
        p = sub.add_parser(step)
        p.add_argument("--spec", required=True, type=Path)
        p.add_argument("--base", required=True, type=Path)
        p.add_argument("--overlay", type=Path)
        p.add_argument("--out", required=True, type=Path)
    p = sub.add_parser("assess")
    for flag in ("--spec", "--samples", "--check", "--baseline-check", "--calibration", "--out"):
        p.add_argument(flag, required=True, type=Path)
    args = parser.parse_args()
    if args.step != "assess":
        # NB: failing this is not a fault of the host worth stopping for: the pristine trees
        # are still re-checked before each run
        make_non_dumpable()
        become_subreaper()
    out = args.out.resolve()
    work = Path(tempfile.mkdtemp(prefix=f".rsi-project-{args.step}-", dir=Path.cwd()))
    try:
        if args.step == "assess":
            doc = assess(
                args.spec,
                {
                    "samples": args.samples,
                    "check": args.check,
                    "baseline_check": args.baseline_check,
                    "calibration": args.calibration,
                },
            )
        else:
            spec = load_spec(args.spec)
            fn = quality if args.step == "quality" else bench
            try:
                doc = fn(
                    spec,
                    args.base.resolve(),
                    args.overlay.resolve() if args.overlay else None,
                    work,
                )
            except (KeyError, TypeError) as exc:
                raise HarnessError(f"malformed project spec: {type(exc).__name__}: {exc}") from exc
            except OSError as exc:
                raise HarnessError(f"cannot prepare the scratch tree: {exc}") from exc
        write_json(out, doc)
    except HarnessError as exc:
        print(f"rsi harness fault (project {args.step}): {exc}", file=sys.stderr)
        return INFRA_EXIT
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
