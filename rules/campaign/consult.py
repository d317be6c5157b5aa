"""The knowledge query as an agent's operation (`rsi campaign knowledge`, MCP `knowledge`): checks
the session, retrieves within the recorded policy, stores the record and appends its log entry. Owns
that operation; retrieval itself is rules/campaign/knowledge.py and must stay pure. It must never
change what retrieval returns (rules/campaign/knowledge.py decides that)."""

from __future__ import annotations

import json

from rsi.runtime import open_store
from rsi.digest import Digest
from rsi.errors import UsageError
from rules.campaign.agents import check_session
from rules.campaign.knowledge import RECORD_SCHEMA, RESULT_SCHEMA, gather, recorded_policy, retrieve
from rules.campaign.model import Campaign, CampaignClosed, state_of
from rules.campaign.start import append_start


def query_knowledge(
    camp: Campaign,
    query: str,
    *,
    budget_chars: int | None = None,
    session: str | None = None,
) -> dict:
    """Retrieve, store the record in the CAS, append a `knowledge` log entry; returns
    rsi.campaign.knowledge/1 (the record's content and its digest)."""
    if not query or not query.strip():
        raise UsageError("the knowledge query is empty")
    if session is not None:
        check_session(camp, session)
    state = state_of(camp.log.read())
    policy = recorded_policy(camp, state)
    if not policy["enabled"]:
        raise CampaignClosed(
            "knowledge_disabled",
            f"{camp.label} has knowledge switched off (knowledge.enabled = false); switching "
            "it on is a new campaign",
            hint="declare another campaign with knowledge enabled",
        )
    budget = policy["budget_chars"]
    if budget_chars is not None:
        if isinstance(budget_chars, bool) or not isinstance(budget_chars, int) or budget_chars < 1:
            raise UsageError("the budget must be a positive number of characters")
        budget = min(budget, budget_chars)  # NB: a caller may ask for less, never more
    sources = gather(camp, policy)
    got = retrieve(query, sources, budget)
    record = {
        "schema": RECORD_SCHEMA,
        "campaign": str(camp.label),
        "query": query,
        "session": session,
        "policy": policy,
        "budget_chars": budget,
        "sources": [
            {k: s.get(k) for k in ("source", "kind", "path", "sha256", "version")} for s in sources
        ],
        **got,
        "note": "retrieval returns material; it never claims the agent used it",
    }
    data = (json.dumps(record, sort_keys=True, indent=1) + "\n").encode()
    store = open_store(camp.ws)
    digest = str(store.put_bytes(data))
    with camp.log.locked():
        state = state_of(camp.log.read())
        if state.start is None and not state.candidates:
            append_start(camp, store, camp.clock())
        camp.log.append(
            {
                "kind": "knowledge",
                "time": camp.clock(),
                "record": digest,
                "session": session,
                "query": query,
                "returned": len(got["returned"]),
                "cut": len(got["cut"]),
            }
        )
    return {
        "schema": RESULT_SCHEMA,
        "campaign": str(camp.label),
        "record": digest,
        "record_path": str(store.blob_path(Digest.parse(digest))),
        **record,
    }
