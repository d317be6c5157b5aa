"""What each action was last built as, recorded by a run into the store's target index (keys,
description packs, attributes), and why a miss missed, by comparing descriptions. Must never
decide whether an action runs: a lost or unreadable record only weakens "why"."""

from __future__ import annotations

import time

from rsi.action import Action
from rsi.analysis import BuildGraph, _jsonable
from rsi.canonical import canonical_bytes
from rsi.errors import RsiError
from rsi.label import Label
from rsi.rule import ActionSpec
from rsi.store import LocalStore
from rsi.store_index import LazyIndex

# NB: descriptions per "why" pack blob: bounded, so reading one action's costs the same at any N
PACK_ACTIONS = 64


class ActionHistory:
    """One run's reader and writer of the target index: read shard by shard as actions are
    recorded or explained, never all of it; written once, by `flush`, when the run ends."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.index = LazyIndex(store.target_index)
        self.updates: dict[str, dict] = {}
        self.graph: BuildGraph | None = None
        self._pack: dict[str, dict] = {}
        self._targets_by_name: dict | None = None
        # NB: action key -> its description, made once for "why" and "record" (a root of
        # 10,000 inputs was described three times: ~50 ms each at 100,000 actions)
        self._described: dict[str, dict] = {}

    def _description(self, action: Action) -> dict:
        """`action.describe()`, once per key: the key is the digest of the description, so
        one key has one description."""
        key = str(action.key())
        got = self._described.get(key)
        if got is None:
            got = self._described[key] = action.describe()
        return got

    def why(self, spec: ActionSpec, action: Action) -> list[str]:
        last = self.index.get(spec.id)
        if last is None:
            return ["no earlier build of this action is recorded"]
        if last.get("key") == str(action.key()):
            return ["its cached result is missing or failed verification"]
        before, before_attrs = self.store.target_index.details(spec.id, last)
        if before is None:
            return ["the action changed (its earlier description is no longer in the store)"]
        reasons = diff_descriptions(before, self._description(action))
        if last.get("attrs") and last["attrs"] != spec.attrs_digest:
            now = self._attrs_of(spec)
            if before_attrs is None or now is None:
                reasons[:0] = ["target attributes changed"]
            else:
                reasons[:0] = [
                    f"attribute {k} changed"
                    for k in sorted(set(before_attrs) | set(now))
                    if before_attrs.get(k) != now.get(k)
                ]
        return reasons or ["the action changed"]

    def _attrs_of(self, spec: ActionSpec) -> dict | None:
        known = getattr(self.graph, "attrs_json", {}).get(spec.label)
        if known is not None:
            return known
        try:
            # NB: by its own label, not by listing every target: a graph from the analysis
            # cache unpickles a target only when it is looked at
            target = self.graph.targets.get(Label.parse(spec.label))
        except RsiError:
            target = None
        if target is None:
            if self._targets_by_name is None:
                self._targets_by_name = {str(k): t for k, t in self.graph.targets.items()}
            target = self._targets_by_name.get(spec.label)
        return _jsonable(target.attrs) if target is not None else None

    def record(self, spec: ActionSpec, action: Action) -> None:
        """Note that `spec` was built as `action` (written by `flush`)."""
        key = str(action.key())
        last = self.index.get(spec.id)
        if last is not None and last.get("key") == key:
            return
        # NB: descriptions and attributes go into one pack blob written when the run ends,
        # not one small file per action (file creation dominates on small VMs)
        attrs = None
        if last is not None and last.get("attrs") == spec.attrs_digest and spec.attrs_digest:
            # NB: the same attributes as last time, as recorded then ("why" read that pack
            # already): the target is not unpickled, nor its rule's code imported
            attrs = self.store.target_index.details(spec.id, last)[1]
        if attrs is None:
            attrs = self._attrs_of(spec)
        self._pack[spec.id] = {"description": self._description(action), "attrs": attrs}
        self._described.pop(key, None)
        entry = {
            "key": key,
            "pack": None,
            "attrs": spec.attrs_digest,
            "label": spec.label,
            "time": time.time(),
        }
        self.index[spec.id] = entry
        self.updates[spec.id] = entry

    def _write_pack(self) -> None:
        """The run's descriptions, in packs of at most `PACK_ACTIONS`: "why" for one action
        then parses one small pack, not every description a cold build of 100,000 wrote."""
        if not self._pack:
            return
        items = list(self._pack.items())
        self._pack = {}
        for start in range(0, len(items), PACK_ACTIONS):
            chunk = dict(items[start : start + PACK_ACTIONS])
            try:
                digest = str(self.store.put_bytes(canonical_bytes(chunk), fsync=False))
            except RsiError:
                for action_id in chunk:  # NB: "why" then says the description is gone
                    self.updates.pop(action_id, None)
                continue
            for action_id in chunk:
                if action_id in self.updates:
                    self.updates[action_id]["pack"] = digest

    def flush(self) -> None:
        """Write the run's description packs, then its index entries (naming the packs)."""
        self._write_pack()
        self.store.target_index.save(self.updates)


def diff_descriptions(before: dict, after: dict) -> list[str]:
    """Name each field that differs between two action descriptions."""
    reasons: list[str] = []
    b_in, a_in = before.get("inputs", {}), after.get("inputs", {})
    for path in sorted(set(b_in) | set(a_in)):
        if path not in b_in:
            reasons.append(f"input {path} added")
        elif path not in a_in:
            reasons.append(f"input {path} removed")
        elif b_in[path] != a_in[path]:
            old, new = b_in[path], a_in[path]
            if old[:2] != new[:2]:
                reasons.append(
                    f"input {path} content changed ({str(old[0])[:12]} -> {str(new[0])[:12]})"
                )
            else:
                reasons.append(f"input {path} executable bit changed")
    b_env, a_env = before.get("env", {}), after.get("env", {})
    for k in sorted(set(b_env) | set(a_env)):
        if b_env.get(k) != a_env.get(k):
            reasons.append(f"env {k} changed ({b_env.get(k)!r} -> {a_env.get(k)!r})")
    for name in ("argv", "outputs", "platform", "timeout_s", "salt", "digest_function"):
        if before.get(name) != after.get(name):
            if name == "salt":
                reasons.append("salt changed (every action key was invalidated)")
            else:
                reasons.append(f"{name} changed")
    return reasons
