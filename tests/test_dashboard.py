"""The dashboard in a real browser: Playwright driving Debian's Chromium against a real gateway that the
official SDK filled. Screenshots go to the test's tmp dir."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from gateway.fakes.openai_upstream import Reply
from gateway.fakes.server import BackgroundServer
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, recorded, tenant, wait_for_jobs
from tests.test_cache_usage import ANSWER, provider_app

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
OTHER_KEY = "sk-gw-globex"
ADMIN_KEY = "sk-admin-dashboard"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "the dashboard tests need Chromium: apt-get install -y chromium"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield launched
        launched.close()


@pytest.fixture
def filled(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> tuple[Gateway, dict[str, str]]:
    """A gateway with one conversation of two branches, the newest request rebuilt under a small budget."""
    gateway = make_gateway(
        [
            tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], context={"budget_tokens": 400}),
            tenant("globex", upstream.base_url, api_keys=[OTHER_KEY]),
        ]
    )
    upstream.fake.enqueue(Reply("A1"), Reply("A2"))
    client = gateway.client(default_headers={"X-User-Id": "u-dash"})
    history: list[Any] = [{"role": "user", "content": "First question about parcel PX-11."}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    history += [
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Original second question."},
    ]
    first = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    recorded(gateway, first.headers["x-gateway-request-id"])
    edited = [*history[:2], {"role": "user", "content": "Edited second question."}]
    for n in range(10):
        edited += [
            {"role": "assistant", "content": f"note {n}"},
            {"role": "user", "content": f"more detail {n} " * 15},
        ]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=edited)
    recorded(gateway, raw.headers["x-gateway-request-id"])
    return gateway, {
        "conversation": raw.headers["x-conversation-id"],
        "request": raw.headers["x-gateway-request-id"],
    }


def sign_in(page: Page, gateway: Gateway, key: str) -> None:
    page.goto(f"{gateway.server.url}/dashboard")
    page.fill("input[name=key]", key)
    page.click("#login button")


def test_a_tenant_signs_in_walks_the_tree_and_reads_a_requests_context(
    browser: Browser, filled: tuple[Gateway, dict[str, str]], upstream: Upstream, tmp_path: Path
) -> None:
    gateway, ids = filled
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()

    page.goto(f"{gateway.server.url}/dashboard/conversations/{ids['conversation']}")
    assert "/dashboard/login" in page.url  # anonymous: the login page, and no data
    assert "PX-11" not in page.content() and page.locator("#tenant").count() == 0
    page.fill("input[name=key]", "sk-not-a-key")
    page.click("#login button")
    assert page.text_content("#error") == "That key is not a gateway key."
    page.fill("input[name=key]", GATEWAY_KEY)
    page.click("#login button")
    # Back where the visitor was going, signed in as the key's tenant.
    assert page.url.endswith(f"/dashboard/conversations/{ids['conversation']}")
    assert page.text_content("#tenant") == "acme"
    page.screenshot(path=str(tmp_path / "conversation.png"), full_page=True)

    # Two branches; the newest is highlighted; switching shows the other path.
    branches = page.locator("#branches a")
    assert branches.count() == 2
    on_path = page.locator(".node.on-path").all_text_contents()
    assert any("Edited second question." in t for t in on_path)
    assert not any("Original second question." in t for t in on_path)
    page.click("#branches a >> text=A2")
    on_path = page.locator(".node.on-path").all_text_contents()
    assert any("Original second question." in t for t in on_path)
    assert not any("Edited second question." in t for t in on_path)

    # The request's stacked bar says what its ContextReport says.
    page.click(f"#requests a[href='/dashboard/requests/{ids['request']}']")
    report = api(gateway, f"/requests/{ids['request']}")["report"]
    assert int(page.text_content("#sent") or 0) == report["sent_tokens"]
    assert int(page.text_content("#original") or 0) == report["original_tokens"]
    shown = {
        s.get_attribute("data-section"): int(s.get_attribute("data-tokens") or 0)
        for s in page.locator("#bar .seg").all()
    }
    expected = {name: d["tokens"] for name, d in report["sections"].items() if d.get("tokens")}
    assert shown == expected and "window" in shown
    # Below it, the messages sent, each whole: what the upstream received, in its order.
    received = upstream.fake.last_chat().body["messages"]
    listed = page.locator("#sent-messages > li").all()
    assert [li.get_attribute("data-role") for li in listed] == [m["role"] for m in received]
    assert [li.locator(".text").inner_text() for li in listed] == [m["content"] for m in received]
    kinds = [li.get_attribute("data-kind") for li in listed]
    assert kinds.count("context") == (1 if "<gateway_context>" in str(received) else 0)
    page.screenshot(path=str(tmp_path / "request.png"), full_page=True)

    # The overview lists the tenant's requests; the phone width still shows the tables.
    page.set_viewport_size({"width": 390, "height": 800})
    page.click("header nav a >> text=overview")
    assert int(page.text_content("#chat-requests") or 0) >= 3  # the fixture's three requests, at least
    assert float((page.text_content("#overhead") or "").split()[0]) > 0
    assert page.text_content("#failed") == "0"
    assert page.locator(f"a[href='/dashboard/requests/{ids['request']}']").count() == 1
    page.screenshot(path=str(tmp_path / "overview-phone.png"), full_page=True)
    context.close()


def test_a_conversation_shows_its_cache_hits_and_cost_against_full_replay(
    browser: Browser, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """A provider that reports 1,536 of every request's 2,000 input tokens cached, priced as gpt-5."""
    price = {"model": "gpt-5", "input": 1.25, "cached_input": 0.125, "output": 10.0}
    with BackgroundServer(provider_app()) as provider:
        acme = tenant("acme", f"{provider.url}/v1", api_keys=[GATEWAY_KEY], retrieval={"enabled": False})
        gateway = make_gateway([{**acme, "pricing": {"models": [price]}}])
        client = gateway.client()
        history: list[Any] = [{"role": "user", "content": "Where is parcel PX-11?"}]
        first = client.chat.completions.with_raw_response.create(model="gpt-5", messages=history)
        history += [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": "And PX-12?"}]
        second = client.chat.completions.with_raw_response.create(model="gpt-5", messages=history)
        ids = [r.headers["x-gateway-request-id"] for r in (first, second)]
        for request_id in ids:
            recorded(gateway, request_id)
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    sign_in(page, gateway, GATEWAY_KEY)
    page.goto(f"{gateway.server.url}/dashboard/conversations/{second.headers['x-conversation-id']}")
    page.screenshot(path=str(tmp_path / "conversation-cache.png"), full_page=True)

    assert page.text_content("#cache-share") == "77%"  # 3,072 of 4,000 input tokens
    originals = [api(gateway, f"/requests/{i}")["original_tokens"] for i in ids]
    share = originals[0] / originals[1]  # full replay's second request: the first's history cached
    cost = 2 * (464 * 1.25 + 1536 * 0.125 + 50 * 10) / 1e6
    replay = (2000 * 1.25 + 500 + 2000 * (1 - share) * 1.25 + 2000 * share * 0.125 + 500) / 1e6
    assert page.text_content("#cost") == f"${cost:,.4f}"
    assert page.text_content("#replay-cost") == f"${replay:,.4f}"
    assert page.text_content("#cost-ratio") == f"{round(100 * cost / replay)}%"
    shown = page.locator("#requests li .cached").all()
    assert [(s.get_attribute("data-cached"), s.get_attribute("data-input")) for s in shown] == [
        ("1536", "2000"),
        ("1536", "2000"),
    ]
    page.click(f"#requests a[href='/dashboard/requests/{ids[1]}']")
    assert "1536 cached, 0 written, 464 uncached of 2000 input tokens" in (page.text_content("#cache") or "")
    context.close()


def test_another_tenant_sees_nothing_and_forms_need_their_csrf_token(
    browser: Browser, filled: tuple[Gateway, dict[str, str]]
) -> None:
    gateway, ids = filled
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, gateway, OTHER_KEY)
    assert page.text_content("#tenant") == "globex"
    page.goto(f"{gateway.server.url}/dashboard/conversations")
    assert ids["conversation"] not in page.content()
    response = page.goto(f"{gateway.server.url}/dashboard/conversations/{ids['conversation']}")
    assert response is not None and response.status == 404
    response = page.goto(f"{gateway.server.url}/dashboard/requests/{ids['request']}")
    assert response is not None and response.status == 404

    cookies = {c["name"]: c["value"] for c in context.cookies()}
    forged = httpx.post(f"{gateway.server.url}/dashboard/logout", cookies=cookies, data={"csrf": "not-it"})
    assert forged.status_code == 403
    page.goto(f"{gateway.server.url}/dashboard")
    page.click("header form button")  # the page's own form carries the token: signed out
    assert "/dashboard/login" in page.url
    context.close()

    # Scripts use the key as a bearer token; a forged cookie is no session.
    listed = httpx.get(
        f"{gateway.server.url}/dashboard/conversations", headers={"Authorization": f"Bearer {GATEWAY_KEY}"}
    )
    assert listed.status_code == 200 and ids["conversation"] in listed.text
    tampered = httpx.get(
        f"{gateway.server.url}/dashboard/conversations", cookies={"cg_session": "YWNtZQ.9999999999.0000"}
    )
    assert tampered.status_code == 303 and "/dashboard/login" in tampered.headers["location"]


def test_a_users_memories_are_listed_edited_and_deleted(
    browser: Browser, upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    memory = {"enabled": True, "extract_delay_seconds": 0, "profile_delay_seconds": 0}
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], memory=memory)],
        jobs={"poll_seconds": 0.05, "retry_base_seconds": 0.05},
    )
    client = gateway.client(default_headers={"X-User-Id": "ana"})
    for text in ("I am vegetarian.", "Our billing service runs on Postgres 16."):
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": text}]
        )
        recorded(gateway, raw.headers["x-gateway-request-id"])
    wait_for_jobs(gateway)
    stored = api(gateway, "/users/ana/memories")["data"]
    assert len(stored) == 2

    context = browser.new_context()
    page = context.new_page()
    sign_in(page, gateway, GATEWAY_KEY)
    page.click("header nav a >> text=memories")
    page.fill("form.filters input[name=user]", "ana")
    page.click("form.filters button")
    assert page.locator("#memories tbody tr").count() == 2
    postgres = next(m for m in stored if "Postgres" in m["content"])
    row = page.locator(f"#memory-{postgres['id']}")
    row.locator("input[name=content]").fill("Our billing service runs on Postgres 17.")
    row.locator("form.edit button").click()
    assert page.text_content("#notice") == "Memory edited."
    assert (
        api(gateway, f"/memories/{postgres['id']}")["content"] == "Our billing service runs on Postgres 17."
    )
    page.screenshot(path=str(tmp_path / "memories.png"), full_page=True)

    # A request that used them lists each injected memory with why it was chosen.
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Which Postgres version runs our billing?"}]
    )
    recorded(gateway, raw.headers["x-gateway-request-id"])
    page.goto(f"{gateway.server.url}/dashboard/requests/{raw.headers['x-gateway-request-id']}")
    injected = page.locator("#injected-memories tbody tr").all_text_contents()
    assert any("Postgres 17" in row for row in injected), injected
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    sections = report["sections"]
    shown = [
        i for name in ("memory", "memory_relevant") for i in sections.get(name, {}).get("memory_ids", [])
    ]
    assert len(injected) == len(shown)

    # Export from the page: the memory API's document, as a download.
    page.goto(f"{gateway.server.url}/dashboard/users/ana/memories")
    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(Path(download.value.path()).read_text())
    assert exported["object"] == "memories.export" and exported["user_id"] == "ana"
    assert sorted(m["content"] for m in exported["memories"]) == sorted(
        m["content"] for m in api(gateway, "/users/ana/memories")["data"]
    )

    vegetarian = next(m for m in stored if "vegetarian" in m["content"])
    page.locator(f"#memory-{vegetarian['id']}").locator("form.delete button").click()
    assert page.text_content("#notice") == "Memory deleted."
    assert [m["id"] for m in api(gateway, "/users/ana/memories")["data"]] == [postgres["id"]]

    cookies = {c["name"]: c["value"] for c in context.cookies()}
    forged = httpx.post(
        f"{gateway.server.url}/dashboard/memories/{postgres['id']}/delete", cookies=cookies, data={}
    )
    assert forged.status_code == 403
    assert [m["id"] for m in api(gateway, "/users/ana/memories")["data"]] == [postgres["id"]]  # still there
    context.close()


def test_a_failed_job_is_shown_retried_and_its_summary_read(
    browser: Browser, upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": 1200, "recent_tokens": 300},
                compaction={"threshold_tokens": 200, "chunk_tokens": 300, "summary_tokens": 400},
                retrieval={"enabled": False},
            )
        ],
        jobs={"poll_seconds": 0.05, "retry_base_seconds": 0.05, "max_attempts": 1},
    )
    upstream.fake.enqueue_summary(
        Reply(status=500, error={"message": "summariser down", "type": "server_error"})
    )
    client = gateway.client()
    history: list[Any] = []
    for n in range(30):
        history.append(
            {"role": "user", "content": f"turn-{n} please keep the file notes_{n}.md and code {n * 7919}."}
        )
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        recorded(gateway, raw.headers["x-gateway-request-id"])
        wait_for_jobs(gateway)
    conversation_id = raw.headers["x-conversation-id"]

    context = browser.new_context()
    page = context.new_page()
    sign_in(page, gateway, GATEWAY_KEY)
    page.click("header nav a >> text=jobs")
    failed = page.locator("#failures tbody tr[id^=job-]")
    assert failed.count() >= 1 and "summariser down" in (failed.first.text_content() or "")
    failed.first.locator("button").click()
    assert page.text_content("#notice") == "The job is queued again."
    wait_for_jobs(gateway)
    page.goto(f"{gateway.server.url}/dashboard/conversations/{conversation_id}/summaries")
    assert page.locator("article.summary").count() >= 1 and "current" in (
        page.text_content("article.summary") or ""
    )
    assert "folded:" in (page.text_content("article.summary pre") or "")
    context.close()


def test_the_admin_key_sees_every_tenant_one_at_a_time_and_finds_conversations(
    browser: Browser, upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    gateway = make_gateway(
        [
            tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY]),
            tenant("globex", upstream.base_url, api_keys=[OTHER_KEY]),
        ],
        server={"admin_key": ADMIN_KEY},
    )
    ids: dict[str, str] = {}
    for key, name, text in [
        (GATEWAY_KEY, "acme-a", "Acme's parcel PX-11 goes to Lisbon."),
        (GATEWAY_KEY, "acme-b", "Acme's invoices are due on Friday."),
        (OTHER_KEY, "globex", "Globex ships the turbine on Monday."),
    ]:
        upstream.fake.enqueue(Reply("Noted."))
        raw = gateway.client(api_key=key).chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": text}]
        )
        recorded(gateway, raw.headers["x-gateway-request-id"], key=key)
        ids[name] = raw.headers["x-conversation-id"]
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, gateway, ADMIN_KEY)
    assert page.input_value("#switch select") == "acme"  # the first tenant until it switches
    page.goto(f"{gateway.server.url}/dashboard/conversations")
    listed = page.locator("#conversations").text_content() or ""
    assert ids["acme-a"] in listed and ids["acme-b"] in listed and ids["globex"] not in listed

    # Search: the text of a message, in the browser's own form.
    page.fill("#filters input[name=q]", "px-11")
    page.click("#filters button")
    listed = page.locator("#conversations").text_content() or ""
    assert ids["acme-a"] in listed and ids["acme-b"] not in listed
    page.fill("#filters input[name=q]", "")
    page.fill("#filters input[name=since]", "2999-01-01")
    page.click("#filters button")
    assert "No conversations." in (page.locator("#conversations").text_content() or "")

    page.select_option("#switch select", "globex")  # the header's switcher
    page.click("#switch button")
    assert page.input_value("#switch select") == "globex"
    page.goto(f"{gateway.server.url}/dashboard/conversations")
    listed = page.locator("#conversations").text_content() or ""
    assert ids["globex"] in listed and ids["acme-a"] not in listed
    page.screenshot(path=str(tmp_path / "admin.png"), full_page=True)
    cookies = {c["name"]: c["value"] for c in context.cookies()}
    forged = httpx.post(f"{gateway.server.url}/dashboard/tenant", cookies=cookies, data={"tenant": "acme"})
    assert forged.status_code == 403  # no CSRF token: nothing switched
    context.close()

    # Scripts: the admin key as a bearer token names the tenant; a tenant's key cannot switch.
    url = f"{gateway.server.url}/dashboard/conversations"
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    as_globex = httpx.get(url, params={"tenant": "globex"}, headers=admin)
    assert as_globex.status_code == 200 and ids["globex"] in as_globex.text
    assert ids["acme-a"] not in as_globex.text
    ignored = httpx.get(url, params={"tenant": "globex"}, headers={"Authorization": f"Bearer {GATEWAY_KEY}"})
    assert ids["acme-a"] in ignored.text and ids["globex"] not in ignored.text
    refused = httpx.post(
        f"{gateway.server.url}/dashboard/tenant",
        data={"tenant": "globex"},
        headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
    )
    assert refused.status_code == 403
    bad_date = httpx.get(url, params={"until": "tomorrow"}, headers=admin)
    assert bad_date.status_code == 400 and "&#39;until&#39; must be a date" in bad_date.text
    # The admin key is no gateway key: it sends no chat requests.
    with pytest.raises(openai.AuthenticationError):
        gateway.client(api_key=ADMIN_KEY).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
