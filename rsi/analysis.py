"""Analysis: targets become actions, in a target DAG and an action DAG.

Rules run here, in dependency order, each seeing only its attributes and its dependencies'
providers. Nothing is executed and no file content is read except through digests. Both graphs
are plain adjacency lists (rsi/dag.py); networkx views are made on demand, for `rsi query` and
`rsi graph`, never on the build path.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from rsi.digest import DEFAULT_FUNCTION, Digest, digest_value
from rsi.errors import DeclarationError
from rsi.label import Label
from rsi.record import Value
from rsi.sections import Packed, is_packed
from rsi.sections import raw as unpacked
from rsi.sharded import Sharded

if TYPE_CHECKING:
    # NB: imported where used: a graph loaded from the analysis cache needs neither the
    # loader (tomllib, the attribute schemas) nor the rules until a target is looked at
    import networkx as nx

    from rsi.loader import Loader, Target
    from rsi.rule import ActionSpec, Provider


class PickledValues(Mapping):
    """A mapping whose values stay pickled, one by one, until first read: a build served from
    the analysis cache that runs three actions of 100,000 unpickles three specs, not all.
    Objects of the `share` types many values hold (a target's rule) are pickled once, beside
    the values, not once in each."""

    __slots__ = ("_raw", "_shared", "_made")

    def __init__(self, raw: Mapping, shared: tuple | bytes = ()) -> None:
        self._raw = raw
        # NB: pickled (bytes) until a value needs them: reading the rules imports their code
        self._shared = shared
        self._made: dict = {}

    @classmethod
    def pack(cls, values: Mapping, share: tuple[type, ...] = ()) -> "PickledValues":
        if isinstance(values, PickledValues):
            return values
        if not share:
            dumps, protocol = pickle.dumps, pickle.HIGHEST_PROTOCOL
            return cls(Sharded.pack({k: dumps(v, protocol) for k, v in values.items()}))
        shared: list = []
        index: dict[int, int] = {}

        def persistent_id(obj: Any) -> int | None:
            if not isinstance(obj, share):
                return None
            at = index.get(id(obj))
            if at is None:
                at = index[id(obj)] = len(shared)
                shared.append(obj)
            return at

        buffer = io.BytesIO()
        raw = {}
        for k, v in values.items():
            buffer.seek(0)
            buffer.truncate()
            # NB: a pickler per value, not one with its memo cleared: clearing costs what the
            # largest value ever made the memo (CPython zeroes its whole table), so after the
            # root of 10,000 inputs each of 100,000 specs paid ~40 us (13 s per analysis)
            pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
            pickler.persistent_id = persistent_id  # type: ignore[method-assign]
            pickler.dump(v)
            raw[k] = buffer.getvalue()
        # NB: the raw values in shards too: 100,000 of them are not unpickled to read three
        return cls(Sharded.pack(raw), tuple(shared))

    def __getitem__(self, key: Any) -> Any:
        try:
            return self._made[key]
        except KeyError:
            pass
        raw = self._raw[key]
        if self._shared:
            if is_packed(self._shared):
                self._shared = pickle.loads(unpacked(self._shared))
            unpickler = pickle.Unpickler(io.BytesIO(raw))
            unpickler.persistent_load = self._shared.__getitem__  # type: ignore[union-attr]
            value = unpickler.load()
        else:
            value = pickle.loads(raw)
        self._made[key] = value
        return value

    def __iter__(self) -> Iterator:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __reduce__(self) -> tuple:
        shared = self._shared
        if shared and not is_packed(shared):
            shared = pickle.dumps(shared, pickle.HIGHEST_PROTOCOL)
        return (PickledValues, (self._raw, Packed(shared) if type(shared) is bytes else shared))


# NB: the BuildGraph fields a graph loaded from the analysis cache unpickles on first use
LAZY_FIELDS = ("targets", "providers", "target_actions", "actions", "preds", "succs")
SHARDED_FIELDS = ("targets", "providers", "actions", "preds", "succs")


class BuildGraph(Value):
    _fields = (
        "targets",
        "providers",
        "target_actions",
        "actions",
        "preds",
        "succs",
        "alias",
        "attrs_json",
        "target_graph",
        "action_graph",
    )

    def __init__(
        self,
        targets: dict[Label, Target] | None = None,
        providers: dict[Label, Provider] | None = None,
        target_actions: dict[Label, list[str]] | None = None,
        actions: dict[str, ActionSpec] | None = None,
        preds: dict[str, list[str]] | None = None,
        succs: dict[str, list[str]] | None = None,
        alias: dict[str, str] | None = None,
        attrs_json: dict[str, Any] | None = None,
        target_graph: "TargetGraph | None" = None,
        action_graph: "nx.DiGraph | None" = None,
    ) -> None:
        self.targets: dict[Label, Target] = {} if targets is None else targets
        self.providers: dict[Label, Provider] = {} if providers is None else providers
        self.target_actions: dict[Label, list[str]] = (
            {} if target_actions is None else target_actions
        )
        self.actions: dict[str, ActionSpec] = {} if actions is None else actions
        self.preds: dict[str, list[str]] = {} if preds is None else preds  # consumer -> producers
        self.succs: dict[str, list[str]] = {} if succs is None else succs  # producer -> consumers
        # NB: shared action id -> the one kept
        self.alias: dict[str, str] = {} if alias is None else alias
        # NB: label -> attributes as JSON, kept from hashing them for the scheduler's "why"
        # pack (derivable from `targets`, so not pickled into the analysis cache)
        self.attrs_json: dict[str, Any] = {} if attrs_json is None else attrs_json
        self.target_graph = target_graph  # NB: None when loaded from the analysis cache
        self.action_graph = action_graph  # NB: made by nx_action_graph()

    def producer(self, action_id: str) -> str:
        """The action that really runs for `action_id` (shared actions collapse into one)."""
        return self.alias.get(action_id, action_id)

    def actions_for(self, labels: Iterable[Label]) -> set[str]:
        """Every action needed to produce these targets' files (their producers, transitively)."""
        stack: list[str] = []
        for label in labels:
            stack.extend(self.target_actions.get(label, []))
            stack.extend(
                self.producer(a.producer) for a in self.providers[label].all_files if a.producer
            )
        wanted: set[str] = set()
        while stack:
            a = stack.pop()
            if a not in wanted:
                wanted.add(a)
                stack.extend(self.preds.get(a, ()))
        return wanted

    def descendants(self, action_id: str, within: set[str]) -> set[str]:
        found: set[str] = set()
        stack = list(self.succs.get(action_id, ()))
        while stack:
            a = stack.pop()
            if a in within and a not in found:
                found.add(a)
                stack.extend(self.succs.get(a, ()))
        return found

    def nx_action_graph(self) -> "nx.DiGraph":
        import networkx as nx

        if self.action_graph is None:
            g = nx.DiGraph()
            g.add_nodes_from(self.actions)
            g.add_edges_from((p, c) for c, ps in self.preds.items() for p in ps)
            self.action_graph = g
        return self.action_graph

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k != "_lazy"}
        lazy = dict(self.__dict__.get("_lazy") or {})
        state["target_graph"] = state["action_graph"] = None  # NB: keeps networkx out of loads
        state["attrs_json"] = {}
        # NB: each target, provider and action pickled on its own, read when first asked for
        from rsi.rule import Rule

        for name in ("targets", "providers", "actions"):
            if name in state:
                state[name] = PickledValues.pack(state[name], share=(Rule,))
        # NB: the edges in shards: a one-change build reads those of its dirty actions
        for name in ("preds", "succs"):
            if name in state:
                state[name] = Sharded.pack(state[name])
        # NB: and the other big field pickled apart, unpickled on first use (the targets'
        # action lists: at 100,000 targets, ~100 ms); those above are in shards already, each
        # in a section of its own in the analysis cache's file (rsi.sections), read when used
        for name in LAZY_FIELDS:
            if name in state and name not in SHARDED_FIELDS:
                lazy[name] = pickle.dumps(state.pop(name), pickle.HIGHEST_PROTOCOL)
        state["_lazy"] = {k: Packed(v) if type(v) is bytes else v for k, v in lazy.items()}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __getattr__(self, name: str) -> Any:
        # NB: only called for an attribute not set: a lazy field not read yet
        lazy = self.__dict__.get("_lazy")
        if lazy is not None:
            raw = lazy.get(name)
            if raw is not None:
                value = self.__dict__.setdefault(name, pickle.loads(unpacked(raw)))
                lazy.pop(name, None)
                return value
        raise AttributeError(name)


class TargetGraph(Value):
    """Targets and their dependency edges: `deps[t]` maps each dependency of t to the field
    that names it (edge direction: dependency -> dependent)."""

    _fields = ("deps", "dependents", "order")

    def __init__(
        self,
        deps: dict[Label, dict[Label, str]] | None = None,
        dependents: dict[Label, list[Label]] | None = None,
        order: list[Label] | None = None,
    ) -> None:
        self.deps: dict[Label, dict[Label, str]] = {} if deps is None else deps
        self.dependents: dict[Label, list[Label]] = {} if dependents is None else dependents
        self.order: list[Label] = [] if order is None else order  # NB: targets after their deps

    def __contains__(self, label: Label) -> bool:
        return label in self.deps

    def to_nx(self) -> "nx.DiGraph":
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from(self.deps)
        g.add_edges_from((d, t) for t, ds in self.deps.items() for d in ds)
        return g


def find_targets(loader: Loader, roots: list[Label]) -> tuple[dict[Label, Target], TargetGraph]:
    """Load the transitive targets of `roots` and their dependency edges; a cycle is an error."""
    from rsi.dag import Cycle, topological_order

    graph = TargetGraph()
    targets: dict[Label, Target] = {}
    stack: list[Label] = list(roots)
    for label in roots:
        targets[label] = loader.target(label)
        graph.deps.setdefault(label, {})
        graph.dependents.setdefault(label, [])
    while stack:
        label = stack.pop()
        target = targets[label]
        for name, a in target.rule.attrs.items():
            if not a.is_dependency:
                continue
            value = target.attrs.get(name)
            deps = [value] if a.kind == "label" and value is not None else list(value or ())
            for dep in deps:
                if dep not in targets:
                    targets[dep] = loader.target(dep, wanted_by=target, field=name)
                    graph.deps.setdefault(dep, {})
                    graph.dependents.setdefault(dep, [])
                    stack.append(dep)
                if dep not in graph.deps[label]:
                    graph.deps[label][dep] = name
                    graph.dependents[dep].append(label)
    try:
        graph.order = topological_order(graph.deps, graph.dependents)
    except Cycle as c:
        cycle = c.edges
        # NB: edges run dependency -> dependent; people read "a -> b" as "a depends on b"
        chain = [str(u) for u, _ in reversed(cycle)] + [str(cycle[-1][0])]
        dep, dependent = cycle[0]
        first = targets[dependent]
        raise DeclarationError(
            "dependency cycle: " + " -> ".join(chain),
            file=first.file,
            target=str(first.label),
            field=graph.deps[dependent][dep],
            hint="break the cycle by removing one of these dependencies",
        ) from None
    return targets, graph


def analyze(
    loader: Loader,
    roots: list[Label],
    *,
    store_put: Callable[[bytes], Digest],
    settings: Mapping[str, Any],
    tracker: Any = None,
    function: str = DEFAULT_FUNCTION,
) -> BuildGraph:
    from rsi.dag import Cycle, topological_order
    from rsi.rule import Provider, RuleContext

    targets, target_graph = find_targets(loader, roots)
    bg = BuildGraph(targets=targets, target_graph=target_graph)
    producers: dict[str, ActionSpec] = {}
    for label in target_graph.order:
        target = targets[label]
        deps = {d: bg.providers[d] for d in target_graph.deps[label]}
        ctx = RuleContext(
            label=label,
            rule=target.rule,
            attrs=target.attrs,
            workspace_root=loader.root,
            build_file=target.file,
            deps=deps,
            store_put=store_put,
            settings=settings,
            tracker=tracker,
        )
        provider = target.rule.impl(ctx)
        if not isinstance(provider, Provider):
            raise DeclarationError(
                f"rule {target.rule.name} returned {type(provider).__name__}, not a Provider",
                file=target.file,
                target=str(label),
            )
        # NB: only the digest here; the attributes themselves are kept, for "why", in the
        # scheduler's one pack per build, not as one small blob per target
        attrs = bg.attrs_json[str(label)] = _jsonable(target.attrs)
        attrs_digest = str(digest_value(attrs, function))
        ids = []
        for spec in ctx.actions:
            object.__setattr__(spec, "attrs_digest", attrs_digest)
            kept = _share_or_add(bg, spec, producers, targets)
            if kept not in ids:
                ids.append(kept)
        bg.target_actions[label] = ids
        bg.providers[label] = provider
    from rsi.executors.hoststep import PROVIDES_TOOLCHAIN

    preds: dict[str, set[str]] = {a: set() for a in bg.actions}
    # NB: an action runs after the step that builds its toolchain (the platform value names
    # the recipe; the step's `provides-toolchain` is that value): an edge without an input
    provided = {
        value: spec.id
        for spec in bg.actions.values()
        if (value := dict(spec.platform).get(PROVIDES_TOOLCHAIN))
    }
    for spec in bg.actions.values():
        for art in spec.inputs:
            if art.producer:
                producer = bg.producer(art.producer)
                if producer not in bg.actions:
                    raise DeclarationError(f"{spec.label}: input {art.path} has unknown producer")
                preds[spec.id].add(producer)
        step = provided.get(dict(spec.platform).get("toolchain", ""))
        if step is not None and step != spec.id:
            preds[spec.id].add(step)
    succs: dict[str, list[str]] = {a: [] for a in bg.actions}
    for consumer, ps in preds.items():
        for p in ps:
            succs[p].append(consumer)
    try:
        topological_order(bg.actions, succs)
    except Cycle as c:
        raise DeclarationError(f"action cycle: {c}") from None
    bg.preds = {a: sorted(ps) for a, ps in preds.items()}
    bg.succs = {a: sorted(cs) for a, cs in succs.items()}
    return bg


def _shape(bg: BuildGraph, spec: ActionSpec) -> tuple:
    inputs = tuple(
        (
            a.path,
            a.source,
            bg.producer(a.producer) if a.producer else None,
            a.digest,
            a.executable,
            a.symlink,
        )
        for a in spec.inputs
    )
    return (spec.argv, inputs, spec.outputs, spec.env, spec.platform, spec.timeout_s)


def _share_or_add(
    bg: BuildGraph, spec: ActionSpec, producers: dict[str, ActionSpec], targets: dict[Label, Target]
) -> str:
    """Add `spec`, or, when another target declared the very same action (same outputs, same
    everything), share that one: like Bazel's shared actions, it runs once. A different action
    writing the same path is a declaration error."""
    for path in spec.outputs:
        other = producers.get(path)
        if other is None:
            continue
        if _shape(bg, other) == _shape(bg, spec):
            bg.alias[spec.id] = other.id
            return other.id
        t = targets[Label.parse(spec.label)]
        raise DeclarationError(
            f"output {path} is also declared by {other.label}",
            file=t.file,
            target=spec.label,
            field="outs",
            hint="every output path must belong to one action",
        )
    for path in spec.outputs:
        producers[path] = spec
    bg.actions[spec.id] = spec
    return spec.id


def _jsonable(value: Any) -> Any:
    if isinstance(value, Label):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value
