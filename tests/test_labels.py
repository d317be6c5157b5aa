"""Labels (`//pkg:name`, `:name`) and patterns (`//pkg/...`, `:all`), parsed and resolved."""

from __future__ import annotations

import pytest

from rsi.errors import LabelError, UsageError
from rsi.label import Label, Pattern
from rsi.loader import Loader
from rsi.registry import load_rules


@pytest.mark.fast
def test_absolute_label_names_package_and_target():
    label = Label.parse("//tasks/softmax:verdict")
    assert (label.package, label.name) == ("tasks/softmax", "verdict")
    assert str(label) == "//tasks/softmax:verdict"


@pytest.mark.fast
def test_root_package_label():
    assert Label.parse("//:root") == Label("", "root")
    assert str(Label("", "root")) == "//:root"


@pytest.mark.fast
def test_label_without_name_means_the_package_last_component():
    assert Label.parse("//tasks/softmax") == Label("tasks/softmax", "softmax")


@pytest.mark.fast
def test_relative_label_resolves_in_the_current_package():
    assert Label.parse(":oracle", "tasks/softmax") == Label("tasks/softmax", "oracle")


@pytest.mark.fast
def test_relative_label_without_a_package_is_an_error():
    with pytest.raises(LabelError, match="needs a package"):
        Label.parse(":oracle")


@pytest.mark.fast
@pytest.mark.parametrize(
    "text",
    [
        "",
        "oracle",
        "tasks:x",
        "//a/../b:x",
        "//a//b:x",
        "//pkg:",
        "//pkg:bad name",
        "//./x:y",
        "//pkg:-x",
        "/pkg:x",
    ],
)
def test_malformed_label_is_a_label_error(text):
    with pytest.raises(LabelError) as info:
        Label.parse(text, "pkg")
    assert info.value.message
    assert isinstance(info.value, UsageError)


@pytest.mark.fast
def test_labels_are_values():
    assert Label.parse("//a:b") == Label.parse(":b", "a")
    assert len({Label.parse("//a:b"), Label("a", "b")}) == 1
    assert min(Label("b", "x"), Label("a", "y")) == Label("a", "y")


@pytest.mark.fast
def test_recursive_pattern_matches_package_and_below_only():
    pattern = Pattern.parse("//tasks/...")
    assert pattern.recursive and pattern.name is None and pattern.package == "tasks"
    assert pattern.matches_package("tasks")
    assert pattern.matches_package("tasks/softmax")
    assert not pattern.matches_package("tasksx")
    assert not pattern.matches_package("other")


@pytest.mark.fast
def test_whole_workspace_pattern_matches_every_package():
    pattern = Pattern.parse("//...")
    assert pattern.recursive and pattern.package == ""
    assert pattern.matches_package("") and pattern.matches_package("a/b")


@pytest.mark.fast
@pytest.mark.parametrize(
    "text,current,package",
    [
        ("//tasks:all", "", "tasks"),
        (":all", "tasks/x", "tasks/x"),
        ("//tasks:*", "", "tasks"),
        ("//:all", "elsewhere", ""),
    ],
)
def test_all_pattern_names_every_target_of_one_package(text, current, package):
    pattern = Pattern.parse(text, current)
    assert (pattern.package, pattern.name, pattern.recursive) == (package, None, False)
    assert not pattern.matches_package(package + "/sub")


@pytest.mark.fast
def test_single_label_pattern():
    pattern = Pattern.parse(":x", "p")
    assert (pattern.package, pattern.name, pattern.recursive) == ("p", "x", False)


# ----------------------------------------------------------------------- against real files


@pytest.fixture
def tree_ws(command, make_workspace, tmp_path):
    return make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("top", cmd="echo > $(OUT)", outs=["t"]),
            "a/BUILD.toml": command("one", cmd="echo > $(OUT)", outs=["1"])
            + command("two", cmd="echo > $(OUT)", outs=["2"], deps=[":one"]),
            "a/b/BUILD.toml": command("deep", cmd="echo > $(OUT)", outs=["d"], deps=["//a:two"]),
            "ab/BUILD.toml": command("sibling", cmd="echo > $(OUT)", outs=["s"]),
            "a/notapkg/readme.txt": "no BUILD.toml here\n",
            "out/BUILD.toml": command("ignored", cmd="echo > $(OUT)", outs=["i"]),
        },
    )


def _expand(ws, *patterns, current=""):
    return [str(lb) for lb in Loader(ws, load_rules()).expand(list(patterns), current)]


@pytest.mark.fast
def test_recursive_pattern_expands_to_targets_on_disk(tree_ws):
    assert sorted(_expand(tree_ws, "//a/...")) == ["//a/b:deep", "//a:one", "//a:two"]


@pytest.mark.fast
def test_workspace_pattern_skips_output_folders(tree_ws):
    found = _expand(tree_ws, "//...")
    assert sorted(found) == ["//:top", "//a/b:deep", "//a:one", "//a:two", "//ab:sibling"]


@pytest.mark.fast
def test_all_pattern_expands_one_package_not_subpackages(tree_ws):
    assert sorted(_expand(tree_ws, ":all", current="a")) == ["//a:one", "//a:two"]


@pytest.mark.fast
def test_expansion_lists_each_target_once(tree_ws):
    assert _expand(tree_ws, "//a:one", "//a:all", "//a/...").count("//a:one") == 1


@pytest.mark.fast
def test_pattern_matching_nothing_is_an_error(tree_ws):
    with pytest.raises(LabelError, match="matches no targets"):
        _expand(tree_ws, "//a/notapkg/...")


@pytest.mark.fast
def test_missing_package_is_a_label_error_naming_the_file(tree_ws):
    with pytest.raises(LabelError, match="a/notapkg/BUILD.toml"):
        _expand(tree_ws, "//a/notapkg:x")


@pytest.mark.fast
def test_missing_target_suggests_close_names(tree_ws):
    with pytest.raises(LabelError) as info:
        _expand(tree_ws, "//a:tw")
    assert "//a:two" in str(info.value)


@pytest.mark.fast
def test_relative_labels_resolve_from_the_current_folder_in_the_cli(run_rsi, tree_ws):
    run = run_rsi(tree_ws, "query", ":all", cwd=tree_ws / "a")
    assert run.returncode == 0, run
    assert run.stdout.split() == ["//a:one", "//a:two"]
    run = run_rsi(tree_ws, "query", ":deep", cwd=tree_ws / "a" / "b")
    assert run.stdout.split() == ["//a/b:deep"]


@pytest.mark.e2e
def test_why_resolves_a_relative_label_from_the_current_folder(bwrap, run_rsi, tree_ws):
    assert run_rsi(tree_ws, "build", "//a:one").returncode == 0
    run = run_rsi(tree_ws, "why", ":one", cwd=tree_ws / "a")
    assert run.returncode == 0, run
    assert run.stdout.startswith("//a:one: last built in")
