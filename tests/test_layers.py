"""The import layers of docs/architecture.md ("Layers"), checked on the source: every import in
`rsi/` and `rules/`, those inside functions and under `if TYPE_CHECKING:` included, must point
down. A circle or an upward import fails with the modules and lines that make it."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]

# NB: lowest first; a module belongs to the first group whose prefix it starts with. A module may
# import its own group and any group listed before it, never one after it.
ENGINE = [
    (
        "values",
        (
            "=rsi",
            "rsi.errors",
            "rsi.canonical",
            "rsi.record",
            "rsi.dag",
            "rsi.label",
            "rsi.fsutil",
            "rsi.gc_policy",
            "rsi.digest",
            "rsi.sections",
            "rsi.sharded",
            "rsi.native",
            "rsi.attrs",
            "rsi.events",
            "rsi.host",
            "rsi.action",
            "rsi.rule",
            "rsi.registry",
            "rsi.toolchain.image",
            "rsi.toolchain.lock",
            "rsi.toolchain.recipe",
            "rsi.toolchain.tarball",
            "rsi.remote._proto",
            "rsi.jobs.db",
            "rsi.jobs.events",
        ),
    ),
    (
        "store",
        ("rsi.store_folder", "rsi.store_roots", "rsi.store_index", "rsi.store", "rsi.cacheops"),
    ),
    ("executors", ("rsi.limits", "rsi.executors", "rsi.toolchain", "rsi.remote.client")),
    ("workspace", ("rsi.workspace", "rsi.loader", "rsi.remote", "rsi.runtime", "rsi.worker")),
    (
        "scheduler",
        (
            "rsi.analysis",
            "rsi.group_commit",
            "rsi.lock_wait",
            "rsi.action_history",
            "rsi.scheduler",
            "rsi.query",
            "rsi.side_check",
            "rsi.incremental",
            "rsi.analysis_cache",
            "rsi.watch",
        ),
    ),
    (
        "build",
        (
            "rsi.interrupt",
            "rsi.build_executor",
            "rsi.build_analysis",
            "rsi.build_housekeeping",
            "rsi.build_output",
            "rsi.build",
            "rsi.wslock",
            "rsi.recheck",
            "rsi.inputs",
            "rsi.why",
        ),
    ),
    ("commands", ("rsi.buildcmd", "rsi.server", "rsi.jobs", "rsi.info", "rsi.cli", "rsi.entry")),
]
CAMPAIGN = [
    ("values", ("rules.campaign.log", "rules.campaign.paths", "rules.campaign.usage")),
    ("model", ("rules.campaign.model",)),
    ("evidence", ("rules.campaign.snapshot", "rules.campaign.judging", "rules.campaign.knowledge")),
    ("rules", ("rules.campaign.rule_common", "rules.campaign.project_rules")),
    (
        "documents",
        (
            "rules.campaign.documents",
            "rules.campaign.start",
            "rules.campaign.round_rules",
            "rules.campaign.final_rules",
            "rules.campaign.output_rules",
            "rules.campaign.declaration",
            "rules.campaign.targets",
        ),
    ),
    (
        "operations",
        ("rules.campaign.agents", "rules.campaign.live", "rules.campaign.preflight"),
    ),
    ("service", ("rules.campaign.consult", "rules.campaign.service", "rules.campaign.jobs")),
    ("package", ("=rules.campaign",)),
]
ADAPTERS = ("rules.cli_support", "rules.mcp_server", "rules.register")
# NB: the sandboxed harness (rules/harness/) loads its siblings by path, not by import: its
# layers are read from those loads (`load_siblings("a", "b")`, `_load_sibling("a")`, ...)
HARNESS = [
    (
        "values",
        ("siblings", "confine", "_core", "_common", "imports", "stats", "sequential", "proctree"),
    ),
    ("protocol", ("referee_protocol",)),
    ("sandbox", ("isolation", "referee_timing")),
    ("referee", ("referee", "mr_sandbox")),
    ("judging", ("check", "measure_judge", "measure_doc", "mr_task", "mr_lockstep")),
    ("arms", ("measure_arm", "mr_arm", "mr_check")),
    ("driving", ("measure_run", "mr_measure")),
    ("commands", ("measure", "multirank")),
]
HARNESS_LOADS = (
    re.compile(r'_load\("[^"]*",\s*"(\w+)"\)'),
    re.compile(r'_load_sibling\("(\w+)"\)'),
    re.compile(r'_sibling\("(\w+)"\)'),
    re.compile(r'/ "(\w+)\.py"'),
)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in ("rsi", "rules"):
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def import_graph() -> nx.DiGraph:
    """module -> module it imports, each edge with the (file, line) of one import that makes it."""
    mods = _modules()
    graph = nx.DiGraph()
    for mod, path in mods.items():
        graph.add_node(mod)
        package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.split(".")[: len(mod.split(".")) - (0 if package else 1)]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = _resolve(name, mods)
                if target and target != mod and not graph.has_edge(mod, target):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    graph.add_edge(mod, target, where=where)
    return graph


def _group(mod: str, layers) -> int | None:
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if mod == p.lstrip("=") or (not p.startswith("=") and mod.startswith(p + ".")):
                return i
    return None


@pytest.mark.fast
def test_no_import_circle_anywhere():
    graph = import_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    detail = [
        f"{a} -> {b} ({graph.edges[a, b]['where']})"
        for c in circles
        for a in c
        for b in graph.successors(a)
        if b in c
    ]
    assert not circles, "import circles:\n" + "\n".join(detail)


@pytest.mark.parametrize("layers", [ENGINE, CAMPAIGN], ids=["engine", "campaign"])
@pytest.mark.fast
def test_every_import_points_down(layers):
    graph = import_graph()
    prefix = "rsi" if layers is ENGINE else "rules.campaign"
    # NB: the graph is shared between tests (functools.cache): never change it here
    upward = []
    for mod in graph:
        if not (mod == prefix or mod.startswith(prefix + ".")):
            continue
        here = _group(mod, layers)
        assert here is not None, f"{mod} is in no layer of tests/test_layers.py"
        for dep in graph.successors(mod):
            there = _group(dep, layers)
            if there is not None and there > here:
                upward.append(
                    f"{mod} ({layers[here][0]}) -> {dep} ({layers[there][0]}): "
                    f"{graph.edges[mod, dep]['where']}"
                )
    assert not upward, "upward imports:\n" + "\n".join(upward)


@pytest.mark.fast
def test_packages_keep_their_borders():
    graph = import_graph()
    bad = []
    for a, b in graph.edges:
        where = graph.edges[a, b]["where"]
        if a.startswith("rsi") and b.startswith("rules"):
            bad.append(f"the engine imports a rule family: {a} -> {b} ({where})")
        if a.startswith("rules.harness") and not b.startswith("rules.harness"):
            bad.append(f"a sandboxed harness script imports {b}: {a} ({where})")
        if a.startswith("rules.campaign.") and (b in ADAPTERS or b.endswith("_cli")):
            bad.append(f"the campaign package imports an adapter: {a} -> {b} ({where})")
    assert not bad, "\n".join(bad)


@pytest.mark.fast
def test_the_checker_sees_imports_inside_functions(tmp_path):
    # NB: the graph must count an import hidden in a function body, or a circle dodged that way
    # would pass unseen
    graph = import_graph()
    assert graph.has_edge("rules.mcp_server", "rules.cli_support")
    src = (ROOT / "rules" / "mcp_server.py").read_text()
    line = graph.edges["rules.mcp_server", "rules.cli_support"]["where"].rsplit(":", 1)[1]
    assert src.splitlines()[int(line) - 1].startswith("    "), "expected a function-level import"


@pytest.mark.fast
def test_every_module_says_what_it_owns_and_must_never_do():
    missing = []
    for _mod, path in sorted(_modules().items()):
        if "_proto" in path.parts:
            continue  # NB: generated protobuf code
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if not doc or not any(w in doc.lower() for w in ("never", "must not", "nothing")):
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"{len(missing)} modules open with no 'owns / must never' lines: {missing}"


def harness_graph() -> nx.DiGraph:
    """harness module -> the sibling it loads by path (worker scripts it starts included)."""
    folder = ROOT / "rules" / "harness"
    stems = {p.stem for p in folder.glob("*.py")}
    graph = nx.DiGraph()
    for path in folder.glob("*.py"):
        text = path.read_text()
        found = {m for rx in HARNESS_LOADS for m in rx.findall(text)}
        for args in re.findall(r"load_siblings\(([^)]*)\)", text):
            found |= set(re.findall(r'"(\w+)"', args))
        graph.add_node(path.stem)
        graph.add_edges_from((path.stem, m) for m in found & stems if m != path.stem)
    return graph


@pytest.mark.fast
def test_the_harness_loads_its_siblings_downwards_only():
    graph = harness_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not circles, f"harness modules that load each other: {circles}"
    layer = {m: i for i, (_, mods) in enumerate(HARNESS) for m in mods}
    upward = [
        f"{a} ({HARNESS[layer[a]][0]}) loads {b} ({HARNESS[layer[b]][0]})"
        for a, b in graph.edges
        if a in layer and b in layer and layer[b] > layer[a]
    ]
    assert not upward, "upward loads in rules/harness:\n" + "\n".join(upward)
    assert graph.has_edge("mr_check", "check") and graph.has_edge("referee", "siblings")


@pytest.mark.fast
def test_no_module_shadows_the_standard_library():
    """A script's folder comes first on sys.path unless Python runs with -I: the harness's
    `select.py` made every harness script run as `python rules/harness/x.py` import it in place
    of the stdlib's `select` (through subprocess and selectors) and die before judging. The
    folders whose files run as scripts (the harness, the tasks' files) are held to it; a
    package's module (rsi.jobs.profile) is imported by its dotted name and shadows nothing."""
    import sys

    folders = [ROOT / "rules" / "harness", ROOT / "tasks"]
    shadows = sorted(
        str(p.relative_to(ROOT))
        for top in folders
        for p in top.rglob("*.py")
        if p.stem in sys.stdlib_module_names and ".venv" not in p.parts
    )
    assert shadows == []
