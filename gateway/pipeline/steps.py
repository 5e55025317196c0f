"""The seams the context features plug into: steps before forwarding and after the answer.

Before forwarding, `PrepareStep`s may replace the payload (identify, ingest, build the context); after the
answer, `CompleteStep`s see the outcome (persist, enqueue jobs). Both fail open: a broken step is logged
and counted, and the client's own request is forwarded unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from gateway.errors import ClientError
from gateway.metrics import Counters
from gateway.pipeline.call import ChatCall, ChatOutcome
from gateway.ports import ChatPayload
from gateway.tracing import spanned

log = logging.getLogger(__name__)


class PrepareStep(Protocol):
    async def __call__(self, call: ChatCall, payload: ChatPayload) -> ChatPayload: ...


class CompleteStep(Protocol):
    async def __call__(self, call: ChatCall, outcome: ChatOutcome) -> None: ...


class ChatPipeline:
    def __init__(
        self,
        counters: Counters,
        prepare: Sequence[PrepareStep] = (),
        complete: Sequence[CompleteStep] = (),
    ) -> None:
        self._counters = counters
        self._prepare = tuple(prepare)
        self._complete = tuple(complete)
        # False for a pure proxy: nothing is done with the answer, which then need not be read at all.
        self.completes = bool(self._complete)

    async def prepare(self, call: ChatCall) -> ChatPayload:
        original = ChatPayload(call.body, call.raw)
        payload = original
        for step in self._prepare:
            try:
                with spanned(call.trace, _span_name(step)):
                    payload = await step(call, payload)
            except ClientError:
                raise  # the request itself is wrong (e.g. nested deeper than can be stored): said, not forwarded
            # Fail open by design (design.md §2): memory failing must never fail the user's request.
            except Exception:
                self._counters.fail_open += 1
                log.exception("prepare step %r failed; forwarding the original request", step)
                return original
        return payload

    async def complete(self, call: ChatCall, outcome: ChatOutcome) -> None:
        for step in self._complete:
            try:
                with spanned(call.trace, _span_name(step)):
                    await step(call, outcome)
            except Exception:
                self._counters.complete_errors += 1
                # What was dropped, said exactly: this step's writes for this request (persist: the answer,
                # the request record and their jobs; a client that resends the history stores the
                # messages with its next request).
                log.exception(
                    "complete step %r failed for request %s (conversation %s): its writes are dropped",
                    step,
                    call.request_id,
                    call.state.conversation_id,
                )


def _span_name(step: object) -> str:
    """A step's span: its `span_name` (identify, ingest, build, persist...), else its class's name."""
    name = getattr(step, "span_name", None)
    return name if isinstance(name, str) else type(step).__name__
