"""Knowledge capture: `rsi campaign knowledge CAMPAIGN QUERY` retrieves from the campaign's
declared knowledge sources within a context budget and records what it returned.

Sources (the campaign's `knowledge = {sources = [...], budget_chars = N, enabled = true}`):

- `docs`: the task's declared docs (TASK.md, …);
- `evidence`: what earlier rounds of every campaign of this store under the same binding
  tried and got (hypothesis, verdict, speedup, reasons, review), from their logs and their
  last round documents;
- `notes`: each campaign's `notes.md` beside its log, if a team adds one;
- any other entry: a file or folder (`dir/`) relative to the campaign's package, added by a
  team.

Retrieval is deterministic: every source is cut into chunks (by Markdown heading and
paragraph), scored by BM25 against the query, and returned best first while they fit the
budget (characters). The record (rsi.knowledge/1: the query, each source's content digest and
version, every returned chunk's digest and text, every chunk the budget cut) is a blob in the
store; a `knowledge` log entry names it, and the next candidate's entry (and so its round
document) references it: a verdict's evidence says what context the agent was given.
Retrieval returns material; it never claims the agent used it.

The knowledge policy is fixed at the campaign's start (recorded in the start entry): switching
it later is refused like any change of budget — it is a new campaign.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from rsi.errors import DeclarationError
from rules.campaign.log import Attempts, CampaignLog
from rules.campaign.model import Campaign, knowledge_policy, state_of, task_target

RECORD_SCHEMA = "rsi.knowledge/1"
RESULT_SCHEMA = "rsi.campaign.knowledge/1"
KEYWORDS = ("docs", "evidence", "notes")
CHUNK_CHARS = 1500
WORD = re.compile(r"[a-z0-9_]+")


def recorded_policy(camp: Campaign, state) -> dict:
    """The policy fixed at the start (the declared one before the start; a log from before
    knowledge existed: the declared one)."""
    declared = knowledge_policy(camp.target.attrs, camp.target.file, str(camp.label))
    was = (state.start or {}).get("knowledge")
    if was is None:
        return declared
    if was != declared:
        changed = sorted(k for k in set(was) | set(declared) if was.get(k) != declared.get(k))
        raise DeclarationError(
            f"the campaign's knowledge policy changed since it started ({', '.join(changed)}); "
            "it is fixed at the start: switching knowledge on or off is a new campaign",
            file=camp.target.file,
            target=str(camp.label),
            field="knowledge",
            hint=f"restore knowledge = {json.dumps(was, sort_keys=True)}, or declare a new "
            "campaign",
        )
    return was


# ================================================================================== sources


def chunks_of(text: str) -> list[str]:
    """Markdown cut at headings, then at blank lines, each at most CHUNK_CHARS."""
    sections, current = [], []
    for line in text.splitlines():
        if line.startswith("#") and current:
            sections.append("\n".join(current))
            current = []
        current.append(line)
    if current:
        sections.append("\n".join(current))
    out = []
    for section in sections:
        buf = ""
        for para in re.split(r"\n\s*\n", section):
            para = para.strip()
            if not para:
                continue
            if buf and len(buf) + len(para) + 2 > CHUNK_CHARS:
                out.append(buf)
                buf = ""
            buf = f"{buf}\n\n{para}" if buf else para
            while len(buf) > CHUNK_CHARS:
                out.append(buf[:CHUNK_CHARS])
                buf = buf[CHUNK_CHARS:]
        if buf:
            out.append(buf)
    return out


def _file_source(name: str, kind: str, path: Path, shown: str) -> dict:
    data = path.read_bytes()
    return {
        "source": name,
        "kind": kind,
        "path": shown,
        "sha256": hashlib.sha256(data).hexdigest(),
        "text": data.decode(errors="replace"),
    }


def _evidence_text(camp: Campaign) -> list[dict]:
    """What earlier rounds under this binding tried and got, one source per campaign."""

    out = []
    root = camp.log.store_root / "campaigns"
    binding = str(camp.binding.label)
    for meta in sorted(root.glob("*/campaign.json")):
        try:
            label = json.loads(meta.read_text())["label"]
            log = CampaignLog(camp.log.store_root, label)
            entries = log.read()
        except (OSError, ValueError, KeyError, DeclarationError):
            continue
        state = state_of(entries)
        if (state.start or {}).get("binding") not in (binding, None) or not state.candidates:
            continue
        last = Attempts(log).read()
        lines = [f"# Evidence of {label}"]
        for n, cand in enumerate(state.candidates, 1):
            view = (last.get(f"round-{n}") or {}).get("verdict_doc") or {}
            speed = (view.get("speedup") or {}).get("point")
            reasons = ", ".join(
                r if isinstance(r, str) else str(r.get("code")) for r in view.get("reasons") or []
            )
            lines.append(
                f"\nround {n}: hypothesis: {cand.get('hypothesis') or '(none)'}; verdict "
                f"{view.get('verdict') or 'unknown'}"
                + (f", speedup {speed:.3f}x" if isinstance(speed, (int, float)) else "")
                + (f"; reasons {reasons}" if reasons else "")
            )
        text = "\n".join(lines)
        out.append(
            {
                "source": f"evidence:{label}",
                "kind": "evidence",
                "path": str(log.path),
                "sha256": hashlib.sha256(text.encode()).hexdigest(),
                "version": len(entries),
                "text": text,
            }
        )
    return out


def gather(camp: Campaign, policy: dict) -> list[dict]:

    found: list[dict] = []
    pkg = Path(camp.ws.root) / camp.label.package
    for name in policy["sources"]:
        if name == "docs":
            task = task_target(camp)
            if task is not None:
                folder = Path(camp.ws.root) / task.label.package
                for doc in task.attrs.get("docs") or []:
                    path = folder / doc
                    if path.is_file() and path.suffix in (".md", ".txt", ""):
                        found.append(
                            _file_source(f"docs:{doc}", "docs", path, f"{task.label.package}/{doc}")
                        )
        elif name == "evidence":
            found += _evidence_text(camp)
        elif name == "notes":
            root = camp.log.store_root / "campaigns"
            for notes in sorted(root.glob("*/notes.md")):
                found.append(
                    _file_source(f"notes:{notes.parent.name[:12]}", "notes", notes, str(notes))
                )
        else:
            rel = Path(name)
            if rel.is_absolute() or ".." in rel.parts:
                raise DeclarationError(
                    f"knowledge source {name!r} must be a path inside the campaign's package",
                    file=camp.target.file,
                    target=str(camp.label),
                    field="knowledge",
                )
            path = pkg / rel
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for f in files:
                if f.is_file():
                    shown = f.relative_to(Path(camp.ws.root)).as_posix()
                    found.append(_file_source(f"file:{shown}", "file", f, shown))
    return found


# ================================================================================ retrieval


def _words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def bm25(query: str, docs: list[str], k1: float = 1.5, b: float = 0.75) -> list[float]:
    terms = sorted(set(_words(query)))
    toks = [_words(d) for d in docs]
    n = len(docs)
    if not n or not terms:
        return [0.0] * n
    avg = sum(len(t) for t in toks) / n or 1.0
    df = {t: sum(1 for d in toks if t in d) for t in terms}
    scores = []
    for d in toks:
        counts: dict[str, int] = {}
        for w in d:
            counts[w] = counts.get(w, 0) + 1
        s = 0.0
        for t in terms:
            f = counts.get(t, 0)
            if not f:
                continue
            idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            s += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(d) / avg))
        scores.append(round(s, 6))
    return scores


def retrieve(query: str, sources: list[dict], budget: int) -> dict:
    """The chunks that match `query`, best first, within `budget` characters; the rest of the
    matching chunks are `cut` (named by digest, never returned)."""
    chunks = []
    for src in sources:
        for i, text in enumerate(chunks_of(src["text"])):
            chunks.append({"source": src["source"], "chunk": i, "text": text})
    scores = bm25(query, [c["text"] for c in chunks])
    ranked = sorted(
        (dict(c, score=s) for c, s in zip(chunks, scores, strict=True) if s > 0),
        key=lambda c: (-c["score"], c["source"], c["chunk"]),
    )
    returned, cut, used = [], [], 0
    for c in ranked:
        entry = {
            "source": c["source"],
            "chunk": c["chunk"],
            "sha256": hashlib.sha256(c["text"].encode()).hexdigest(),
            "chars": len(c["text"]),
            "score": c["score"],
        }
        if used + len(c["text"]) <= budget:
            used += len(c["text"])
            returned.append(dict(entry, text=c["text"]))
        else:
            cut.append(dict(entry, why=f"over the budget ({used} of {budget} chars used)"))
    return {
        "returned": returned,
        "cut": cut,
        "used_chars": used,
        "n_chunks": len(chunks),
        "n_matching": len(ranked),
    }


def pending_records(entries: list[dict], session: str | None) -> list[str]:
    """The knowledge records retrieved since the last candidate (by this session, or by
    anyone when the candidate names none): what the next candidate's round references."""
    since = 0
    for i, e in enumerate(entries):
        if e.get("kind") == "candidate" and (session is None or e.get("session") == session):
            since = i + 1
    return [
        e["record"]
        for e in entries[since:]
        if e.get("kind") == "knowledge"
        and isinstance(e.get("record"), str)
        and (session is None or e.get("session") == session)
    ]


def start_fields(camp: Campaign) -> dict[str, Any]:
    """What the start entry records of knowledge: the policy, fixed from then on."""
    return {"knowledge": knowledge_policy(camp.target.attrs, camp.target.file, str(camp.label))}
