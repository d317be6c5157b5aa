"""A remote worker advertises the interpreter identity every host-python action of the installed
rule families carries (`host-python@…:numpy,torch` for the judge's steps, `…:jinja2` for the
dashboard, the bare one for stdlib steps), so those actions can be scheduled on it at all."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.fast


def test_the_worker_advertises_the_identity_of_every_step_family():
    from rsi.registry import host_import_sets
    from rsi.worker import default_properties
    from rules.domain import host_python_identity
    from rules.step_imports import JUDGE_STEPS, step_imports

    advertised = {v for k, v in default_properties("local") if k == "toolchain"}
    assert host_python_identity() in advertised  # NB: what a verdict's actions carry
    assert host_python_identity(("dashboard",)) in advertised
    assert host_python_identity(("preflight",)) in advertised
    assert tuple(sorted(step_imports(*JUDGE_STEPS))) in host_import_sets()


def test_a_docker_worker_advertises_no_host_interpreter():
    from rsi.worker import default_properties

    assert not any(v.startswith("host-python@") for _, v in default_properties("docker"))
