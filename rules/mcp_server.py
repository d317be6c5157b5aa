"""`rsi mcp`: the campaign API over the Model Context Protocol (the `mcp` package, stdio transport;
optionally streamable HTTP on 127.0.0.1). It must never hold a campaign rule the CLI does not share.

Every tool calls the in-process service (rules.campaign.Campaigns) and returns the same JSON
document as the command it stands for (`rsi round --json` → rsi.round/1, …). A malformed call
— an unknown campaign, a file outside the editable scope, a path that leaves the folder, bad
arguments — is a tool error whose structured content is the CLI's `rsi.error/1` document (code,
message, hint naming the MCP tool to call, retryable), and it is refused before anything is
written: the campaign's log is unchanged.

Tools: `describe_task`, `check_candidate` (a pre-flight that spends no round), `submit_round`
(files in as {path: content}, the round's verdict out),
`retry_round`, `status`, `best`, `stop`, `final`, `report`, `knowledge`, `sessions`.
Resources: `rsi://task/{campaign}` (the task's TASK.md; the label without its leading `//`)
and `rsi://evidence/{hash}/{size}` (a blob of the store: any evidence file a document names
by digest).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import click
import json

from rsi.errors import ExecutionError, RsiError, StoreError
from rules.campaign.model import CampaignClosed

MAX_FILE_BYTES = 4 << 20
INSTRUCTIONS = (
    "rsi judges candidates of an optimisation campaign. Call describe_task first, then "
    "submit_round with the editable files' full contents; read verdict, reasons, speedup, "
    "review and accepted (a PASS counts only when its review passes). When the budget is used "
    "or you are done, call stop (where allowed) and final."
)


class CallRefused(Exception):
    """A malformed or refused call. The server answers it with a tool error whose structured
    content is the same `rsi.error/1` document the CLI prints under `--json`."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        hint: str | None = None,
        retryable: bool = False,
        state: str = "error",
    ) -> None:
        super().__init__(f"{code}: {message}" + (f" (hint: {hint})" if hint else ""))
        self.code, self.message, self.hint = code, message, hint
        self.retryable, self.state = retryable, state

    def document(self, tool: str) -> dict[str, Any]:
        """The `rsi.error/1` document of this refusal, as an agent reads it."""
        return {
            "schema": "rsi.error/1",
            "tool": tool,
            "state": self.state,
            "error": {
                "code": self.code,
                "message": self.message,
                "hint": self.hint,
                "retryable": self.retryable,
            },
        }


# NB: the service's hints name CLI commands; over MCP the same step is a tool call, and
# what has no tool says so rather than sending the agent to a shell it may not have
_TOKEN = r"([^\s`;,)]+)"
_CLI_TO_TOOL = (
    (
        re.compile(rf"`?rsi round {_TOKEN} --round {_TOKEN}`?"),
        r"the retry_round tool (campaign \1, round \2)",
    ),
    (
        re.compile(rf"`?rsi round {_TOKEN}(?: --from [^`;,)]*)?`?"),
        r"the submit_round tool (campaign \1)",
    ),
    (
        re.compile(rf"`?rsi campaign (final|stop|status|report) {_TOKEN}(?: --json)?`?"),
        r"the \1 tool (campaign \2)",
    ),
    (re.compile(r"`?rsi campaign (final|stop|status|report)`?"), r"the \1 tool"),
    (
        re.compile(r"`(rsi (?:campaign (?:abandon|regrade)|agent \w+)[^`]*)`"),
        r"`\1` (CLI only: no MCP tool)",
    ),
    (
        re.compile(rf"(?<!`)\b(rsi (?:campaign (?:abandon|regrade)|agent \w+)(?: //{_TOKEN})?)"),
        r"`\1` (CLI only: no MCP tool)",
    ),
)


def mcp_hint(hint: str | None) -> str | None:
    """A hint written for the CLI, with each command that has an MCP tool named as that tool."""
    if not hint:
        return hint
    for pattern, repl in _CLI_TO_TOOL:
        hint = pattern.sub(repl, hint)
    return hint


def _refusal(exc: RsiError) -> CallRefused:
    code = getattr(exc, "code", None) or type(exc).__name__
    return CallRefused(
        code,
        exc.message,
        hint=mcp_hint(exc.hint),
        retryable=isinstance(exc, (ExecutionError, StoreError))
        or bool(getattr(exc, "retryable", False)),
        state="refused" if isinstance(exc, CampaignClosed) else "error",
    )


def clean_files(files: Any, scope: list[str], kind: str) -> dict[str, str]:
    """The submission's files checked: relative, inside the editable scope, text, bounded."""
    from rules.campaign.paths import in_scope

    if not isinstance(files, dict) or not files:
        raise CallRefused(
            "bad_files",
            "`files` must be a non-empty object {path: content} of the editable "
            f"files ({', '.join(scope)})",
        )
    out = {}
    for rel, content in files.items():
        if not isinstance(rel, str) or not isinstance(content, str):
            raise CallRefused("bad_files", "every path and every content must be a string")
        norm = os.path.normpath(rel)
        if (
            not rel
            or "\0" in rel
            or rel.startswith("/")
            or norm != rel
            or norm.startswith("..")
            or "\\" in rel
        ):
            raise CallRefused("bad_path", f"{rel!r} is not a clean relative path")
        inside = rel in scope if kind == "task" else in_scope(rel, scope)
        if not inside:
            raise CallRefused(
                "outside_scope",
                f"{rel} lies outside the editable scope ({', '.join(scope)}); "
                "only those files may be submitted",
            )
        if len(content.encode()) > MAX_FILE_BYTES:
            raise CallRefused("too_large", f"{rel} is over {MAX_FILE_BYTES} bytes")
        out[rel] = content
    return out


class CampaignTools:
    """The tools' logic, over one workspace (testable without a transport). Calls that write
    (submit, retry, stop, final, report, knowledge) run one at a time."""

    def __init__(self, ws, *, package: str = "") -> None:
        from rules.campaign.service import Campaigns

        self.ws = ws
        self.service = Campaigns(ws, package=package)
        self.lock = threading.Lock()

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RsiError as exc:
            raise _refusal(exc) from None

    def _camp(self, campaign: str):
        if not isinstance(campaign, str) or not campaign.strip():
            raise CallRefused(
                "bad_campaign", "give the campaign's label, e.g. //tasks/softmax:campaign"
            )
        return self._call(self.service.open, campaign)

    def describe_task(self, campaign: str) -> dict:
        from rules.campaign.agents import task_description

        return self._call(task_description, self._camp(campaign))

    def submit_round(
        self,
        campaign: str,
        files: dict,
        hypothesis: str | None = None,
        usage: dict | None = None,
        session: str | None = None,
    ) -> dict:
        from rules.campaign.usage import validate_usage

        camp = self._camp(campaign)
        clean = clean_files(files, list(camp.scope), camp.kind)
        self._call(validate_usage, usage or {}, "usage")
        if session is not None:
            from rules.campaign.agents import check_session

            self._call(check_session, camp, session)
        work = Path(tempfile.mkdtemp(prefix="rsi-mcp-"))
        try:
            for rel, content in clean.items():
                path = work / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            with self.lock:
                return self._call(
                    self.service.round,
                    campaign,
                    src=work,
                    hypothesis=hypothesis,
                    usage=usage,
                    session=session,
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def check_candidate(self, campaign: str, files: dict) -> dict:
        camp = self._camp(campaign)
        clean = clean_files(files, list(camp.scope), camp.kind)
        work = Path(tempfile.mkdtemp(prefix="rsi-mcp-"))
        try:
            for rel, content in clean.items():
                path = work / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            return self._call(self.service.check, campaign, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def retry_round(self, campaign: str, round: int) -> dict:
        self._camp(campaign)
        if isinstance(round, bool) or not isinstance(round, int) or round < 1:
            raise CallRefused("bad_round", "`round` must be a round number (1, 2, ...)")
        with self.lock:
            return self._call(self.service.round, campaign, number=round)

    def status(self, campaign: str) -> dict:
        self._camp(campaign)
        return self._call(self.service.status, campaign)

    def best(self, campaign: str) -> dict:
        self._camp(campaign)
        return self._call(self.service.best, campaign)

    def stop(self, campaign: str) -> dict:
        self._camp(campaign)
        with self.lock:
            return self._call(self.service.stop, campaign)

    def final(self, campaign: str) -> dict:
        self._camp(campaign)
        with self.lock:
            return self._call(self.service.final, campaign)

    def report(self, campaign: str) -> dict:
        self._camp(campaign)
        with self.lock:
            return self._call(self.service.report, campaign)

    def knowledge(
        self,
        campaign: str,
        query: str,
        budget_chars: int | None = None,
        session: str | None = None,
    ) -> dict:
        from rules.campaign.consult import query_knowledge

        camp = self._camp(campaign)
        with self.lock:
            return self._call(
                query_knowledge, camp, query, budget_chars=budget_chars, session=session
            )

    def sessions(self, campaign: str) -> dict:
        from rules.campaign.agents import sessions_document

        return self._call(sessions_document, self._camp(campaign))

    def task_md(self, campaign: str) -> str:
        label = campaign if campaign.startswith("//") else "//" + campaign
        doc = self.describe_task(label)
        if not doc.get("task_md"):
            raise CallRefused("no_task_md", f"{label} has no TASK.md (an external project?)")
        return doc["task_md"]

    def evidence(self, hash: str, size: str) -> bytes:
        from rsi.runtime import open_store
        from rsi.digest import Digest

        try:
            digest = Digest.parse(f"{hash}/{size}")
        except RsiError as exc:
            raise CallRefused("bad_digest", f"{exc.message}") from None
        return self._call(open_store(self.ws).read_bytes, digest)


def _sdk_refusal(tool: str, exc: Exception) -> CallRefused:
    """A refusal the SDK made before the tool ran, as a CallRefused naming the fields."""
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    if callable(errors):
        parts = []
        for err in errors():
            field = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
            parts.append(f"`{field}`: {err.get('msg', 'invalid')}")
        return CallRefused(
            "bad_arguments",
            f"{tool}: " + "; ".join(parts),
            hint=f"see the {tool} tool's input schema (list_tools)",
        )
    return CallRefused("bad_call", str(exc), hint="list_tools names every tool and its arguments")


def make_server(ws, *, package: str = ""):
    """The MCPServer over `ws` (tools and resources registered)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ResourceError, ToolError
    from mcp.types import CallToolResult, TextContent

    class Server(MCPServer):
        async def call_tool(self, name, arguments, context=None):
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                # NB: the SDK's own refusals (arguments that fail the tool's schema, an
                # unknown tool) are data too: the same document as every other refusal
                refused = _sdk_refusal(name, exc)
                doc = refused.document(name)
                return CallToolResult(
                    content=[TextContent(type="text", text=json.dumps(doc, sort_keys=True))],
                    structured_content=doc,
                    is_error=True,
                )

    tools = CampaignTools(ws, package=package)
    server = Server("rsi", instructions=INSTRUCTIONS)

    def wrap(fn):
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except CallRefused as exc:
                refused = exc
            except Exception as exc:  # noqa: BLE001 - an agent reads a document, not a traceback
                refused = CallRefused(
                    "internal_error",
                    f"{type(exc).__name__}: {exc}",
                    hint="report this; the call may be retried",
                    retryable=True,
                )
            doc = refused.document(fn.__name__)
            return CallToolResult(
                content=[TextContent(type="text", text=json.dumps(doc, sort_keys=True))],
                structured_content=doc,
                is_error=True,
            )

        return call

    def wrap_resource(fn):
        def read(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except CallRefused as exc:
                # NB: a resource read has no structured error; its message is the document
                raise ResourceError(json.dumps(exc.document(fn.__name__), sort_keys=True)) from None

        return read

    @server.tool(description="What the campaign asks: TASK.md, contract, editable scope, budget.")
    def describe_task(campaign: str) -> dict[str, Any]:
        return wrap(tools.describe_task)(campaign)

    @server.tool(
        description="Submit a candidate ({path: full content} of editable files) and judge "
        "its round: the rsi.round/1 document (verdict, reasons, speedup, review, accepted, "
        "budget, best). `session`: the dispatch id from `rsi agent prepare`, once bound."
    )
    def submit_round(
        campaign: str,
        files: dict[str, str],
        hypothesis: str | None = None,
        usage: dict[str, Any] | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        return wrap(tools.submit_round)(campaign, files, hypothesis, usage, session)

    @server.tool(
        description="Pre-flight a candidate ({path: full content} of editable files) without "
        "spending a round: files parse, the entry imports, exists and takes the baseline's "
        "arguments. rsi.candidate.check/1; about a second; never counted, never measured; "
        "at most 60 per campaign and hour. Use it before submit_round after an edit."
    )
    def check_candidate(campaign: str, files: dict[str, str]) -> dict[str, Any]:
        return wrap(tools.check_candidate)(campaign, files)

    @server.tool(description="Build round N again (a retry after an infrastructure fault).")
    def retry_round(campaign: str, round: int) -> dict[str, Any]:
        return wrap(tools.retry_round)(campaign, round)

    @server.tool(description="rsi.campaign.status/1: rounds, best, budget, final (runs nothing).")
    def status(campaign: str) -> dict[str, Any]:
        return wrap(tools.status)(campaign)

    @server.tool(description="The best round so far (PASS and review passed; runs nothing).")
    def best(campaign: str) -> dict[str, Any]:
        return wrap(tools.best)(campaign)

    @server.tool(description="End the campaign's rounds now (campaigns that accept `agent`).")
    def stop(campaign: str) -> dict[str, Any]:
        return wrap(tools.stop)(campaign)

    @server.tool(description="The final: an independent re-measure of the selected round.")
    def final(campaign: str) -> dict[str, Any]:
        return wrap(tools.final)(campaign)

    @server.tool(description="rsi.campaign.report_result/1 (never measures anything).")
    def report(campaign: str) -> dict[str, Any]:
        return wrap(tools.report)(campaign)

    @server.tool(
        description="Retrieve material for QUERY from the campaign's knowledge sources within "
        "a character budget; the record (digests, sources, what was cut) is referenced by your "
        "next round. Retrieval returns material; it never claims you used it."
    )
    def knowledge(
        campaign: str,
        query: str,
        budget_chars: int | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        return wrap(tools.knowledge)(campaign, query, budget_chars, session)

    @server.tool(description="The campaign's agent sessions: dispatches, bindings, rounds.")
    def sessions(campaign: str) -> dict[str, Any]:
        return wrap(tools.sessions)(campaign)

    @server.resource(
        "rsi://task/{+campaign}",
        name="TASK.md",
        description="The task's TASK.md for a campaign (label without the leading //)",
        mime_type="text/markdown",
    )
    def task_md(campaign: str) -> str:
        return wrap_resource(tools.task_md)(campaign)

    @server.resource(
        "rsi://evidence/{hash}/{size}",
        name="evidence",
        description="A blob of the store by digest (hash/size): any evidence a document names",
        mime_type="application/octet-stream",
    )
    def evidence(hash: str, size: str) -> bytes:
        return wrap_resource(tools.evidence)(hash, size)

    return server


@click.command("mcp")
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio (an agent host spawns `rsi mcp`), or streamable HTTP on 127.0.0.1.",
)
@click.option("--port", type=int, default=8766, show_default=True, help="HTTP port.")
@click.pass_context
def mcp_cmd(ctx: click.Context, transport: str, port: int) -> None:
    """Serve the campaign API over the Model Context Protocol (needs rsi[mcp])."""
    from rsi.errors import UsageError
    from rules.cli_support import service_for

    try:
        import mcp  # noqa: F401
    except ImportError:
        raise UsageError(
            f"rsi mcp needs the `mcp` package, which {sys.executable} does not have",
            hint=f"{sys.executable} -m pip install 'mcp>=2.3,<3' (or ./scripts/setup.sh, which "
            "installs it); adding it changes no judge identity",
        ) from None
    svc = service_for(ctx)
    server = make_server(svc.ws, package=svc.package)
    if transport == "stdio":
        server.run("stdio")
    else:
        # NB: loopback only: the API submits code to be run
        server.run("streamable-http", host="127.0.0.1", port=port)
