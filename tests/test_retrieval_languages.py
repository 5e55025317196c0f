"""Retrieval in Chinese and Korean work chats that mix in English identifiers, end to end: the real
gateway, real LanceDB, the real local embedder, the official SDK; what counts is what the upstream got.
An old turn is found by an exact identifier, by a time reference in the same language, and by a question
that words it differently (sharing the topic's words, not the sentence)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.conftest import Gateway, Upstream, api
from tests.test_retrieval import Clock, gateway_with, injected, wait_for_jobs

# The model and LanceDB are what these tests are about.
pytestmark = pytest.mark.real

CHATS = {
    "zh": {
        "filler": [
            "今天的站会主要讨论了前端的按钮颜色和字体大小。",
            "午饭我们点了牛肉面，味道还不错。",
            "下午要把周报整理好发给产品经理。",
            "测试环境的浏览器版本需要统一一下。",
            "新同事下周一入职，需要准备电脑和账号。",
            "设计稿里的图标有几个还没有切图。",
        ],
        "planted": "支付网关的重试上限改成了7次，配置在 retry_policy.yaml 里，由 PAY-2291 跟踪。",
        "later": "订单服务的缓存过期时间定为90秒，写在 order_cache.toml 中。",
        "by_identifier": "PAY-2291 那个改动具体是什么？",
        "by_time": "上周我们对订单服务的缓存做了什么决定？",
        "by_rewording": "支付网关重试的次数上限后来定成多少了？",
    },
    "ko": {
        "filler": [
            "오늘 스탠드업에서는 프론트엔드 버튼 색상과 글꼴 크기를 이야기했어요.",
            "점심으로 김치찌개를 먹었는데 맛있었어요.",
            "오후에는 주간 보고서를 정리해서 기획자에게 보내야 해요.",
            "테스트 환경의 브라우저 버전을 맞춰야 합니다.",
            "새 동료가 다음 주 월요일에 입사해서 노트북과 계정을 준비해야 해요.",
            "디자인 시안의 아이콘 몇 개가 아직 잘리지 않았어요.",
        ],
        "planted": "결제 게이트웨이의 재시도 한도를 7회로 바꿨고, 설정은 retry_policy.yaml 에 있으며 PAY-2291 로 추적합니다.",
        "later": "주문 서비스의 캐시 만료 시간을 90초로 정했고 order_cache.toml 에 적었어요.",
        "by_identifier": "PAY-2291 변경 내용이 정확히 뭐였죠?",
        "by_time": "지난주에 주문 서비스 캐시에 대해 무엇을 결정했나요?",
        "by_rewording": "결제 게이트웨이 재시도 한도는 결국 몇 회로 정했죠?",
    },
}


@pytest.mark.parametrize("model", [None, "multilingual-e5-small-q4"], ids=["minilm", "e5"])
@pytest.mark.parametrize("language", ["zh", "ko"])
def test_old_turns_are_found_in_chinese_and_korean(
    language: str, model: str | None, upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    chat = CHATS[language]
    filler = list(chat["filler"])
    clock = Clock(datetime(2026, 3, 2, 10, 0, tzinfo=UTC))  # a Monday
    gateway = gateway_with(
        make_gateway,
        upstream,
        clock=clock,
        context={"budget_tokens": 1_200},
        retrieval={"embedder": {"model": model}},
    )
    client = gateway.client()
    thin = {"X-Conversation-Id": f"work-{language}"}

    def say(text: str) -> dict[str, Any]:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": text}], extra_headers=thin
        )
        report: dict[str, Any] = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
        return report

    say(str(chat["planted"]))
    for i in range(8):
        say(filler[i % len(filler)])
    clock.now = datetime(2026, 3, 10, 10, 0, tzinfo=UTC)  # the week after
    say(str(chat["later"]))
    for i in range(8):
        say(filler[(i + 3) % len(filler)])
    clock.now = datetime(2026, 3, 18, 10, 0, tzinfo=UTC)  # "last week" is now 9-15 March
    for i in range(8):
        say(filler[(i + 1) % len(filler)])
    wait_for_jobs(gateway)

    say(str(chat["by_identifier"]))  # an English identifier inside Chinese or Korean text
    assert str(chat["planted"]) in injected(upstream)

    say(str(chat["by_time"]))  # "上周" / "지난주": only last week's messages qualify
    block = injected(upstream)
    assert str(chat["later"]) in block and "[2026-03-10" in block
    assert str(chat["planted"]) not in block

    report = say(str(chat["by_rewording"]))  # the same topic in other words, no identifier
    assert str(chat["planted"]) in injected(upstream), report["sections"]["retrieval"]
