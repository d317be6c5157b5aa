"""A campaign's `report` and `dashboard` targets: documents rendered from the rounds', best's and
final's documents in actions. Must never judge anything anew."""

import json
import os

from rsi.attrs import attr
from rsi.rule import Artifact, Provider, Rule, RuleContext
from rules.campaign.rule_common import tool_platform, union
from rules.domain import (
    host_python_identity,
)
from rules.providers import (
    BestInfo,
    BindingInfo,
    DashboardInfo,
    FinalInfo,
    ProjectBaseline,
    ReportInfo,
    RoundInfo,
    dep_info,
    dep_infos,
)
from rules.steps import ENV, HARNESS_EXEC, NO_SITE, PY, harness_files


def _report(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    name = ctx.label.name
    docs = [r.doc for r in dep_infos(ctx, "rounds", RoundInfo)]
    best = dep_info(ctx, "best", BestInfo).best
    final = dep_info(ctx, "final", FinalInfo).final
    argv = [*PY, NO_SITE, f"{HARNESS_EXEC}/report.py", "--campaign", a["campaign"]]
    for d in docs:
        argv += ["--round", d.path]
    extra = []
    if a["abandoned"]:
        gave_up = ctx.write(
            f"{name}/abandoned.json", json.dumps(a["abandoned"], sort_keys=True, indent=1)
        )
        argv += ["--abandoned", gave_up.path]
        extra.append(gave_up)
    outs = ctx.action(
        argv=[
            *argv,
            "--best",
            best.path,
            "--final",
            final.path,
            "--out-json",
            ctx.exec_path(f"{name}/report.json"),
            "--out-md",
            ctx.exec_path(f"{name}/report.md"),
        ],
        inputs=[*harness_files("report"), *docs, best, final, *extra],
        outputs=[f"{name}/report.json", f"{name}/report.md"],
        mnemonic="Report",
        env=ENV,
        platform=tool_platform(dep_info(ctx, "binding", BindingInfo, ProjectBaseline).platform),
        timeout_s=60,
    )
    return Provider(files=outs, info=ReportInfo(json=outs[0], markdown=outs[1], show=outs[1].path))


CAMPAIGN_REPORT = Rule(
    name="campaign_report",
    doc="(generated) The campaign's report: rounds, selection, final and usage (JSON + Markdown).",
    attrs={
        "campaign": attr("string", "the campaign label"),
        "rounds": attr("label_list", "the round targets (abandoned rounds left out)"),
        "best": attr("label", "the best target"),
        "final": attr("label", "the final target"),
        "binding": attr("label", "the binding, or the frozen project baseline"),
        "abandoned": attr(
            "table_list",
            "the abandoned rounds: round, label, reason, time, candidate_digest, hypothesis, usage",
            default=[],
        ),
    },
    impl=_report,
)


def _dashboard(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    name = ctx.label.name
    rounds = dep_infos(ctx, "rounds", RoundInfo)
    report = dep_info(ctx, "report", ReportInfo)
    dep_info(ctx, "final", FinalInfo)
    dep_info(ctx, "binding", BindingInfo, ProjectBaseline)
    final = ctx.dep(a["final"])
    page = f"{name}/index.html"
    here = os.path.dirname(ctx.exec_path(page))

    def link(art: Artifact) -> str:
        # NB: relative, so the page works wherever out/ is, and its bytes name no host path
        return os.path.relpath(art.path, here)

    links = {
        str(r.round): {
            "round.json": link(r.doc),
            "verdict.json": link(r.verdict),
            "check.json": link(r.check),
            "samples.json": link(r.samples),
            "verdict.txt": link(r.table),
        }
        for r in rounds
    }
    meta = ctx.write(
        f"{name}/meta.json",
        json.dumps(
            {
                "campaign": a["campaign"],
                "binding": str(a["binding"]),
                "kind": a["kind"],
                "started_at": a["started_at"],
                "max_rounds": a["max_rounds"],
                "links": links,
                "final_links": {f.path.rsplit("/", 1)[-1]: link(f) for f in final.files},
            },
            sort_keys=True,
            indent=1,
        ),
    )
    argv = [*PY, f"{HARNESS_EXEC}/dashboard.py", "--meta", meta.path, "--report", report.json.path]
    for r in rounds:
        argv += ["--round", r.doc.path, "--verdict", r.verdict.path]
    outs = ctx.action(
        argv=[
            *argv,
            "--out-html",
            ctx.exec_path(page),
            "--out-json",
            ctx.exec_path(f"{name}/dashboard.json"),
            "--out-txt",
            ctx.exec_path(f"{name}/summary.txt"),
        ],
        inputs=union(
            harness_files("dashboard"),
            (meta, report.json),
            tuple(f for r in rounds for f in (r.doc, r.verdict)),
        ),
        outputs=[page, f"{name}/dashboard.json", f"{name}/summary.txt"],
        mnemonic="Dashboard",
        env=ENV,
        # NB: rendered by the interpreter rsi runs on, which has jinja2 (a dependency of rsi),
        # whatever toolchain the binding's rounds ran in; it times nothing and needs no device
        platform={"toolchain": host_python_identity(("dashboard",))},
        timeout_s=120,
    )
    evidence = tuple(f for r in rounds for f in (r.doc, r.verdict, r.check, r.samples, r.table))
    return Provider(
        files=union(outs, evidence, tuple(final.files), (report.json, report.markdown)),
        info=DashboardInfo(html=outs[0], json=outs[1], text=outs[2], show=outs[2].path),
    )


CAMPAIGN_DASHBOARD = Rule(
    name="campaign_dashboard",
    doc="(generated) The campaign's HTML report (index.html: curves, intervals, reasons, "
    "cost, final, fingerprint; self-contained), its view model (dashboard.json) and a text "
    "summary with the same fields. Building it also copies the evidence it links under out/.",
    attrs={
        "campaign": attr("string", "the campaign label"),
        "rounds": attr("label_list", "the round targets (abandoned rounds left out)"),
        "final": attr("label", "the final target"),
        "report": attr("label", "the report target"),
        "binding": attr("label", "the binding, or the frozen project baseline"),
        "kind": attr("string", "task or project"),
        "started_at": attr("float", "log time of the campaign's start", default=None),
        "max_rounds": attr("int", "the campaign's round budget"),
    },
    impl=_dashboard,
)
