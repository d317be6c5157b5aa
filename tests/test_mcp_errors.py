"""MCP tool errors are data (issue 32, item 2): a refused call answers with the CLI's
`rsi.error/1` document as structured content (code, message, hint, retryable), and hints name
the MCP tool to call instead of a CLI command. The end-to-end client is in test_mcp.py."""

from __future__ import annotations

import json

import pytest

from rsi.errors import ExecutionError, StoreError, UsageError
from rules.campaign.model import CampaignClosed
from rules.mcp_server import CallRefused, _refusal, clean_files, mcp_hint

pytestmark = pytest.mark.fast


def test_a_refusal_is_an_rsi_error_document_with_every_field():
    doc = CallRefused("bad_round", "`round` must be a round number").document("retry_round")
    assert doc == {
        "schema": "rsi.error/1",
        "tool": "retry_round",
        "state": "error",
        "error": {
            "code": "bad_round",
            "message": "`round` must be a round number",
            "hint": None,
            "retryable": False,
        },
    }


def test_a_closed_campaign_is_refused_and_not_retryable():
    exc = CampaignClosed("budget_used", "no round left", hint="rsi campaign final //t:c")
    doc = _refusal(exc).document("submit_round")
    assert doc["state"] == "refused" and doc["error"]["code"] == "budget_used"
    assert doc["error"]["retryable"] is False
    assert doc["error"]["hint"] == "the final tool (campaign //t:c)"


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [
        (ExecutionError("the sandbox could not start"), True),
        (StoreError("disk full"), True),
        (UsageError("unknown campaign"), False),
    ],
)
def test_infrastructure_errors_are_retryable_and_usage_errors_are_not(exc, retryable):
    doc = _refusal(exc).document("status")
    assert doc["error"]["retryable"] is retryable
    assert doc["error"]["code"] == type(exc).__name__


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        ("stop it now: rsi campaign stop //t:c", "stop it now: the stop tool (campaign //t:c)"),
        (
            "retry with `rsi round //t:c --round 3`; or give up",
            "retry with the retry_round tool (campaign //t:c, round 3); or give up",
        ),
        (
            "submit a new candidate: rsi round //t:c --from DIR",
            "submit a new candidate: the submit_round tool (campaign //t:c)",
        ),
        (
            "rsi campaign regrade //t:c re-assesses every round",
            "`rsi campaign regrade //t:c` (CLI only: no MCP tool) re-assesses every round",
        ),
        (None, None),
    ],
)
def test_hints_name_mcp_tools_not_cli_commands(hint, expected):
    assert mcp_hint(hint) == expected


def test_the_server_answers_a_refusal_with_structured_content(tmp_path):
    pytest.importorskip("mcp")
    from rules.mcp_server import make_server

    (tmp_path / "rsi.toml").write_text("")
    from rsi.workspace import Workspace

    server = make_server(Workspace.load(tmp_path))
    tool = server._tool_manager.get_tool("retry_round")
    res = tool.fn(campaign="//nowhere:campaign", round=0)
    assert res.is_error is True
    doc = res.structured_content
    assert doc["schema"] == "rsi.error/1" and doc["tool"] == "retry_round"
    assert json.loads(res.content[0].text) == doc
    assert doc["error"]["code"] and doc["error"]["message"]


def test_a_file_outside_the_scope_is_refused_with_its_code():
    with pytest.raises(CallRefused) as info:
        clean_files({"oracle.py": "x = 1\n"}, ["kernel.py"], "task")
    assert info.value.code == "outside_scope" and "kernel.py" in info.value.message


def test_rsi_mcp_without_the_sdk_names_the_one_command_that_adds_it(tmp_path):
    import subprocess
    import sys

    (tmp_path / "rsi.toml").write_text("")
    code = (
        "import sys; sys.modules['mcp'] = None; sys.argv = ['rsi', 'mcp']\n"
        "from rsi.entry import run; run()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    assert f"{sys.executable} -m pip install 'mcp" in proc.stderr, proc.stderr
    assert not (tmp_path / "cache").exists()  # NB: nothing written


def test_arguments_that_fail_the_schema_are_a_document_naming_the_field(tmp_path):
    pytest.importorskip("mcp")
    import anyio

    from rsi.workspace import Workspace
    from rules.mcp_server import make_server

    (tmp_path / "rsi.toml").write_text("")
    server = make_server(Workspace.load(tmp_path))

    async def main():
        bad = await server.call_tool("submit_round", {"campaign": "//a:c", "files": "kernel.py"})
        unknown = await server.call_tool("no_such_tool", {})
        return bad, unknown

    bad, unknown = anyio.run(main)
    assert bad.is_error and bad.structured_content["error"]["code"] == "bad_arguments"
    assert "`files`" in bad.structured_content["error"]["message"]
    assert unknown.is_error and unknown.structured_content["error"]["code"] == "bad_call"
