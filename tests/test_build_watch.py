"""With RSI_BUILD_WATCH (opt-in), a build without a server watches its sources' folders itself
(rsi.watch.BuildWatch), from before its check of the sources, so its re-check before export
looks again only at what an event named since. What inotify cannot see is looked at whatever
it says (a file of two links, a symlink), and where the watch cannot tell (a folder replaced,
events lost, a mount added or removed, no inotify instance) every source is.
RSI_BUILD_WATCH=always engages it at any size, as =1 does at 5,000 sources and more. By
default it is off: a write through a hard link made after the check, in a folder nobody
watches, reaches no watch, and the default re-check (an `lstat` of every source) catches it."""

from __future__ import annotations

import os
import shutil

import pytest
import test_event_hits
import test_one_change_recheck as recheck

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]

fanin = test_event_hits.fanin


@pytest.fixture(autouse=True)
def always(monkeypatch):
    monkeypatch.setenv("RSI_BUILD_WATCH", "always")


def _looked_at_after(monkeypatch, path, meanwhile=lambda: None):
    """A `meanwhile` that runs `meanwhile()`, then counts every `os.lstat` of `path` (the
    re-check's), and every batch of rsi.native's stat loop holding it, into the list it
    returns with it."""
    from rsi import native

    seen: list[str] = []

    def start() -> None:
        meanwhile()
        real, real_stale = os.lstat, native.stale

        def counting(p, *a, **k):
            if os.fspath(p) == str(path):
                seen.append(str(p))
            return real(p, *a, **k)

        def counting_stale(parts, **kw):
            if kw.get("prefix") is None and any(str(path) in part for part in parts):
                seen.append(str(path))
            return real_stale(parts, **kw)

        monkeypatch.setattr(os, "lstat", counting)
        monkeypatch.setattr(native, "stale", counting_stale)

    return start, seen


@pytest.mark.parametrize("mode", ["0", "always"])
def test_the_recheck_looks_again_only_at_what_an_event_named(fanin, monkeypatch, mode):
    monkeypatch.setenv("RSI_BUILD_WATCH", mode)
    b = fanin / "in" / "b.txt"
    start, seen = _looked_at_after(monkeypatch, b)
    report, events = recheck._one_change_with(fanin, monkeypatch, start)
    assert report.ok and not recheck._changed(events)
    # NB: the sweep looks at the vouched-for b.txt again; the watch saw no event naming it
    assert bool(seen) == (mode == "0"), seen


def test_a_source_rewritten_through_a_hard_link_elsewhere_is_caught(fanin, monkeypatch):
    b = fanin / "in" / "b.txt"
    other = fanin.parent / "unwatched"
    other.mkdir()
    os.link(b, other / "b-link")

    def write_through_link() -> None:
        with open(other / "b-link", "r+") as f:  # NB: same inode; no event in in/
            f.write("BRAVO")

    report, events = recheck._one_change_with(fanin, monkeypatch, write_through_link)
    changed = recheck._changed(events)
    assert changed and changed[0]["paths"] == [str(b)], events
    assert report.ok and (fanin / "out" / "top.out").read_text() == "alpha 2\nBRAVO\n"


def test_a_symlinked_sources_target_changed_elsewhere_is_caught(fanin, monkeypatch):
    data = fanin / "data"  # NB: in the workspace, but no source's folder: not watched
    data.mkdir()
    (data / "b.txt").write_text("bravo\n")
    b = fanin / "in" / "b.txt"
    b.unlink()
    b.symlink_to(data / "b.txt")
    report, events = recheck._one_change_with(
        fanin, monkeypatch, lambda: (data / "b.txt").write_text("bravo 3\n")
    )
    assert recheck._changed(events), events
    assert report.ok and (fanin / "out" / "top.out").read_text() == "alpha 2\nbravo 3\n"


def test_a_source_replaced_by_a_rename_is_caught(fanin, monkeypatch):
    b = fanin / "in" / "b.txt"

    def replace() -> None:
        (fanin / "in" / "b.new").write_text("bravo 4\n")
        os.replace(fanin / "in" / "b.new", b)

    report, events = recheck._one_change_with(fanin, monkeypatch, replace)
    changed = recheck._changed(events)
    assert changed and changed[0]["paths"] == [str(b)], events
    assert report.ok and (fanin / "out" / "top.out").read_text() == "alpha 2\nbravo 4\n"


def test_a_source_folder_replaced_by_a_copy_is_caught(fanin, monkeypatch):
    """A new folder at the same path: the old one's watch says nothing of it."""

    def swap() -> None:
        shutil.copytree(fanin / "in", fanin / "in.new")
        (fanin / "in.new" / "b.txt").write_text("bravo 5\n")
        (fanin / "in").rename(fanin / "in.old")
        (fanin / "in.new").rename(fanin / "in")

    report, events = recheck._one_change_with(fanin, monkeypatch, swap)
    assert recheck._changed(events), events
    assert report.ok and (fanin / "out" / "top.out").read_text() == "alpha 2\nbravo 5\n"


def test_lost_events_mean_every_source_is_looked_at(fanin, monkeypatch):
    from rsi import watch

    b = fanin / "in" / "b.txt"

    def lose_and_edit() -> None:
        # NB: as the kernel's queue overflowing: the watcher cannot name what changed
        real = watch.Watcher.drain

        def drain(self):
            real(self)
            self.overflow_at = self.counter + 1

        monkeypatch.setattr(watch.Watcher, "drain", drain)
        b.write_text("bravo 6\n")

    start, seen = _looked_at_after(monkeypatch, b, lose_and_edit)
    report, events = recheck._one_change_with(fanin, monkeypatch, start)
    assert seen and recheck._changed(events), events
    assert report.ok and (fanin / "out" / "top.out").read_text() == "alpha 2\nbravo 6\n"


def test_a_mount_added_or_removed_means_every_source_is_looked_at(fanin, monkeypatch):
    from rsi import watch

    b = fanin / "in" / "b.txt"

    def mounted() -> None:
        monkeypatch.setattr(watch.Watcher, "mounts_moved", lambda self, update=True: True)

    start, seen = _looked_at_after(monkeypatch, b, mounted)
    report, events = recheck._one_change_with(fanin, monkeypatch, start)
    assert report.ok and seen


def test_no_inotify_instance_means_the_sweep(fanin, monkeypatch):
    """inotify_init1 failing (the user's instance limit): the build goes on, sweeping."""
    from rsi import watch

    def refuse(self, *a, **k):
        raise OSError(24, "inotify_init1")

    monkeypatch.setattr(watch.Watcher, "__init__", refuse)
    b = fanin / "in" / "b.txt"
    report, events = recheck._one_change_with(fanin, monkeypatch, lambda: b.write_text("bravo 7\n"))
    assert recheck._changed(events) and report.ok


@pytest.mark.parametrize(
    "folders",
    [None, "in", {"list": ["/nowhere"], "count": 1}, {"list": [1], "count": 2}],
    ids=["missing", "not-a-dict", "other-count", "not-strings"],
)
def test_a_state_without_its_folders_watches_nothing(folders):
    from rsi import incremental

    state = {"sources": {"/a/x": [], "/a/y": []}}
    if folders is not None:
        state["folders"] = folders
    assert incremental._build_watch(state) is None
    state["folders"] = {"list": ["/a"], "count": 2}
    made = incremental._build_watch(state)
    assert made is not None and made.folders == ["/a"]
    made.close()


def test_the_watch_is_closed_after_the_build(fanin, monkeypatch):
    from rsi import watch

    made: list = []
    real = watch.BuildWatch.__init__

    def init(self, folders):
        real(self, folders)
        made.append(self)

    monkeypatch.setattr(watch.BuildWatch, "__init__", init)
    report, _ = recheck._one_change_with(fanin, monkeypatch, lambda: None)
    assert report.ok and made and all(w.watcher is None for w in made)


@pytest.mark.parametrize("mode", [None, "0"], ids=["default", "off"])
def test_by_default_a_write_through_a_link_made_during_the_build_is_caught(
    fanin, monkeypatch, mode
):
    """The case no watch can see: a hard link made after the check, elsewhere, written
    through (no event in in/). The default re-check looks at every source and builds again."""
    if mode is None:
        monkeypatch.delenv("RSI_BUILD_WATCH", raising=False)
    else:
        monkeypatch.setenv("RSI_BUILD_WATCH", mode)
    b = fanin / "in" / "b.txt"
    other = fanin.parent / "unwatched"
    other.mkdir()

    def link_and_write() -> None:
        os.link(b, other / "b-late")
        with open(other / "b-late", "r+") as f:
            f.write("BRAVO")

    report, events = recheck._one_change_with(fanin, monkeypatch, link_and_write)
    changed = recheck._changed(events)
    assert changed and changed[0]["paths"] == [str(b)], events
    assert report.ok and (fanin / "out" / "top.out").read_text() == "alpha 2\nBRAVO\n"
