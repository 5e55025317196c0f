"""Profile job: rewrite a user's profile document from their active memories of the user's own scope.

Queued (one per user, after a delay) when extraction changes what is known of the user. Only the
generated text is written: the user's own version, when they edited it, is shown instead and never
touched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.jobs.extract_memory import MemoryTarget
from gateway.memory.llm import CallStats, ask
from gateway.memory.ports import MemoryStore
from gateway.memory.prompts import profile_request
from gateway.memory.records import USER_SCOPE, MemoryFilter
from gateway.memory.replies import Junk
from gateway.records import Job

log = logging.getLogger(__name__)

PROFILE_SOURCE_MEMORIES = 200  # the newest ones, when a user has more


def _document(reply: str) -> str:
    text = reply.strip()
    if not text:
        raise Junk("an empty profile")
    return text


@dataclass(slots=True)
class ProfileHandler:
    memories: MemoryStore
    targets: Callable[[str], MemoryTarget | None]
    stats: CallStats = field(default_factory=CallStats)

    async def __call__(self, job: Job) -> None:
        user_id, model = job.payload.get("user_id"), job.payload.get("model")
        target = self.targets(job.tenant)
        if not isinstance(user_id, str) or target is None or not target.config.profile:
            return
        known = await self.memories.find(
            job.tenant, MemoryFilter(user_id, scopes=(USER_SCOPE,), limit=PROFILE_SOURCE_MEMORIES)
        )
        if not known:
            await self.memories.save_profile(job.tenant, user_id, generated=None)
            return
        name = target.config.model or (model if isinstance(model, str) else "")
        request = profile_request(name, known, target.config.profile_tokens)
        text = await ask(target.upstream, request, _document, self.stats)
        # The profile records what it was written from: a memory committed while the model wrote it is
        # not covered, so the memory section still shows it beside the profile.
        await self.memories.save_profile(job.tenant, user_id, generated=text, memories=known)
        log.info("profile of %s rewritten from %d memories", user_id, len(known))
