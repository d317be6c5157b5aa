"""The serving task's judge (protocol file): one arm = one fresh OpenAI-compatible vLLM server.

    python3 serve_bench.py quality   # prints {"ok": bool, ...}: correctness only
    python3 serve_bench.py bench     # prints {"samples": [goodput tokens/s], "ok": ..., ...}

Both run in the current folder (the frozen tree with the candidate's files over it) with the
interpreter rsi runs actions on (standard library only). The engine runs in the serving
environment built from requirements.lock (scripts/setup_serving.sh); its folder is named by the
lock's digest, so the lock (a protocol file, part of every action key) decides the engine.

Order of one arm: the candidate's engine flags are checked against the declared set; the model
is built from the binding's config and seed and its weights' digest must equal the bound one;
the server starts in its own session (a fresh HOME, port and log); the engine's own version
must be the bound one; greedy continuations of the fixed prompts must equal the reference's
token ids exactly. Only then (bench) AIPerf replays the pinned trace, a burst that saturates
the engine (the binding's `load_shape`), and waits for the drain. The metric is goodput: output
tokens of the requests that met the binding's per-request `objective` (TTFT and mean ITL
bounds), over the window from the first request sent to the last answer. Per-request records
are reconciled with AIPerf's aggregates and with the server's own generation-token counter, and
every answer is checked against the reference; any error, cancellation, short answer,
unreadable timing or mismatch makes the run invalid (exit 1), never faster.
The server's whole process group is killed at the end, whatever happened, and checked gone.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_isolation as ISO  # noqa: E402  (a protocol file beside this one)

HERE = Path.cwd()
ENV_ROOT = os.environ.get("RSI_SERVING_ROOT", "/usr/local/lib/rsi-serving")
LOG_TAIL_LINES = 60
RESULT_VAR = "RSI_RESULT_FILE"


class Invalid(Exception):
    """The arm cannot count: a candidate failure (flags, weights, correctness) or a bad run."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


# ------------------------------------------------------------------------------- pure logic


def check_flags(flags: dict, allowed: dict) -> list[str]:
    """The engine flags as command-line arguments; Invalid unless every one is declared and in
    range (`allowed`: name -> {type: int|bool|choice, min, max, choices})."""
    if not isinstance(flags, dict):
        raise Invalid("flag_not_allowed", "engine_flags.json must hold a JSON object")
    argv: list[str] = []
    for name in sorted(flags):
        value, rule = flags[name], allowed.get(name)
        if rule is None:
            raise Invalid(
                "flag_not_allowed", f"--{name} is not in the declared set {sorted(allowed)}"
            )
        kind = rule["type"]
        if kind == "bool":
            if not isinstance(value, bool):
                raise Invalid("flag_not_allowed", f"--{name} takes true or false, not {value!r}")
            argv.append(f"--{name}" if value else f"--no-{name}")
            continue
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
            ok = ok and rule.get("min", value) <= value <= rule.get("max", value)
        else:
            ok = value in rule["choices"]
        if not ok:
            raise Invalid("flag_not_allowed", f"--{name} = {value!r} is outside {rule}")
        argv += [f"--{name}", str(value)]
    return argv


def compare_tokens(expected: list[list[int]], got: list[list[int]]) -> dict | None:
    """None when every continuation matches token for token, else the first difference."""
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        if list(e) != list(g):
            at = next(
                (k for k, (a, b) in enumerate(zip(e, g, strict=False)) if a != b),
                min(len(e), len(g)),
            )
            return {"prompt": i, "position": at, "expected": e, "got": g}
    return None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _metric(rec: dict, name: str):
    m = (rec.get("metrics") or {}).get(name)
    return m.get("value") if isinstance(m, dict) else None


OBJECTIVES = {
    # objective key -> (AIPerf's per-request metric, what it bounds)
    "ttft_ms": ("time_to_first_token", "time to first token"),
    "mean_itl_ms": ("inter_token_latency", "mean inter-token latency"),
    "e2e_ms": ("request_latency", "end-to-end latency"),
}


def check_objective(objective) -> dict[str, float]:
    """The binding's per-request objective ({key: bound in ms}, keys from OBJECTIVES); Invalid
    when there is none or a bound is not a positive number: goodput could not be judged."""
    if not isinstance(objective, dict):
        raise Invalid("objective_unchecked", "the binding's workload has no objective")
    bounds = {k: v for k, v in objective.items() if k in OBJECTIVES}
    unknown = sorted(k for k in objective if k not in OBJECTIVES and k != "calibration")
    if unknown or not bounds:
        raise Invalid(
            "objective_unchecked",
            f"objective keys {unknown or sorted(objective)} not in {sorted(OBJECTIVES)}",
        )
    for k, v in bounds.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise Invalid("objective_unchecked", f"objective {k} = {v!r} is not a positive bound")
    return {k: float(v) for k, v in bounds.items()}


def summarise(
    records: list[dict],
    aggregate: dict,
    trace: list[dict],
    objective: dict,
    counter_delta: float | None,
) -> dict:
    """Goodput over the load window (first request sent to last answer) and latency evidence
    from AIPerf's per-request records, reconciled with its aggregate, the trace and the server's
    counter; Invalid on any gap. A request counts toward goodput only when it meets every bound
    of the objective; one whose timing cannot be read makes the run invalid, never faster."""
    bounds = check_objective(objective)
    problems = []
    if len(records) != len(trace):
        problems.append(f"{len(records)} request records for {len(trace)} trace entries")
    errors = [r for r in records if r.get("error")]
    cancelled = [r for r in records if (r.get("metadata") or {}).get("was_cancelled")]
    if errors:
        first = errors[0].get("error")
        problems.append(f"{len(errors)} request(s) errored, first: {str(first)[:300]}")
    if cancelled:
        problems.append(f"{len(cancelled)} request(s) cancelled")
    if aggregate.get("was_cancelled") or aggregate.get("is_complete") is False:
        problems.append("AIPerf reports the run cancelled or incomplete")
    if aggregate.get("error_summary"):
        problems.append(f"AIPerf error summary: {str(aggregate['error_summary'])[:300]}")
    tokens = [_metric(r, "usage_completion_tokens") for r in records]
    if any(t is None for t in tokens):
        problems.append("a record has no server-reported completion token count")
    want = [int(t["output_length"]) for t in trace]
    if not problems and sorted(tokens) != sorted(want):
        problems.append(f"output lengths {sorted(tokens)} differ from the trace's {sorted(want)}")
    total = sum(t for t in tokens if t is not None)
    agg_total = (aggregate.get("total_usage_completion_tokens") or {}).get("avg")
    if agg_total is None or int(agg_total) != total:
        problems.append(f"records sum to {total} output tokens, the aggregate says {agg_total}")
    agg_count = aggregate.get("completed_request_count") or aggregate.get("request_count") or {}
    if agg_count.get("avg") is None or int(agg_count["avg"]) != len(records):
        problems.append(f"{len(records)} records, the aggregate counts {agg_count.get('avg')}")
    if counter_delta is not None and int(counter_delta) != total:
        problems.append(f"the server generated {counter_delta} tokens, the records say {total}")
    timing: list[dict[str, float]] = []
    for n, r in enumerate(records):
        md = r.get("metadata") or {}
        got = {k: _metric(r, name) for k, (name, _) in OBJECTIVES.items()}
        unreadable = [
            OBJECTIVES[k][0]
            for k, v in got.items()
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0
        ]
        for key in ("credit_issued_ns", "request_end_ns"):
            if not isinstance(md.get(key), int) or isinstance(md.get(key), bool):
                unreadable.append(key)
        if unreadable:
            # NB: a request whose timing cannot be read cannot be judged against the objective
            problems.append(f"record {n} has no readable {', '.join(unreadable)}")
            continue
        timing.append(got)
    if problems:
        raise Invalid("run_invalid", "; ".join(problems))
    starts = [r["metadata"]["credit_issued_ns"] for r in records]
    ends = [r["metadata"]["request_end_ns"] for r in records]
    if min(ends) <= min(starts):
        raise Invalid("run_invalid", "a request ended before the first one was sent")
    # NB: the window is the load itself: from the first request sent to the last answer's end
    # (no idle lead-in: the trace starts at 0), so an engine that drains the burst sooner shows
    window_s = (max(ends) - min(starts)) / 1e9
    missed = {k: 0 for k in bounds}
    good_tokens, good_requests = 0, 0
    for t, got in zip(tokens, timing, strict=True):
        over = [k for k, bound in bounds.items() if got[k] > bound]
        for k in over:
            missed[k] += 1
        if not over:
            good_tokens += t
            good_requests += 1
    ttft = [g["ttft_ms"] for g in timing]
    itl = [g["mean_itl_ms"] for g in timing]
    e2e = [g["e2e_ms"] for g in timing]
    return {
        "output_tokens": total,
        "requests": len(records),
        "window_s": round(window_s, 6),
        "output_tokens_per_s": total / window_s,
        "goodput_tokens_per_s": good_tokens / window_s,
        "objective": {
            "bounds": bounds,
            "met": good_requests,
            "good_tokens": good_tokens,
            "missed": missed,
        },
        "ttft_ms": {q: percentile(ttft, v) for q, v in (("p50", 50), ("p90", 90), ("p99", 99))},
        "itl_ms": {q: percentile(itl, v) for q, v in (("p50", 50), ("p90", 90), ("p99", 99))},
        "e2e_ms": {q: percentile(e2e, v) for q, v in (("p50", 50), ("p90", 90), ("p99", 99))},
        "server_generation_tokens": counter_delta,
        "aiperf_output_token_throughput": (aggregate.get("output_token_throughput") or {}).get(
            "avg"
        ),
        "aiperf_benchmark_duration_s": (aggregate.get("benchmark_duration") or {}).get("avg"),
    }


def require_all_checked(window_answers: dict, n: int) -> None:
    """Goodput counts a request only when its answer was checked correct: Invalid when any
    replayed request has no trusted reference (its answer would count unchecked)."""
    if window_answers.get("requests") != n:
        raise Invalid(
            "sample_unchecked",
            f"{window_answers.get('requests')} of {n} replayed answers checked: goodput counts "
            f"only checked answers",
        )


def objective_note(summary: dict) -> str | None:
    """One line saying which bounds of the objective requests missed (None when all met): what
    a verdict shows when goodput fell."""
    o = summary["objective"]
    parts = [
        f"{n} of {summary['requests']} over {k} {o['bounds'][k]:g}"
        for k, n in sorted(o["missed"].items())
        if n
    ]
    if not parts:
        return None
    return (
        f"objective missed: {'; '.join(parts)} (p99 ttft {summary['ttft_ms']['p99']:.0f} ms, "
        f"p99 mean itl {summary['itl_ms']['p99']:.1f} ms); goodput "
        f"{summary['goodput_tokens_per_s']:.1f} of {summary['output_tokens_per_s']:.1f} tokens/s"
    )


def read_counter(text: str, name: str) -> float | None:
    """The sum of a Prometheus counter's samples (every label set)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            rest = line[len(name) :]
            if rest[:1] in ("{", " ") and not rest.startswith("_created"):
                try:
                    total += float(line.rsplit(" ", 1)[1])
                    seen = True
                except ValueError:
                    continue
    return total if seen else None


# ------------------------------------------------------------------------------- the engine


def engine_env_dir() -> Path:
    digest = hashlib.sha256((HERE / "requirements.lock").read_bytes()).hexdigest()
    env = Path(ENV_ROOT) / digest[:16]
    marker = env / "rsi-serving.json"
    try:
        ok = json.loads(marker.read_text()).get("lock_sha256") == digest
    except (OSError, ValueError):
        ok = False
    if not ok:
        print(
            f"serve_bench: the serving environment {env} (from requirements.lock) is not built; "
            f"run scripts/setup_serving.sh",
            file=sys.stderr,
        )
        raise SystemExit(3)
    return env


def http(url: str, body: dict | None = None, timeout: float = 60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return raw.decode("utf-8", "replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_plugin(folder: Path) -> None:
    """A general vLLM plugin, found through its dist-info on PYTHONPATH (no install): it
    registers the binding's architecture from the candidate's tiny_model.py in every engine
    process that loads plugins."""
    folder.mkdir(parents=True)
    (folder / "rsi_serve_plugin.py").write_text(
        "def register():\n"
        "    from vllm import ModelRegistry\n"
        "    if 'RsiTinyForCausalLM' not in ModelRegistry.get_supported_archs():\n"
        "        ModelRegistry.register_model('RsiTinyForCausalLM', "
        "'tiny_model:RsiTinyForCausalLM')\n"
    )
    info = folder / "rsi_serve_plugin-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rsi-serve-plugin\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nrsi_tiny = rsi_serve_plugin:register\n"
    )


LSCPU_SHIM = """#!/usr/bin/env python3
# NB: vLLM's CPU worker asks `lscpu --json --extended=CPU,CORE,NODE --online` for the CPUs it
# may bind threads to; lscpu reads /sys, which a sandbox does not have. This answers the same
# question from the CPUs the process may run on: each its own core, one node.
import json, os
cpus = sorted(os.sched_getaffinity(0))
print(json.dumps({"cpus": [{"cpu": c, "core": c, "node": 0, "online": True} for c in cpus]}))
"""


def write_lscpu_shim(folder: Path) -> None:
    """An `lscpu` for the engine where /sys/devices/system/cpu is missing (a sandbox)."""
    folder.mkdir(exist_ok=True)
    if os.path.isdir("/sys/devices/system/cpu"):
        return  # NB: the real one works here
    shim = folder / "lscpu"
    shim.write_text(LSCPU_SHIM)
    shim.chmod(0o755)


def become_subreaper() -> None:
    """Orphans of every process this judge starts are re-parented to it (PR_SET_CHILD_SUBREAPER),
    so a helper that calls setsid and double-forks stays findable as a descendant and is ended
    with the arm; Invalid when the kernel refuses (the teardown could not be checked)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.prctl(36, 1, 0, 0, 0)  # NB: 36 = PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError) as exc:
        raise Invalid("teardown_unchecked", f"prctl unavailable: {exc}") from None
    if rc != 0:
        err = ctypes.get_errno()
        raise Invalid("teardown_unchecked", f"PR_SET_CHILD_SUBREAPER refused: {os.strerror(err)}")


def descendants(root: int | None = None, zombies: bool = False) -> list[int]:
    """Live (non-zombie, unless `zombies`) processes below `root` (this process by default),
    whatever their session or group."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if zombies or fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


def reap() -> None:
    """Collect ended children (orphans re-parented here) so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def settle(limit_s: float = 5.0) -> list[int]:
    """Reap until nothing at all is left below this judge, zombies included (bounded): a
    process ended with its parent is re-parented here only after that parent's exit, and a
    zombie left unreaped when this judge exits passes to the harness, which counts whatever
    it finds below it as an escaped process. Returns what is still there at the limit."""
    deadline = time.monotonic() + limit_s
    while True:
        reap()
        left = descendants(zombies=True)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def end_descendants(rounds: int = 50) -> tuple[list[int], list[int]]:
    """SIGKILL every descendant of this judge until none is left (a forking one may need a few
    rounds): (those found, those left)."""
    found: set[int] = set()
    for _ in range(rounds):
        live = descendants()
        if not live:
            break
        found.update(live)
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        time.sleep(0.1)
        reap()
    reap()
    return sorted(found), descendants()


class Server:
    """One engine process group inside its own sandbox (serve_isolation.py), started in its own
    session and killed whole at the end. It reads a copy of the checked model and of the
    candidate's tiny_model.py; it can write only its HOME and TMPDIR."""

    def __init__(
        self,
        env_dir: Path,
        model: Path,
        work: Path,
        binding: dict,
        flags: list[str],
        hidden: list[Path],
    ):
        self.work, self.binding = work, binding
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / "server.log"
        e = binding["engine"]
        # NB: the engine binds ZeroMQ ipc sockets under TMPDIR, whose paths may not exceed
        # 107 bytes (sockaddr_un): a scratch folder nested deep (a test's, a sandbox's) fails
        # at start, so the server's whole scratch is a short folder of its own, removed by stop()
        self.srv = Path(tempfile.mkdtemp(prefix="rsv-", dir="/tmp"))
        ISO.hand_over(self.srv)
        home, self.ipc = self.srv / "home", self.srv / "ipc"
        for d in (home, self.ipc):
            d.mkdir()
            ISO.hand_over(d)
        plugin = self.srv / "plugin"
        write_plugin(plugin)
        # NB: the server imports a copy of the candidate's model file, never the arm's tree
        shutil.copyfile(HERE / "tiny_model.py", plugin / "tiny_model.py")
        served = self.srv / "model"
        shutil.copytree(model, served)
        shims = self.srv / "shims"
        write_lscpu_shim(shims)
        for d, _, files in os.walk(self.srv):
            if Path(d) not in (self.srv, home, self.ipc):
                os.chmod(d, 0o755)
                for f in files:
                    os.chmod(Path(d) / f, 0o755 if f == "lscpu" else 0o644)
        env = {
            "PATH": f"{shims}:{env_dir}/bin:/usr/bin:/bin",
            "HOME": str(home),
            "TMPDIR": str(self.ipc),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(plugin),
            "VLLM_PLUGINS": "rsi_tiny",
            **e["env"],
        }
        self.argv = [
            str(env_dir / "bin" / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(served),
            "--served-model-name",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *e["base_args"],
            *flags,
        ]
        try:
            wrap, self.isolation = ISO.sandbox_argv(
                hidden=[work, *hidden],
                readonly=[self.srv],
                writable=[home, self.ipc],
                python=env_dir / "bin" / "python",
            )
        except ISO.NotIsolated as exc:
            shutil.rmtree(self.srv, ignore_errors=True)
            raise Invalid("server_not_isolated", str(exc)) from None
        self.started = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*wrap, *self.argv],
                cwd=str(home),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pgid = self.proc.pid
        self.start_s = None

    def wait_ready(self) -> float:
        limit = float(self.binding["engine"]["startup_timeout_s"])
        while time.monotonic() - self.started < limit:
            if self.proc.poll() is not None:
                raise Invalid("server_failed", f"the server exited with {self.proc.returncode}")
            try:
                http(f"{self.url}/health", timeout=2)
                self.start_s = round(time.monotonic() - self.started, 3)
                return self.start_s
            except (OSError, urllib.error.URLError):
                time.sleep(0.5)
        raise Invalid("server_failed", f"the server was not ready within {limit} s")

    def members(self) -> list[int]:
        """Live processes of the server's group (a zombie has ended: in a sandbox's pid
        namespace nobody may be left to reap it)."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) != self.pgid:
                        continue
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                            continue
                    pids.append(int(entry))
                except OSError:
                    continue
        return pids

    def stop(self) -> dict:
        """SIGTERM to the whole group, SIGKILL after 10 s; then no member may remain. A process
        below the server that left its group (setsid) escaped, even if the sandbox's end would
        take it down: it is named before the group is killed."""
        outside = []
        for pid in descendants(self.proc.pid):
            try:
                if os.getpgid(pid) != self.pgid:
                    outside.append(pid)
            except OSError:
                continue
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self.proc.poll()
                if not self.members():
                    break
                time.sleep(0.1)
            if not self.members():
                break
        self.proc.poll()
        if self.proc.returncode is None:
            try:
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        # NB: the group kill misses a helper that left the group (setsid); as subreaper this
        # judge still has it as a descendant: anything still alive here escaped, and is ended
        escaped, beyond = end_descendants()
        settle()
        left = sorted(set(self.members()) | set(beyond))
        if not left:
            shutil.rmtree(self.srv, ignore_errors=True)
        return {
            "pgid": self.pgid,
            "left": left,
            "escaped": sorted(set(escaped) | set(outside)),
            "exit_code": self.proc.returncode,
        }

    def log_tail(self) -> list[str]:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [line[:400] for line in lines[-LOG_TAIL_LINES:]]


def greedy(server: Server, binding: dict) -> list[list[int]]:
    c = binding["correctness"]
    out = []
    for prompt in c["prompts"]:
        body = {
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": int(c["max_tokens"]),
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        try:
            doc = json.loads(http(f"{server.url}/v1/completions", body, timeout=120))
            out.append([int(t) for t in doc["choices"][0]["token_ids"]])
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            # NB: a refused or unreadable answer is a check that could not be made: not ok
            raise Invalid(
                "correctness_unchecked", f"the correctness prompt {prompt!r} got no answer: {exc}"
            ) from None
    return out


def load_trace(binding: dict) -> bytes:
    """The pinned trace's bytes, read once BEFORE any candidate code runs and checked against the
    binding's digest: the file in the tree is never read again (a server could rewrite it)."""
    w = binding["workload"]
    want = w.get("trace_sha256")
    if not want:
        raise Invalid("trace_unchecked", "the binding's workload has no trace_sha256")
    data = (HERE / w["trace"]).read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise Invalid("trace_mismatch", f"{w['trace']} has digest {got}, bound {want}")
    return data


def parse_trace(data: bytes, binding: dict) -> list[dict]:
    """The trace's requests; Invalid unless they are the binding's load shape exactly (a burst:
    `requests` requests `spacing_ms` apart from 0, each of `output_length` tokens)."""
    w = binding["workload"]
    trace = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    shape = w.get("load_shape")
    try:
        n, gap = int(shape["requests"]), float(shape["spacing_ms"])
        length = int(shape["output_length"])
    except (TypeError, KeyError, ValueError):
        raise Invalid(
            "trace_mismatch", f"the binding's load_shape {shape!r} is incomplete"
        ) from None
    want = [(i * gap, length) for i in range(n)]
    got = [(float(t["timestamp"]), int(t["output_length"])) for t in trace]
    if got != want:
        raise Invalid(
            "trace_mismatch",
            f"the trace ({len(got)} requests, first {got[:2]}) is not the bound load shape {shape}",
        )
    return trace


def secret_sample(n: int, k: int) -> list[int]:
    """k of the n benchmark requests, chosen from the OS's randomness at run time: no file a
    candidate can read names them before the check."""
    return sorted(secrets.SystemRandom().sample(range(n), min(k, n)))


# NB: fresh prompts drawn per prompt an arm needs, per shape (prompt length, answer length), plus
# six: a drawn prompt counts only when its whole reference continuation is trusted (no
# near-tie). 351 of 450 (78%) were here; at 1.5 per need plus 2 an arm fell short about once in
# 14 (sample_unchecked in CI). At 3 per need plus 6 it falls short about once in 400,000 arms
# at 78%, and once in 1,600 even at 60%. make_model.py stops computing a shape's references
# once it has the `enough` it needs, so the larger pool costs nothing but drawing strings.
FRESH_POOL = 3.0
FRESH_SPARE = 6


def _slots(trace: list[dict], extra: int) -> list[tuple[int, int]]:
    """The shape (prompt characters, answer tokens) of every prompt an arm asks: each replayed
    request's, then `extra` for the sample before the replay, at the trace's median shape."""
    shapes = [(max(2, len(t["text_input"])), int(t["output_length"])) for t in trace]
    # NB: the lower median: with two shapes, the shorter (a test's overlong prompt is refused)
    return shapes + [sorted(shapes)[(len(shapes) - 1) // 2]] * int(extra)


def draw_prompts(
    trace: list[dict], alphabet: str, extra: int, pool: float = FRESH_POOL
) -> list[dict]:
    """Fresh prompts for one arm, drawn from the OS's randomness at run time: for every shape
    the arm needs m of (`_slots`), ceil(m x pool) + FRESH_SPARE strings of the model's alphabet
    of that length, none a pinned prompt, all distinct, each row carrying `enough` = m (the
    reference stops computing that shape once m are fully trusted). The pinned trace fixes the
    load (when, how many, how long a prompt and an answer); the words are new each run, so no
    model can answer a timed request from a table of the public ones: it has to compute it."""
    rng = secrets.SystemRandom()
    edge = [c for c in alphabet if not c.isspace()]
    inner = [c for c in alphabet if c != "\n"]
    if not edge or not trace:
        raise Invalid("sample_unchecked", "no alphabet or trace to draw fresh prompts from")
    public = {t["text_input"] for t in trace}
    need: dict[tuple[int, int], int] = {}
    for shape in _slots(trace, extra):
        need[shape] = need.get(shape, 0) + 1
    out: list[dict] = []
    seen: set[str] = set()
    for (chars, answer), m in sorted(need.items()):
        drawn, want = 0, math.ceil(m * pool) + FRESH_SPARE
        while drawn < want:
            text = (
                rng.choice(edge)
                + "".join(rng.choice(inner) for _ in range(chars - 2))
                + rng.choice(edge)
            )
            if text in seen or text in public:
                continue
            seen.add(text)
            out.append({"text_input": text, "output_length": answer, "enough": m})
            drawn += 1
    return out


def fresh_workload(
    binding: dict, trace: list[dict], pool: list[dict], ids: list, trusted: list
) -> tuple[dict, list[dict], bytes, dict, list[dict]]:
    """The arm's own workload from the drawn `pool` and its reference (`ids`, `trusted`, from
    make_model.py --prompts): the pinned trace's times and shapes with fully trusted fresh
    prompts of the same shape (binding, rows and bytes for AIPerf), and `secret_sample` more,
    never replayed, for the sample asked before the replay (binding, rows). Invalid when a
    shape has too few drawn prompts with a fully trusted reference."""
    k = int(binding["workload"].get("secret_sample", 0))
    if len(ids) != len(pool) or len(trusted) != len(pool):
        raise Invalid("sample_unchecked", "the reference does not cover every drawn prompt")
    if k < 1:
        raise Invalid("sample_unchecked", "the binding asks no secret sample")
    usable: dict[tuple[int, int], list[int]] = {}
    for j, row in enumerate(pool):
        if int(trusted[j]) >= int(row["output_length"]):
            shape = (max(2, len(row["text_input"])), int(row["output_length"]))
            usable.setdefault(shape, []).append(j)
    picked: list[int] = []
    for shape in _slots(trace, k):
        if not usable.get(shape):
            drawn = sum(1 for r in pool if (len(r["text_input"]), r["output_length"]) == shape)
            raise Invalid(
                "sample_unchecked",
                f"too few fresh prompts of {shape[0]} characters with a fully trusted "
                f"reference of {shape[1]} tokens ({drawn} drawn)",
            )
        picked.append(usable[shape].pop(0))
    n = len(trace)
    rows = [
        {
            "timestamp": t["timestamp"],
            "text_input": pool[j]["text_input"],
            "output_length": t["output_length"],
        }
        for t, j in zip(trace, picked[:n], strict=True)
    ]
    pre = [
        {"text_input": pool[j]["text_input"], "output_length": pool[j]["output_length"]}
        for j in picked[n:]
    ]

    def bound(which: list[int]) -> dict:
        b = json.loads(json.dumps(binding))
        b["workload"]["reference_token_ids"] = [ids[j] for j in which]
        b["workload"]["reference_trusted"] = [int(trusted[j]) for j in which]
        return b

    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    return bound(picked[:n]), rows, data, bound(picked[n:]), pre


def check_benchmark_sample(server: Server, binding: dict, trace: list[dict]) -> dict:
    """Greedy continuations of a secret sample of the trace's own requests must equal the
    reference's token ids (computed by transformers, make_model.py --reference): a model right
    on the public prompts and wrong on the benchmark's fails. Invalid when it cannot check."""
    w = binding["workload"]
    refs = w.get("reference_token_ids")
    k = int(w.get("secret_sample", 0))
    if not isinstance(refs, list) or len(refs) != len(trace) or k < 1:
        raise Invalid("sample_unchecked", "the binding has no reference for every trace request")
    trusted = w.get("reference_trusted")
    if not isinstance(trusted, list) or len(trusted) != len(trace):
        raise Invalid("sample_unchecked", "the binding has no trusted length per reference")
    # NB: drawn among the requests with at least one trusted reference token
    checkable = [i for i in range(len(trace)) if int(trusted[i]) > 0]
    if not checkable:
        raise Invalid("sample_unchecked", "no trace request has a trusted reference token")
    picked = [checkable[j] for j in secret_sample(len(checkable), k)]
    got = []
    for i in picked:
        body = {
            "model": "tiny",
            "prompt": trace[i]["text_input"],
            "max_tokens": int(trace[i]["output_length"]),
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        try:
            doc = json.loads(http(f"{server.url}/v1/completions", body, timeout=120))
            got.append([int(t) for t in doc["choices"][0]["token_ids"]])
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            # NB: a refused or unreadable answer is a check that could not be made: not ok
            raise Invalid(
                "sample_unchecked", f"the secret sample's request {i} got no answer: {exc}"
            ) from None
    # NB: each reference is compared up to its first near-tie (top-1/top-2 logit gap under the
    # frozen margin_bound, `reference_trusted`): past it exact equality would not be fair
    diff = compare_tokens(
        [refs[i][: int(trusted[i])] for i in picked],
        [g[: int(trusted[i])] for i, g in zip(picked, got, strict=True)],
    )
    if diff is not None:
        diff["prompt"] = picked[diff["prompt"]]
        raise Invalid("wrong_output", f"a benchmark request's greedy tokens differ: {diff}")
    return {"requests": picked, "tokens": sum(map(len, got))}


def streamed_token_ids(raw: dict) -> list[int]:
    """The token ids the server streamed for one request, from AIPerf's raw record (its SSE
    packets, in order); ValueError when a packet is not the server's JSON."""
    out: list[int] = []
    for resp in raw.get("responses") or []:
        for packet in resp.get("packets") or []:
            value = packet.get("value")
            if packet.get("name") != "data" or value == "[DONE]":
                continue
            chunk = json.loads(value)
            for choice in chunk.get("choices") or []:
                ids = choice.get("token_ids") or []
                if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise ValueError(f"token ids {str(ids)[:80]} are not integers")
                if choice.get("text") and not ids:
                    # NB: AIPerf times its first packet with text as the first token: text sent
                    # ahead of any token would make the time to first token whatever it likes
                    raise ValueError(
                        f"a streamed packet carries text {str(choice['text'])[:40]!r} without "
                        f"token ids: its time cannot stand for a token's"
                    )
                out.extend(ids)
    return out


def check_window_answers(raw_records: list[dict], binding: dict, trace: list[dict]) -> dict:
    """Every replayed request's streamed tokens (AIPerf's raw export: what the server answered
    INSIDE the timed window, under load, indistinguishable from it because it is it) must equal
    the reference's token ids up to the request's first near-tie. Invalid when a request is
    missing, has no token ids, or the binding has no reference for it."""
    w = binding["workload"]
    refs, trusted = w.get("reference_token_ids"), w.get("reference_trusted")
    if not isinstance(refs, list) or not isinstance(trusted, list) or len(refs) != len(trace):
        raise Invalid("sample_unchecked", "the binding has no reference for every trace request")
    index = {t["text_input"]: i for i, t in enumerate(trace)}
    if len(index) != len(trace):
        raise Invalid(
            "sample_unchecked", "the trace's prompts are not unique: answers cannot be told apart"
        )
    seen: dict[int, list[int]] = {}
    for raw in raw_records:
        prompt = (raw.get("payload") or {}).get("prompt")
        if prompt not in index or index[prompt] in seen:
            raise Invalid(
                "run_invalid", f"a replayed request not in the trace once: {str(prompt)[:80]}"
            )
        try:
            seen[index[prompt]] = streamed_token_ids(raw)
        except (ValueError, TypeError, AttributeError) as exc:
            raise Invalid("run_invalid", f"a streamed answer cannot be read: {exc}") from None
    missing = sorted(set(range(len(trace))) - set(seen))
    if missing:
        raise Invalid("sample_unchecked", f"no streamed answer recorded for requests {missing}")
    checked = [i for i in range(len(trace)) if int(trusted[i]) > 0]
    if not checked:
        raise Invalid("sample_unchecked", "no trace request has a trusted reference token")
    for i in range(len(trace)):
        if len(seen[i]) != int(trace[i]["output_length"]):
            raise Invalid(
                "run_invalid",
                f"request {i} streamed {len(seen[i])} token ids for {trace[i]['output_length']}",
            )
    diff = compare_tokens(
        [refs[i][: int(trusted[i])] for i in checked],
        [seen[i][: int(trusted[i])] for i in checked],
    )
    if diff is not None:
        diff["prompt"] = checked[diff["prompt"]]
        raise Invalid("wrong_output", f"a replayed request's streamed tokens differ: {diff}")
    return {"requests": len(checked), "tokens": sum(int(trusted[i]) for i in checked)}


def run_aiperf(
    env_dir: Path, server: Server, model: Path, work: Path, binding: dict, trace_data: bytes
) -> dict:
    w = binding["workload"]
    trace = parse_trace(trace_data, binding)
    want = hashlib.sha256(trace_data).hexdigest()
    # NB: AIPerf reads a fresh copy written from the bytes checked before the server started,
    # and the copy is checked again after the run: a trace rewritten mid-run makes it invalid
    feed = Path(tempfile.mkdtemp(prefix="rst-", dir="/tmp"))
    trace_path = feed / "trace.jsonl"
    trace_path.write_bytes(trace_data)
    metrics_before = http(f"{server.url}/metrics")
    art = work / "aiperf"
    argv = [
        str(env_dir / "bin" / "python"),
        "-m",
        "aiperf",
        "profile",
        "--model",
        "tiny",
        "--url",
        server.url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--input-file",
        str(trace_path),
        "--custom-dataset-type",
        "mooncake_trace",
        "--fixed-schedule",
        "--fixed-schedule-start-offset",
        "0",
        "--tokenizer",
        str(model),
        "--use-server-token-count",
        "--extra-inputs",
        "ignore_eos:true",
        # NB: greedy, with the token ids streamed: every timed answer is checked against the
        # reference from AIPerf's own raw record of it (--export-level raw)
        "--extra-inputs",
        "temperature:0",
        "--extra-inputs",
        "return_token_ids:true",
        "--export-level",
        "raw",
        "--request-timeout-seconds",
        str(w["request_timeout_s"]),
        "--artifact-dir",
        str(art),
        "--ui-type",
        "none",
        "--no-server-metrics",
        "--random-seed",
        os.environ.get("RSI_SEED", "0"),
    ]
    # NB: AIPerf binds ZeroMQ ipc sockets under TMPDIR too (107-byte paths at most)
    ipc = Path(tempfile.mkdtemp(prefix="rsa-", dir="/tmp"))
    site = ISO.write_sitecustomize(work / "aiperf-site")
    env = {
        "PYTHONPATH": str(site),
        "PATH": f"{env_dir}/bin:/usr/bin:/bin",
        "HOME": str(work / "home"),
        "TMPDIR": str(ipc),
        "LANG": "C.UTF-8",
        # NB: no HF_HUB_OFFLINE here: with it, AIPerf 0.13.0 refuses a local tokenizer folder
        # (HFValidationError); the sandbox has no network anyway
    }
    t0 = time.monotonic()
    log = work / "aiperf.log"
    proc = subprocess.Popen(
        argv,
        cwd=work,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        proc.wait(timeout=float(w["drain_timeout_s"]) + 300)
    except subprocess.TimeoutExpired:
        pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        shutil.rmtree(ipc, ignore_errors=True)
        try:
            fed = hashlib.sha256(trace_path.read_bytes()).hexdigest()
        except OSError:
            fed = None
        shutil.rmtree(feed, ignore_errors=True)
    if fed != want:
        raise Invalid("trace_mismatch", f"the trace AIPerf read changed during the run ({fed})")
    wall = round(time.monotonic() - t0, 3)
    tail = [ln[:300] for ln in log.read_text(errors="replace").splitlines()[-30:]]
    records_path = art / "profile_export.jsonl"
    agg_path = art / "profile_export_aiperf.json"
    raw_path = art / "profile_export_raw.jsonl"
    exported = all(p.exists() for p in (records_path, agg_path, raw_path))
    if proc.returncode != 0 or not exported:
        raise Invalid(
            "run_invalid", f"AIPerf exited with {proc.returncode}: {' | '.join(tail[-5:])}"
        )
    records = [json.loads(x) for x in records_path.read_text().splitlines() if x.strip()]
    aggregate = json.loads(agg_path.read_text())
    metrics_after = http(f"{server.url}/metrics")
    name = "vllm:generation_tokens_total"
    before, after = read_counter(metrics_before, name), read_counter(metrics_after, name)
    delta = None if before is None or after is None else after - before
    summary = summarise(records, aggregate, trace, w.get("objective"), delta)
    summary.update(aiperf_wall_s=wall, aiperf_version=aggregate.get("aiperf_version"))
    raw = [json.loads(x) for x in raw_path.read_text().splitlines() if x.strip()]
    summary["window_answers"] = check_window_answers(raw, binding, trace)
    require_all_checked(summary["window_answers"], len(trace))
    note = objective_note(summary)
    if note:
        summary["objective"]["note"] = note
    return summary


# --------------------------------------------------------------------------------- one arm


def arm(step: str) -> dict:
    binding = json.loads((HERE / "serve.json").read_text())
    env_dir = engine_env_dir()
    doc: dict = {"ok": False, "step": step, "engine": None, "reason": None}
    work = Path(tempfile.mkdtemp(prefix="serve-", dir=os.environ.get("TMPDIR")))
    server = None
    try:
        trace_data = load_trace(binding)
        pinned = parse_trace(trace_data, binding)
        # NB: the arm's own prompts, drawn before any candidate code runs (issue 32 review):
        # the pinned trace and its reference are public, so a model could answer them from a
        # table; these it has never seen
        pool = draw_prompts(
            pinned, binding["model"]["alphabet"], int(binding["workload"].get("secret_sample", 0))
        )
        become_subreaper()
        try:
            # NB: before any candidate code runs: no process of the same uid may read this
            # one's descriptors (its stdout, the result file), memory or environment
            ISO.make_non_dumpable()
        except ISO.NotIsolated as exc:
            raise Invalid("server_not_isolated", str(exc)) from None
        flags = check_flags(
            json.loads((HERE / "engine_flags.json").read_text()), binding["flags"]["allowed"]
        )
        doc["engine_flags"] = flags
        model = work / "model"
        fresh = work / "fresh.jsonl"
        fresh.write_text("".join(json.dumps(r) + "\n" for r in pool))
        t0 = time.monotonic()
        built = subprocess.run(
            [
                str(env_dir / "bin" / "python"),
                str(HERE / "make_model.py"),
                "--binding",
                str(HERE / "serve.json"),
                "--out",
                str(model),
                "--reference",
                "--prompts",
                str(fresh),
            ],
            capture_output=True,
            text=True,
            cwd=work,
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": str(work),
                "LANG": "C.UTF-8",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "OMP_NUM_THREADS": "1",
            },
        )
        if built.returncode != 0:
            raise SystemExit(f"serve_bench: make_model.py failed: {built.stderr[-2000:]}")
        made = json.loads(built.stdout.strip().splitlines()[-1])
        fresh.unlink()
        weights = made["weights_sha256"]
        doc["model"] = {"weights_sha256": weights, "build_s": round(time.monotonic() - t0, 3)}
        if weights != binding["model"]["weights_sha256"]:
            raise Invalid(
                "weights_mismatch",
                f"weights {weights} != bound {binding['model']['weights_sha256']}",
            )
        if made.get("expected_token_ids") != binding["correctness"]["expected_token_ids"]:
            # NB: the reference engine itself is not the bound one: nothing it says can be trusted
            raise Invalid(
                "reference_mismatch",
                "the reference engine's greedy tokens on the correctness prompts differ from "
                "the bound expected_token_ids: the serving environment is not the bound one",
            )
        run_binding, run_rows, run_data, pre_binding, pre_rows = fresh_workload(
            binding,
            pinned,
            pool,
            made.get("prompt_token_ids") or [],
            made.get("prompt_trusted") or [],
        )
        doc["fresh_prompts"] = {
            "drawn": len(pool),
            "fully_trusted": sum(
                int(t) >= int(r["output_length"])
                for t, r in zip(made["prompt_trusted"], pool, strict=True)
            ),
            "replayed": [r["text_input"] for r in run_rows],
            "asked_before": [r["text_input"] for r in pre_rows],
        }
        server = Server(env_dir, model, work, binding, flags, hidden_folders())
        doc["isolation"] = server.isolation
        doc["server_start_s"] = server.wait_ready()
        version = json.loads(http(f"{server.url}/version")).get("version")
        doc["engine"] = {
            "distribution": binding["engine"]["distribution"],
            "version": version,
            "argv": server.argv[1:],
        }
        if version != binding["engine"]["version"]:
            raise Invalid(
                "engine_mismatch",
                f"the server is vLLM {version}, bound {binding['engine']['version']}",
            )
        got = greedy(server, binding)
        diff = compare_tokens(binding["correctness"]["expected_token_ids"], got)
        doc["correctness"] = {"prompts": len(got), "tokens": sum(map(len, got)), "mismatch": diff}
        if diff is not None:
            raise Invalid("wrong_output", f"greedy tokens differ from the reference: {diff}")
        trace = parse_trace(run_data, run_binding)
        # NB: fresh prompts never replayed: asking the timed ones first would let a server
        # answer them later from what it kept
        doc["benchmark_sample"] = check_benchmark_sample(server, pre_binding, pre_rows)
        if step == "bench":
            doc["serving"] = run_aiperf(env_dir, server, model, work, run_binding, run_data)
            # NB: a second secret sample after the replay, of the replayed prompts themselves
            doc["benchmark_sample_after"] = check_benchmark_sample(server, run_binding, trace)
            goodput = doc["serving"]["goodput_tokens_per_s"]
            if doc["serving"]["objective"].get("note"):
                # NB: the harness shows an arm's note beside the verdict: which bound was missed
                doc["note"] = doc["serving"]["objective"]["note"]
            if not goodput > 0:
                # NB: no request met the objective: nothing to count, and the reason says which
                raise Invalid("objective_missed", doc["serving"]["objective"].get("note", ""))
            doc["samples"] = [goodput]
        doc["ok"] = True
    except Invalid as exc:
        doc["reason"] = {"code": exc.code, "detail": exc.detail[:2000]}
    finally:
        if server is not None:
            doc["teardown"] = server.stop()
            doc["server_log_tail"] = server.log_tail()
            if doc["teardown"]["left"]:
                doc["ok"] = False
                doc["reason"] = {
                    "code": "teardown_failed",
                    "detail": f"left {doc['teardown']['left']}",
                }
            elif doc["teardown"]["escaped"]:
                # NB: a process that left the server's group outlived it: the arm cannot count
                doc["ok"] = False
                doc["reason"] = {
                    "code": "escaped_process",
                    "detail": f"processes outside the server's group, ended: "
                    f"{doc['teardown']['escaped']}",
                }
        keep = os.environ.get("RSI_SERVE_KEEP")
        if keep:
            for name in ("server.log", "aiperf.log"):
                if (work / name).exists():
                    shutil.copy(work / name, Path(keep) / name)
        shutil.rmtree(work, ignore_errors=True)
    return doc


def hidden_folders() -> list[Path]:
    """The folders the server must not see: the arm's tree and the folder around it (the
    harness's pristine trees and logs), and the result file's folder."""
    out = [HERE, HERE.parent]
    result = os.environ.get(RESULT_VAR)
    if result:
        out.append(Path(result).resolve().parent)
    return out


def write_result(doc: dict) -> bool:
    """The arm's document into $RSI_RESULT_FILE (a folder only the harness and this judge can
    reach: the server cannot write or read it, unlike stdout); False when no file was asked."""
    path = os.environ.get(RESULT_VAR)
    if not path:
        return False
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)
    return True


def main() -> int:
    step = sys.argv[1] if len(sys.argv) > 1 else ""
    if step not in ("quality", "bench"):
        print("usage: serve_bench.py quality|bench", file=sys.stderr)
        return 2
    doc = arm(step)
    if write_result(doc):
        # NB: stdout is a log only: the harness reads the result file
        print(json.dumps({"result": os.environ[RESULT_VAR], "ok": doc["ok"]}))
    else:
        print(json.dumps(doc, sort_keys=True))
    if step == "bench" and not doc["ok"]:
        print(f"serve_bench: run invalid: {doc['reason']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
