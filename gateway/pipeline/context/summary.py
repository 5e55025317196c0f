"""Summary section: the newest rolling task-state summary on this request's own path.

Summaries are keyed by the node they cover up to; only one whose node lies on the request's path is
used, so a branch never sees another branch's summary. The recent window then starts right after that
node: nothing is sent twice. When no summary is ready the section proposes nothing and the request does
not wait for one.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.pipeline.context.section import BuildInput, Proposal
from gateway.ports import JSONObject, SummaryStore
from gateway.records import Summary


@dataclass(slots=True)
class SummarySection:
    summaries: SummaryStore
    allowance: int
    name: str = "summary"
    whole: bool = True

    async def plan(self, build: BuildInput) -> int:
        return self.allowance

    async def propose(self, build: BuildInput, allowance: int) -> Proposal:
        state = build.call.state
        if state.conversation_id is None or not build.history:
            return Proposal()
        on_path = {item.node_id for item in build.history if item.node_id is not None}
        rows = await self.summaries.summaries(build.call.tenant, state.conversation_id, "global")
        chosen = next((row for row in rows if row.node_id in on_path), None)
        if chosen is None:
            return Proposal(detail={"available": len(rows)}, pin={})
        return self._shown(build, chosen, allowance)

    async def restore(self, build: BuildInput, pin: JSONObject) -> Proposal:
        """The summary an epoch pinned (one that landed since waits for the next epoch); the coverage of
        the newest on the path is reported still, so compaction knows what is folded already."""
        state = build.call.state
        if state.conversation_id is None:
            return Proposal(pin=pin)
        rows = await self.summaries.summaries(build.call.tenant, state.conversation_id, "global")
        on_path = {item.node_id for item in state.items if item.node_id is not None}
        newest = next((row for row in rows if row.node_id in on_path), None)
        detail: JSONObject = {"newest_covers_tokens": newest.path_tokens} if newest is not None else {}
        if isinstance(pin.get("skipped"), str):
            detail["skipped"] = pin["skipped"]
        chosen = next((row for row in rows if row.id == pin.get("summary_id")), None)
        if chosen is None:
            return Proposal(detail=detail, pin=pin)
        proposal = self._shown(build, chosen, None)
        proposal.detail.update(detail)
        return proposal

    def _shown(self, build: BuildInput, chosen: Summary, allowance: int | None) -> Proposal:
        text = (
            f"## Conversation so far (task state up to message #{chosen.depth}, "
            f"{chosen.created_at:%Y-%m-%d})\n{chosen.content}"
        )
        tokens = build.tokenizer.count(text)
        detail: JSONObject = {
            "summary_id": chosen.id,
            "node_id": chosen.node_id,
            "covers_tokens": chosen.path_tokens,
        }
        if allowance is not None and tokens > allowance:
            return Proposal(detail={**detail, "skipped": "over allowance"}, pin={})
        pin: JSONObject = {"summary_id": chosen.id}
        return Proposal(tokens=tokens, text=text, detail=detail, covers_through=chosen.node_id, pin=pin)
