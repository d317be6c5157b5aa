"""A campaign's `round-N` and `best` targets: one candidate judged by the binding's steps and
reviewed, and the selection over every counted round. Must never read the log (the generate
hook passes what a round needs as attributes)."""

import hashlib
import json

from rsi.attrs import attr
from rsi.label import Label
from rsi.rule import Provider, Rule, RuleContext
from rules.campaign.paths import in_scope
from rules.campaign.snapshot import manifest_digest
from rules.campaign.project_rules import digest_artifacts, project_actions, snapshot_action
from rules.campaign.rule_common import tool_platform
from rules import steps
from rules.domain import (
    verdict_actions,
)
from rules.providers import (
    BestInfo,
    BindingInfo,
    ProjectBaseline,
    RoundInfo,
    dep_info,
    dep_infos,
)
from rules.review import review_action
from rules.spec_checks import ASSESS_KEYS, check_policy
from rules.steps import ENV, HARNESS_EXEC, NO_SITE, PY, harness_files


def evidence_dir(ctx: RuleContext, binding: Label | str) -> str:
    """Where a round's judge evidence lives for `binding`: package-relative, named by the
    binding (its package too when that is another one)."""
    label = Label.parse(str(binding))
    if label.package == ctx.label.package:
        return f"_evidence/{label.name}"
    return f"_evidence/{label.package.replace('/', '.')}.{label.name}"


def _round(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    dep_info(ctx, "binding", BindingInfo, ProjectBaseline)
    check_policy(a["assess"], ASSESS_KEYS, "assess", ctx.error)
    binding = ctx.dep(a["binding"])
    name = ctx.label.name
    kind = "project" if isinstance(binding.info, ProjectBaseline) else "task"
    # NB: the candidate and its evidence live at paths named by the binding and the content
    # (never by the round or the campaign), so the same content under the same binding has
    # the same check, measure and assess keys in any round of any campaign of this package:
    # it is judged once, and every later round reuses that evidence
    content = manifest_digest(a["files"], a["executable"]).split("/")[0]
    evidence = f"{evidence_dir(ctx, a['binding'])}/{content}/"
    cand_rel = f"_cand/{content}"
    cand_dir = ctx.exec_path(cand_rel)
    files = digest_artifacts(ctx, cand_rel, a["files"], a["executable"])
    if not files:
        raise ctx.error("the candidate holds no files", "files")
    if kind == "task":
        info = BindingInfo.of(binding)
        editable = set(info.editable)
        outside = sorted(set(a["files"]) - editable)
        if outside:
            raise ctx.error(
                f"{', '.join(outside)} lie outside the editable scope "
                f"({', '.join(sorted(editable))})",
                "files",
            )
        assess_spec, verdict_dir = None, evidence
        full = info.full_spec
        if a["assess"] and dict(full["assess"], **a["assess"]) != full["assess"]:
            text = json.dumps(
                dict(full, assess=dict(full["assess"], **a["assess"])), sort_keys=True, indent=1
            )
            # NB: a regraded policy's verdict lives apart from the declared policy's
            policy = hashlib.sha256(text.encode()).hexdigest()[:16]
            verdict_dir = f"{evidence}assess-{policy}/"
            assess_spec = ctx.write(f"{verdict_dir}assess_spec.json", text)
        out = verdict_actions(
            ctx,
            binding,
            files,
            cand_dir,
            prefix=verdict_dir,
            evidence=evidence,
            assess_spec=assess_spec,
        )
        # NB: beside the check (under the content's evidence folder, so it is reviewed once);
        # it reads source and evidence, times nothing and needs no device
        out["review"] = review_action(
            ctx, info, files, cand_dir, evidence, out["check"], tool_platform(info.platform)
        )
    else:
        patterns = ProjectBaseline.of(binding).editable
        outside = sorted(f for f in a["files"] if not in_scope(f, patterns))
        if outside:
            raise ctx.error(f"{', '.join(outside)} lie outside the editable scope", "files")
        out = project_actions(ctx, binding, files, cand_dir, prefix=evidence)
    platform = binding.info.platform
    tools = tool_platform(platform)
    meta = ctx.write(
        f"{name}/meta.json",
        json.dumps(
            {
                "campaign": a["campaign"],
                "round": a["round"],
                "label": str(ctx.label),
                "kind": kind,
                "digest": a["digest"],
                "files": dict(sorted(a["files"].items())),
                "hypothesis": a["hypothesis"],
                "usage": a["usage"],
                "submitted_at": a["submitted_at"],
                # NB: only when set, so a round without them keeps its document's key
                **({"session": dict(a["session"])} if a["session"] else {}),
                **({"knowledge": list(a["knowledge"])} if a["knowledge"] else {}),
            },
            sort_keys=True,
            indent=1,
        ),
    )
    review = out.get("review")
    doc = steps.ROUND_DOC.run(
        ctx,
        out=f"{name}/round.json",
        inputs=[meta, out["verdict"], out["check"], *((review,) if review else ())],
        mnemonic="RoundDoc",
        platform=tools,
        timeout_s=60,
        meta=meta.path,
        verdict=out["verdict"].path,
        check=out["check"].path,
        review=review.path if review else None,
    )
    snap = snapshot_action(ctx, cand_dir, files, f"{name}/files", tools)
    return Provider(
        files=(
            doc,
            out["verdict"],
            out["table"],
            out["check"],
            out["samples"],
            *((review,) if review else ()),
            *snap,
        ),
        info=RoundInfo(
            show=out["table"].path,
            round=a["round"],
            doc=doc,
            verdict=out["verdict"],
            check=out["check"],
            samples=out["samples"],
            table=out["table"],
            cand_files=files,
            cand_dir=cand_dir,
            kind=kind,
            platform=platform,
            review=review,
        ),
    )


CAMPAIGN_ROUND = Rule(
    name="campaign_round",
    doc="(generated) One campaign round: the logged candidate materialised from the store and "
    "judged under the campaign's binding, plus its round document (round.json).",
    attrs={
        "binding": attr("label", "the binding, or the campaign's frozen project baseline"),
        "campaign": attr("string", "the campaign label"),
        "round": attr("int", "1-based round number"),
        "files": attr("table", "{path: digest} of the candidate"),
        "executable": attr("string_list", "executable files of the candidate", default=[]),
        "digest": attr("string", "the candidate's manifest digest"),
        "hypothesis": attr("string", "why the agent expects it to be faster", default=""),
        "usage": attr("table", "what the agent reported spending", default={}),
        "submitted_at": attr("float", "log time of the entry"),
        "assess": attr(
            "table",
            "the assessment policy of the campaign's last regrade (empty: the binding's)",
            default={},
        ),
        "session": attr(
            "table",
            "the agent session that made the candidate: dispatch, session, model (empty: none "
            "named)",
            default={},
        ),
        "knowledge": attr(
            "string_list",
            "digests of the knowledge records retrieved before the candidate was submitted",
            default=[],
        ),
    },
    impl=_round,
)


def _best(ctx: RuleContext) -> Provider:
    docs = [r.doc for r in dep_infos(ctx, "rounds", RoundInfo)]
    platform = tool_platform(dep_info(ctx, "binding", BindingInfo, ProjectBaseline).platform)
    argv = [*PY, NO_SITE, f"{HARNESS_EXEC}/selection.py"]
    for d in docs:
        argv += ["--round", d.path]
    best = ctx.action(
        argv=[*argv, "--out", ctx.exec_path(f"{ctx.label.name}/best.json")],
        inputs=[*harness_files("select"), *docs],
        outputs=[f"{ctx.label.name}/best.json"],
        mnemonic="Select",
        env=ENV,
        platform=platform,
        timeout_s=60,
    )[0]
    return Provider(files=(best,), info=BestInfo(best=best))


CAMPAIGN_BEST = Rule(
    name="campaign_best",
    doc="(generated) The campaign's best round: highest paired improvement against its own "
    "baseline among PASS rounds (never absolute numbers across rounds); abandoned rounds "
    "are not among its rounds.",
    attrs={
        "rounds": attr("label_list", "the round targets (abandoned rounds left out)"),
        "binding": attr("label", "the binding, or the frozen project baseline"),
    },
    impl=_best,
)
