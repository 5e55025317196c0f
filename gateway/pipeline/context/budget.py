"""The input budget of one request: the tenant's budget, capped by the model's context window minus the
room reserved for the answer."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import ContextConfig
from gateway.ports import JSONObject


@dataclass(frozen=True, slots=True)
class Budget:
    input_tokens: int
    reserve_tokens: int
    context_window: int | None


def response_reserve(body: JSONObject, config: ContextConfig) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return config.response_reserve_tokens


def compute_budget(body: JSONObject, config: ContextConfig, model_window: int | None) -> Budget:
    window = config.context_window_tokens or model_window
    reserve = response_reserve(body, config)
    budget = config.budget_tokens
    if window is not None:
        budget = min(budget, max(window - reserve, 0))
    return Budget(input_tokens=budget, reserve_tokens=reserve, context_window=window)
