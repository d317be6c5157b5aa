"""Each harness step's action key covers exactly the code it runs (issue 13, item 2): the files
rules/steps.py gives a step are the closure of its script's own sibling loads, read from the
scripts' text. A new `_load_sibling("x")` without the file in SCRIPTS fails here, and so does
a file a step lists but never loads (it would re-run the step for nothing)."""

from __future__ import annotations

import re

import pytest

from rules.campaign.judging import JUDGE_CAMPAIGN_SCRIPTS
from rules.steps import HARNESS_DIR, SCRIPTS

pytestmark = pytest.mark.fast

LOADS = (
    re.compile(r'_load\("[^"]*",\s*"(\w+)"\)'),
    re.compile(r'_load_sibling\("(\w+)"\)'),
    re.compile(r'_sibling\("(\w+)"\)'),
)
STARTS = re.compile(r'/ "(\w+\.py)"')  # NB: a script started by path (referee -> worker.py)
# NB: project.py loads assess.py only in its `assess` subcommand, which is the project_assess
# step; its quality and bench subcommands (the `project` step) never do
LAZY = {"project": {"assess.py"}}


# NB: several at once: `A, B = load_siblings("a", "b")` (rules/harness/siblings.py)
LOAD_MANY = re.compile(r"load_siblings\(([^)]*)\)")


def _uses(name: str) -> set[str]:
    text = (HARNESS_DIR / name).read_text()
    found = {f"{m}.py" for rx in LOADS for m in rx.findall(text)}
    found |= {f"{m}.py" for args in LOAD_MANY.findall(text) for m in re.findall(r'"(\w+)"', args)}
    found |= set(STARTS.findall(text))
    return {f for f in found if (HARNESS_DIR / f).is_file()}


def closure(script: str, skip: set[str] = frozenset()) -> set[str]:
    seen, todo = set(), [script]
    while todo:
        name = todo.pop()
        if name in seen or name in skip:
            continue
        seen.add(name)
        todo.extend(_uses(name))
    return seen


@pytest.mark.parametrize("step", sorted(SCRIPTS))
def test_a_steps_files_are_exactly_what_its_script_loads(step):
    files = SCRIPTS[step]
    assert closure(files[0], LAZY.get(step, set())) == set(files), step


def test_an_assessment_never_depends_on_the_referees_helpers():
    """Editing the GPU query (or any input transport) in _common.py must not re-run an
    assessment or change a campaign's judge digest for an external project."""
    assert "_common.py" not in SCRIPTS["assess"]
    assert "_common.py" not in SCRIPTS["project_assess"]
    assert "_common.py" not in JUDGE_CAMPAIGN_SCRIPTS["project"]
    assert {"_core.py", "stats.py", "assess.py"} <= set(JUDGE_CAMPAIGN_SCRIPTS["project"])
