"""Loading BUILD.toml declarations: data only, validated, with errors naming file, target, field.

The property-based tests throw malformed declarations at the loader and analysis: every one must
end in an `RsiError` with a message, never in another exception.
"""

from __future__ import annotations

import json
import math
import os
import tomllib

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rsi.analysis import analyze
from rsi.digest import digest_bytes
from rsi.errors import DeclarationError, LabelError, RsiError
from rsi.label import Label
from rsi.loader import Loader
from rsi.registry import load_rules

RULES = load_rules()


def _loader(ws) -> Loader:
    return Loader(ws, RULES)


def _analyze(ws, *labels: str):
    loader = _loader(ws)
    roots = [Label.parse(lb) for lb in labels]
    return analyze(loader, roots, store_put=digest_bytes, settings={})


def _rel(ws, file: str) -> str:
    """A file an error names, relative to the workspace (errors name it relative to the cwd)."""
    return os.path.relpath(os.path.abspath(file), ws)


def _error(ws, *labels: str) -> DeclarationError:
    with pytest.raises(DeclarationError) as info:
        _analyze(ws, *labels)
    return info.value


# ------------------------------------------------------------------------------ the happy path


@pytest.mark.fast
def test_each_top_level_table_is_one_validated_target(command, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("a", cmd="echo > $(OUT)", outs=["a"])
            + command(
                "b", cmd="cat $(SRCS) > $(OUT)", outs=["b"], srcs=["in.txt"], deps=[":a"], timeout=5
            ),
            "in.txt": "x",
        },
    )
    targets = _loader(ws).package("")
    assert set(targets) == {"a", "b"}
    b = targets["b"]
    assert b.rule.name == "command"
    assert b.attrs["deps"] == (Label("", "a"),)
    assert b.attrs["timeout"] == 5.0 and isinstance(b.attrs["timeout"], float)
    assert targets["a"].attrs["srcs"] == () and targets["a"].attrs["env"] == {}
    assert b.deps() == [Label("", "a")]


@pytest.mark.fast
def test_analysis_turns_targets_into_an_action_graph(command, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("a", cmd="echo > $(OUT)", outs=["a"])
            + command("b", cmd="cat $(location :a) > $(OUT)", outs=["b"], deps=[":a"])
        },
    )
    graph = _analyze(ws, "//:b")
    assert set(graph.actions) == {"//:a#Command", "//:b#Command"}
    assert list(graph.nx_action_graph().edges) == [("//:a#Command", "//:b#Command")]
    assert graph.actions["//:b#Command"].argv[-1] == "cat a > b"


# -------------------------------------------------------------------- errors name the culprit


@pytest.mark.fast
def test_unknown_rule_names_file_target_and_field_and_suggests(make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": '[t]\nrule = "comand"\nouts = ["o"]\n'})
    err = _error(ws, "//:t")
    assert (_rel(ws, err.file), err.target, err.field) == ("BUILD.toml", "//:t", "rule")
    assert "unknown rule 'comand'" in str(err) and "did you mean 'command'" in str(err)


@pytest.mark.fast
def test_missing_rule_lists_known_rules(make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": '[t]\nouts = ["o"]\n'})
    err = _error(ws, "//:t")
    assert err.field == "rule" and "command" in str(err)


@pytest.mark.fast
def test_unknown_attribute_suggests_the_close_match(make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path, {"BUILD.toml": '[t]\nrule = "command"\noutz = ["o"]\ncmd = "x"\n'}
    )
    err = _error(ws, "//:t")
    assert (err.target, err.field) == ("//:t", "outz")
    assert "unknown attribute" in str(err) and "did you mean 'outs'" in str(err)


@pytest.mark.fast
@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("outs", '"o"', "expected a list of strings, got a string"),
        ("timeout", '"10"', "expected a number, got a string"),
        ("timeout", "true", "expected a number, got true or false"),
        ("deps", "[1]", "expected a list of label strings"),
        ("env", "{ X = 1 }", "expected a table of strings"),
        ("cmd", "[]", "expected a string, got a list"),
    ],
)
def test_wrong_type_names_the_field_and_both_types(
    make_workspace,
    tmp_path,
    field,
    value,
    expected,
):
    attrs = {"outs": '["o"]', "cmd": '"x"', field: value}
    body = "".join(f"{k} = {v}\n" for k, v in attrs.items())
    ws = make_workspace(tmp_path, {"BUILD.toml": f'[t]\nrule = "command"\n{body}'})
    err = _error(ws, "//:t")
    assert (_rel(ws, err.file), err.target, err.field) == ("BUILD.toml", "//:t", field)
    assert expected in str(err)


@pytest.mark.fast
def test_missing_required_attribute_is_named(make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": '[t]\nrule = "command"\nouts = ["o"]\n'})
    err = _error(ws, "//:t")
    assert err.field == "cmd" and "required" in str(err)


@pytest.mark.fast
def test_missing_dependency_suggests_close_matches(command, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("alpha", cmd="x", outs=["a"], deps=[":alpah"])
            + command("alpha2", cmd="x", outs=["b"])
        },
    )
    err = _error(ws, "//:alpha")
    assert (err.target, err.field) == ("//:alpha", "deps")
    assert "dependency //:alpah does not exist" in str(err)
    assert "//:alpha2" in str(err)


@pytest.mark.fast
def test_dependency_on_a_missing_package_suggests_close_packages(command, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("t", cmd="x", outs=["o"], deps=["//tasks/softmx:x"]),
            "tasks/softmax/BUILD.toml": command("x", cmd="x", outs=["x"]),
        },
    )
    err = _error(ws, "//:t")
    assert err.field == "deps" and "//tasks/softmx:x" in str(err)
    assert "//tasks/softmax" in str(err)


@pytest.mark.fast
def test_dependency_cycle_is_printed(command, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("a", cmd="x", outs=["a"], deps=[":b"])
            + command("b", cmd="x", outs=["b"], deps=[":c"])
            + command("c", cmd="x", outs=["c"], deps=[":a"])
        },
    )
    err = _error(ws, "//:a")
    message = str(err)
    assert "dependency cycle" in message
    chain = message.split("dependency cycle: ")[1].splitlines()[0].split(" -> ")
    assert set(chain) == {"//:a", "//:b", "//:c"} and chain[0] == chain[-1] and len(chain) == 4
    assert _rel(ws, err.file) == "BUILD.toml" and err.field == "deps"


@pytest.mark.fast
def test_self_dependency_is_a_cycle(command, make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": command("a", cmd="x", outs=["a"], deps=[":a"])})
    assert "dependency cycle: //:a -> //:a" in str(_error(ws, "//:a"))


@pytest.mark.fast
def test_duplicate_target_says_so_clearly(command, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path,
        {"BUILD.toml": command("a", cmd="x", outs=["a"]) + command("a", cmd="y", outs=["b"])},
    )
    err = _error(ws, "//:a")
    assert _rel(ws, err.file) == "BUILD.toml" and err.target == "//:a"
    assert "target 'a' is declared twice" in str(err)
    assert "line 6" in str(err)


@pytest.mark.fast
def test_top_level_value_that_is_not_a_table_is_rejected(make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": 'rule = "command"\n'})
    with pytest.raises(DeclarationError, match="not a target table"):
        _loader(ws).package("")


@pytest.mark.fast
def test_invalid_toml_names_the_file(make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"pkg/BUILD.toml": "[t\nrule = 'command'\n"})
    with pytest.raises(DeclarationError, match="pkg/BUILD.toml: not valid TOML"):
        _loader(ws).package("pkg")


@pytest.mark.fast
def test_non_utf8_declaration_is_a_declaration_error(make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": b"[t]\nrule = '\xff'\n"})
    with pytest.raises(DeclarationError, match="BUILD.toml"):
        _loader(ws).package("")


@pytest.mark.fast
def test_deeply_nested_values_are_a_declaration_error(make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": "x = " + "[" * 5000 + "]" * 5000 + "\n"})
    with pytest.raises(DeclarationError, match="nested too deeply"):
        _loader(ws).package("")


@pytest.mark.fast
def test_overlong_source_name_is_a_declaration_error(command, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path, {"BUILD.toml": command("t", cmd="x", outs=["o"], srcs=["s" * 300])}
    )
    err = _error(ws, "//:t")
    assert err.field == "srcs"


@pytest.mark.fast
def test_source_outside_the_package_is_rejected(command, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path,
        {"secret": "s", "pkg/BUILD.toml": command("t", cmd="x", outs=["o"], srcs=["../secret"])},
    )
    err = _error(ws, "//pkg:t")
    assert err.field == "srcs" and "outside the package" in str(err)


@pytest.mark.fast
def test_output_outside_the_package_is_rejected(command, make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"pkg/BUILD.toml": command("t", cmd="x", outs=["../o"])})
    assert _error(ws, "//pkg:t").field == "outs"


@pytest.mark.fast
def test_unknown_make_variable_is_named(command, make_workspace, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": command("t", cmd="echo $(NOPE)", outs=["o"])})
    err = _error(ws, "//:t")
    assert err.field == "cmd" and "$(NOPE)" in str(err)


@pytest.mark.fast
def test_location_of_something_not_declared_is_named(command, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path, {"BUILD.toml": command("t", cmd="cat $(location :zz)", outs=["o"])}
    )
    err = _error(ws, "//:t")
    assert err.field == "cmd" and ":zz" in str(err)


# ------------------------------------------------------------------------- declarations are data


@pytest.mark.fast
def test_a_build_file_cannot_run_code(make_workspace, tmp_path):
    sentinel = tmp_path / "pwned"
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": f"""
        [t]
        rule = "__import__('os').system('touch {sentinel}')"
        outs = ["o"]
        cmd = "touch {sentinel}"

        [u]
        rule = "rules.command:_command"
        outs = ["o"]
        cmd = "touch {sentinel}"
    """
        },
    )
    for name in ("t", "u"):
        with pytest.raises(DeclarationError, match="unknown rule"):
            _analyze(ws, f"//:{name}")
    assert not sentinel.exists()


@pytest.mark.fast
def test_loading_and_analysis_never_run_a_command(command, make_workspace, run_rsi, tmp_path):
    sentinel = tmp_path / "ran"
    ws = make_workspace(tmp_path, {"BUILD.toml": command("t", cmd=f"touch {sentinel}", outs=["o"])})
    _analyze(ws, "//:t")
    for args in (["query", "//..."], ["graph", "//:t"], ["graph", "--actions", "//:t"]):
        assert run_rsi(ws, *args).returncode == 0
    assert not sentinel.exists()


# ---------------------------------------------------------------------- CLI: exit code 2


@pytest.mark.fast
@pytest.mark.parametrize(
    "build_toml,needle",
    [
        ('[t]\nrule = "comand"\n', "did you mean 'command'"),
        ('[t]\nrule = "command"\nouts = ["o"]\ncmd = "x"\nsrcz = []\n', "did you mean 'srcs'"),
        ('[t]\nrule = "command"\nouts = "o"\ncmd = "x"\n', "field 'outs'"),
        (
            '[t]\nrule = "command"\nouts = ["o"]\ncmd = "x"\ndeps = [":tt"]\n',
            "//:tt does not exist",
        ),
        ('[t]\nrule = "command"\nouts = ["o"]\ncmd = "x"\ndeps = [":t"]\n', "dependency cycle"),
        ('[t]\nrule = "command"\n\n[t]\nrule = "command"\n', "declared twice"),
        ("[t\n", "not valid TOML"),
    ],
)
def test_cli_exits_2_on_declaration_errors_with_a_clear_message(
    make_workspace,
    run_rsi,
    tmp_path,
    build_toml,
    needle,
):
    ws = make_workspace(tmp_path, {"BUILD.toml": build_toml})
    run = run_rsi(ws, "build", "//:t")
    assert run.returncode == 2, run
    assert needle in run.stderr
    assert "BUILD.toml" in run.stderr
    assert "Traceback" not in run.stderr


# --------------------------------------------------------------------- property-based: fuzzing

_ATTR_NAMES = ["srcs", "deps", "outs", "cmd", "env", "timeout", "tags", "doc"]
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_SCALAR = st.one_of(_TEXT, st.integers(), st.floats(allow_nan=False), st.booleans())
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)
_LABELS = (
    st.sampled_from(
        [
            ":t0",
            ":t1",
            "//:t0",
            "//sub:x",
            "//sub:y",
            ":missing",
            "//nope:x",
            "t0",
            "//a/../b:c",
            ":",
            "//:t0:x",
            "//sub",
            "//...",
            ":all",
        ]
    )
    | _TEXT
)
_PLAUSIBLE = {
    "rule": st.sampled_from(["command", "comand", "", "os.system"]),
    "srcs": st.lists(
        st.sampled_from(
            [
                "a.txt",
                "missing.txt",
                "../a.txt",
                "/etc/passwd",
                "",
                ".",
                "sub",
                "sub/BUILD.toml",
                "a" * 300,
            ]
        )
        | _TEXT,
        max_size=3,
    ),
    "deps": st.lists(_LABELS, max_size=3),
    "outs": st.lists(
        st.sampled_from(["o", "o/p", "../x", "/abs", "", ".", "a.txt"]) | _TEXT, max_size=3
    ),
    "cmd": st.lists(
        st.sampled_from(
            [
                "echo",
                "$(SRCS)",
                "$(OUTS)",
                "$(OUT)",
                "$(location :t0)",
                "$(location a.txt)",
                "$(location)",
                "$(NOPE)",
                "$(",
                ">",
                "$(locations //sub:x)",
                "$(PKG)",
            ]
        )
        | _TEXT,
        max_size=5,
    ).map(" ".join),
    "env": st.dictionaries(_TEXT, _TEXT, max_size=2),
    "timeout": st.floats(allow_nan=False) | st.integers(),
    "tags": st.lists(_TEXT, max_size=2),
    "doc": _TEXT,
}
_NEARLY_VALID = st.fixed_dictionaries(
    {
        "rule": st.just("command"),
        "outs": st.lists(
            st.sampled_from(["o", "p", "o/q", "a.txt", ".", ""]),
            min_size=1,
            max_size=2,
            unique=True,
        ),
        "cmd": _PLAUSIBLE["cmd"],
    },
    optional={
        "srcs": st.lists(
            st.sampled_from(["a.txt", "missing.txt", "sub", "sub/BUILD.toml"]),
            max_size=2,
            unique=True,
        ),
        "deps": st.lists(
            st.sampled_from([":t0", ":t1", ":t2", "//sub:x", "//sub:y"]), max_size=2, unique=True
        ),
        "env": st.dictionaries(_TEXT, _TEXT, max_size=2),
        "timeout": st.floats(allow_nan=False) | st.integers(),
        "tags": st.lists(st.sampled_from(["exclusive", "x"]), max_size=2, unique=True),
    },
)
_TARGET = (
    _NEARLY_VALID
    | st.fixed_dictionaries({}, optional={k: s | _VALUE for k, s in _PLAUSIBLE.items()})
    | st.dictionaries(st.sampled_from(["rule", *_ATTR_NAMES]) | _TEXT, _VALUE, max_size=4)
)
_NAMES = st.sampled_from(["t0", "t1", "t2"]) | _TEXT
_DOCUMENT = st.dictionaries(_NAMES, _TARGET | _VALUE, max_size=4)


def _toml_string(text: str) -> str:
    out = json.dumps(text, ensure_ascii=False)
    return out.replace("\x7f", "\\u007f")


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


def to_toml(doc: dict) -> str:
    """A minimal TOML writer: top-level non-tables first, then one [table] per target."""
    lines = [
        f"{_toml_string(k)} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)
    ]
    for name, table in doc.items():
        if isinstance(table, dict):
            lines.append(f"\n[{_toml_string(name)}]")
            lines += [f"{_toml_string(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


_FRAGMENTS = st.lists(
    st.sampled_from(
        [
            "[t0]",
            'rule = "command"',
            'outs = ["o"]',
            'cmd = "echo > $(OUT)"',
            "[[t0]]",
            "=",
            '"',
            "'''",
            'deps = [":t1"]',
            "[t0.env]",
            "{",
            "}",
            "srcs = [1]",
            "[t1]",
            'deps = [":t0"]',
            "x = 1979-05-27T07:32:00Z",
            "timeout = inf",
            "timeout = nan",
            'env = {A = "b"}',
            "\t",
            "#",
        ]
    )
    | _TEXT,
    max_size=12,
).map("\n".join)


def _load_everything(ws) -> None:
    """Load the root package and analyse every target in it, as `rsi build :all` would."""
    loader = _loader(ws)
    targets = loader.package("")
    analyze(loader, sorted(t.label for t in targets.values()), store_put=digest_bytes, settings={})


def _assert_only_rsi_errors(ws, text: str) -> None:
    (ws / "BUILD.toml").write_text(text, encoding="utf-8")
    try:
        _load_everything(ws)
        event("analysed without error")
    except RsiError as exc:
        event(f"{type(exc).__name__} (field {getattr(exc, 'field', None)})")
        assert str(exc).strip(), f"empty message from {type(exc).__name__}"
        if isinstance(exc, DeclarationError):
            assert "BUILD.toml" in str(exc) or isinstance(exc, LabelError)


@pytest.fixture(scope="module")
def fuzz_ws(command, make_workspace, tmp_path_factory):
    return make_workspace(
        tmp_path_factory.mktemp("fuzz"),
        {
            "a.txt": "a\n",
            "sub/BUILD.toml": command("x", cmd="echo > $(OUT)", outs=["x"]),
        },
    )


_FUZZ = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.e2e
@_FUZZ
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=200) | _FRAGMENTS)
def test_random_text_gives_an_rsi_error_or_loads(fuzz_ws, text):
    _assert_only_rsi_errors(fuzz_ws, text)


@pytest.mark.e2e
@_FUZZ
@given(doc=_DOCUMENT)
def test_random_declarations_give_an_rsi_error_or_load(fuzz_ws, doc):
    text = to_toml(doc)
    assert tomllib.loads(text) == doc  # the generator writes the TOML it means
    _assert_only_rsi_errors(fuzz_ws, text)


@pytest.mark.e2e
@_FUZZ
@given(name=_NAMES, table=_TARGET)
def test_random_single_targets_give_an_rsi_error_or_load(fuzz_ws, name, table):
    _assert_only_rsi_errors(fuzz_ws, to_toml({name: {"rule": "command", **table}}))
