"""The stat loop of a state's check (rsi.native): the C loop and the Python loop it falls back
on give the same answer on ordinary keys, and neither ever calls a key clean that it could not
judge (a non-str key, a NUL, a lone surrogate, a value of another shape, ints it cannot hold).
A dict changed by another thread meanwhile is an error or a whole answer, never a skipped key;
no reference is leaked on success or error. No timing is asserted (bench/fanin.py measures)."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path

import pytest

from rsi import native

pytestmark = pytest.mark.fast

C = native._native


def _sig(st: os.stat_result) -> tuple:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _both(parts, **kw) -> tuple:
    """(the C loop's answer, the Python loop's) as sets; they must agree."""
    args = (
        kw.get("prefix"),
        kw.get("follow", False),
        kw.get("sig_at", -1),
        kw.get("mode_at", -1),
        kw.get("linked", False),
    )
    py = native._stale_py(parts, *args)
    c = C.stale(parts, args[0], args[1], args[2], args[3], 2, args[4])
    return (set(c[0]), set(c[1])), (set(py[0]), set(py[1]))


def test_the_c_loop_is_built_where_the_tests_run():
    # NB: scripts/setup.sh builds it; a silent fallback here would leave it untested
    if os.environ.get("RSI_NATIVE") == "0":
        pytest.skip("RSI_NATIVE=0")
    assert native.available(), "python -m rsi.native build failed: see its message"
    assert C.SOURCE_DIGEST == native._source_digest()


@pytest.fixture
def files(tmp_path):
    a = tmp_path / "a"
    a.write_text("alpha")
    b = tmp_path / "b"
    b.write_text("beta")
    os.link(b, tmp_path / "b2")
    os.symlink(a, tmp_path / "ln")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    return tmp_path


def _entry(path: Path, follow: bool = False) -> list:
    st = os.stat(path) if follow else os.lstat(path)
    return [_sig(st), "hash", st.st_size, [], st.st_mode]


def test_sources_at_their_signature_are_clean_and_every_other_is_named(files):
    a, b = str(files / "a"), str(files / "b")
    good = _entry(files / "a")
    sources = {
        a: good,
        b: _entry(files / "b"),
        str(files / "ln"): _entry(files / "ln"),
        str(files / "missing"): [None, "h", 1, []],
        str(files / "dangling"): _entry(files / "dangling"),
    }
    sig = good[0]
    # NB: other spellings of the same file, each with a value that must not pass: each field
    # of the signature off by one; no signature; not vouched for; another mode; a fifth item
    spellings = iter(f"{files}/{'./' * i}a" for i in range(1, 20))
    moved = {}
    for i in range(4):
        wrong = list(sig)
        wrong[i] += 1
        moved[next(spellings)] = [tuple(wrong), "h", 1, [], good[4]]
    moved[next(spellings)] = [None, "h", 1, [], good[4]]
    moved[next(spellings)] = [sig, "h", 1, []]
    moved[next(spellings)] = [sig, "h", 1, [], good[4] ^ 0o100]
    moved[next(spellings)] = [sig, "h", 1, [], good[4], "extra"]
    moved[next(spellings)] = (sig, "h", 1, [], good[4])  # NB: a tuple, not a list
    # NB: and a clean one through another spelling: clean
    sources[next(spellings)] = [sig, "h", 1, [], good[4]]
    sources.update(moved)
    c, py = _both([sources], sig_at=0, mode_at=4)
    assert c == py
    want = set(moved) | {str(files / "missing")}
    assert c[0] == want


@pytest.mark.parametrize(
    "value",
    [
        None,
        (),
        ("x",),
        [],  # NB: a list with no item at sig_at
        "not a list",
        ((1, 2, 3),),  # NB: three fields
        ((1, 2, 3, 4, 5),),
    ],
)
def test_values_of_another_shape_are_never_clean(files, value):
    a = str(files / "a")
    entry = value if not isinstance(value, tuple) else [value[0] if value else None]
    c, py = _both([{a: entry}], sig_at=0)
    assert c == py == ({a}, set())


def test_ints_of_another_type_or_beyond_64_bits_are_never_clean(files):
    a = str(files / "a")
    sig = _sig(os.lstat(a))

    class Int(int):
        pass

    for bad in (
        (float(sig[0]), *sig[1:]),
        (Int(sig[0]), *sig[1:]),
        (sig[0] + 2**64, *sig[1:]),
        (sig[0], sig[1], sig[2] + 2**70, sig[3]),
        (sig[0] - 2**64, *sig[1:]),
        (True, *sig[1:]),
    ):
        c, py = _both([{a: [bad]}], sig_at=0)
        assert c[0] == py[0] == {a}, bad
    assert _both([{a: [sig]}], sig_at=0)[0] == (set(), set())


def test_keys_the_loop_cannot_judge_are_named(files):
    odd = os.fsdecode(b"odd-\xff")
    with open(os.path.join(os.fsencode(files), b"odd-\xff"), "w") as f:
        f.write("x")
    path = f"{files}/{odd}"
    st = os.lstat(path)
    sources = {
        path: [_sig(st)],  # NB: a lone surrogate: the C loop cannot encode it as os does
        f"{files}/a\0b": [None],
        b"/etc/hostname": [None],
        7: [None],
        "": [None],
    }
    c = C.stale([sources], None, False, 0, -1, 2, False)
    assert set(c[0]) == set(sources)
    # NB: the Python loop judges the surrogate path as os does, and names the rest
    py = native._stale_py([sources], None, False, 0, -1, False)
    assert set(py[0]) == set(sources) - {path}


def test_links_are_told_only_for_clean_keys(files):
    sources = {str(files / n): _entry(files / n) for n in ("a", "b", "b2", "ln")}
    sources[str(files / "b2")][0] = None  # NB: not clean: named, not told as linked
    c, py = _both([sources], sig_at=0, mode_at=4, linked=True)
    assert c == py == ({str(files / "b2")}, {str(files / "b"), str(files / "ln")})


def test_blobs_are_stat_ed_under_their_shard_folder_and_through_links(tmp_path):
    cas = tmp_path / "cas"
    blobs = {}
    for h in ("ab01", "ab02", "cd03", "x"):
        (cas / h[:2]).mkdir(parents=True, exist_ok=True)
    (cas / "ab" / "ab01").write_text("one")
    os.symlink(cas / "ab" / "ab01", cas / "ab" / "ab02")
    blobs["ab01"] = _sig(os.stat(cas / "ab" / "ab01"))
    blobs["ab02"] = _sig(os.stat(cas / "ab" / "ab02"))  # NB: the target's, through the link
    blobs["cd03"] = (1, 2, 3, 4)  # NB: missing
    blobs["x"] = None  # NB: a key too short for a shard folder
    blobs["éa01"] = None  # NB: a shard folder of non-ASCII characters
    c, py = _both([blobs, {}], prefix=str(cas), follow=True)
    assert c == py
    assert c[0] == {"cd03", "x", "éa01"}
    # NB: without following, the link's own signature is not its target's
    assert C.stale([blobs], str(cas), False, -1, -1, 1, False)[0] == ["ab02", "cd03", "x", "éa01"]


def test_many_keys_across_chunks_and_threads(tmp_path):
    real = []
    for i in range(600):
        p = tmp_path / f"f{i}"
        p.write_text(str(i))
        real.append(p)
    sources = {}
    # NB: more keys than one chunk of the C loop (32,768), the real ones spread through it
    for i in range(80_000):
        if i % 133 == 0 and real:
            p = real.pop()
            entry = _entry(p)
            if i % 7 == 0:
                entry[0] = (entry[0][0], entry[0][1] + 1, *entry[0][2:])
            sources[str(p)] = entry
        else:
            sources[f"{tmp_path}/none/{i}"] = [None]
    want = {k for k, v in sources.items() if v[0] is None or not os.path.exists(k)}
    want |= {k for k, v in sources.items() if v[0] is not None and v[0] != _sig(os.lstat(k))}
    for threads in (1, 2, 3, 16, 100):
        got = C.stale([sources], None, False, 0, 4, threads, False)
        assert set(got[0]) == want
        assert len(got[0]) == len(want)  # NB: each once
    assert set(native._stale_py([sources], None, False, 0, 4, False)[0]) == want


def test_no_reference_is_leaked_on_success_or_error(files):
    a = str(files / "a")
    key = "".join([a])  # NB: a fresh str object
    value = _entry(files / "a")
    before = sys.getrefcount(key), sys.getrefcount(value)
    for _ in range(50):
        C.stale([{key: value}], None, False, 0, 4, 2, True)
    with pytest.raises(TypeError):
        C.stale([{key: value}, "not a dict"], None, False, 0, 4, 2, False)
    with pytest.raises(TypeError):
        C.stale([{key: value}], b"bytes prefix", False, 0, 4, 2, False)
    with pytest.raises(ValueError):
        C.stale([{key: value}], "a\0b", False, 0, 4, 2, False)
    assert (sys.getrefcount(key), sys.getrefcount(value)) == before


def test_a_dict_changed_by_another_thread_is_an_error_or_a_whole_answer(tmp_path):
    sources = {f"{tmp_path}/k{i}": [None] for i in range(50_000)}
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            sources[f"{tmp_path}/new{i}"] = [None]
            sources.pop(f"{tmp_path}/new{i}", None)
            sources[f"{tmp_path}/grown{i % 1000}"] = [None]  # NB: bounded: 1,000 at most
            i += 1

    t = threading.Thread(target=churn)
    t.start()
    errors = answers = 0
    try:
        for _ in range(20):
            try:
                got = C.stale([sources], None, False, 0, -1, 2, False)[0]
            except RuntimeError as e:
                assert "changed size" in str(e)
                errors += 1
                continue
            answers += 1
            # NB: every key present throughout is named (all are missing files)
            assert {f"{tmp_path}/k{i}" for i in range(50_000)} <= set(got)
    finally:
        stop.set()
        t.join()
    assert errors + answers == 20


def test_a_module_built_from_another_source_is_not_used_and_rsi_info_says_why(monkeypatch):
    from rsi import info

    monkeypatch.setattr(native, "_why_not", None)
    monkeypatch.setattr(native, "_source_digest", lambda: "0" * 16)
    monkeypatch.setattr(native, "_native", native._load())
    assert native._native is None
    assert "another revision of rsi/_statloop.c" in info.render(info.describe())
    monkeypatch.setenv("RSI_NATIVE", "0")
    assert native._load() is None and native.describe() == "Python: RSI_NATIVE=0"


def test_without_the_c_loop_stale_runs_the_python_loop(files, monkeypatch):
    monkeypatch.setattr(native, "_native", None)
    assert not native.available()
    a = str(files / "a")
    assert native.stale([{a: _entry(files / "a"), "/no/such": [None]}], sig_at=0, mode_at=4) == (
        ["/no/such"],
        [],
    )


def test_build_compiles_a_loadable_module_and_a_failed_compile_leaves_nothing(
    tmp_path, monkeypatch
):
    src = tmp_path / "_statloop.c"
    src.write_bytes(native._SOURCE.read_bytes())
    monkeypatch.setattr(native, "_SOURCE", src)
    built = native.build(quiet=True)
    if built is None:
        pytest.skip("no C compiler or Python headers here")
    spec = importlib.util.spec_from_file_location("_statloop", built)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.SOURCE_DIGEST == native._source_digest()
    assert mod.stale([{"/no/such": None}], None, False, -1, -1, 1, False) == (["/no/such"], [])
    monkeypatch.setenv("CC", "false")
    built.unlink()
    assert native.build(quiet=True) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_statloop.c"]


def test_six_field_signatures_hold_the_owner_and_mode_too(files):
    a = str(files / "a")
    st = os.lstat(a)
    six = (*_sig(st), st.st_uid, st.st_mode)
    entries = {a: six}
    for i, bad in ((4, st.st_uid + 1), (5, st.st_mode ^ 0o200)):
        wrong = list(six)
        wrong[i] = bad
        entries[f"{files}/{'./' * (i - 3)}a"] = tuple(wrong)
    entries[f"{files}/././././a"] = (*six, 0)  # NB: seven fields
    entries[f"{files}/./././a"] = six[:5]  # NB: five
    c, py = _both([entries])
    assert c == py
    assert c[0] == set(entries) - {a}
