"""Work-chat sets made another way than `workchat.py` (issue 28): harder, less regular, so that a score on
them says something about the hidden work chats (about 400 turns and 20k tokens each, incidents,
migrations, deploys, exact identifiers, decisions revised later, one English and one Chinese set).

    python benchmarks/workchat_styles.py --style ops --lang en --seed 101 --out benchmarks/data/styles-ops-en.json
    python benchmarks/workchat_styles.py --style design --lang zh --seed 201 --out benchmarks/data/styles-design-zh.json
    python benchmarks/workchat_styles.py --style design --lang en --seed 301 --out benchmarks/data/styles-design-en.json
    python benchmarks/workchat_styles.py --style ops --lang zh --seed 401 --out benchmarks/data/styles-ops-zh.json
    # locked sets: other seeds, the other style/language combinations; score them, do not read them
    python benchmarks/workchat_styles.py --style design --lang en --seed 9001 --out benchmarks/data/locked-design-en.json
    python benchmarks/workchat_styles.py --style ops --lang zh --seed 9002 --out benchmarks/data/locked-ops-zh.json

Two styles, each in English or Chinese prose with English identifiers (templates in
`workchat_templates_en.py` and `workchat_templates_zh.py`):

- ops: on-call shifts. Short time-stamped user messages ("06:09 restarted ...", log lines with years),
  config pastes in YAML, the assistant's answers with log excerpts, runbooks in bash blocks and
  placement tables; the facts are worker settings, memory limits, queue lags, hosts and ports,
  namespaces; the events are failovers, rollbacks, DLQ replays, certificate renewals, node drains.
- design: design-review sessions opened by an agenda. The assistant's answers hold DDL, HTTP and
  Python snippets, rate-limit tables and decision logs; the facts are column types, index names,
  migrations, library pins, page sizes; the events are migrations run, flags flipped, upgrades merged,
  endpoints going GA.

Both plant five kinds of question (named in each sample's `category_names`, which `locomo.py` reads),
whose evidence is the turn(s) holding the answer, often the assistant's code block or table:

- single-hop: one turn states it (a config paste, a table row, a log line, a DDL statement).
- multi-hop: two links in different sessions; the question names only the first link.
- open-domain: the concerns raised about a proposal, in the assistant's answer and in a later turn
  that refers back loosely ("the spot idea"); recall is the share of those turns found.
- revised: a decision made (A), changed (B), then changed again (C) sessions later, C often said
  loosely ("about that flaky deploy from before: final call is ..."); the evidence is C, A and B are traps.
- temporal: when something happened (the session's date answers); other sessions mention the same
  thing planned or postponed, with times and years in the text.

The filler uses the same names with near-miss values (staging settings, other services' numbers,
loose references to earlier threads, "session", "warm-up"), so keyword overlap does not find everything.
Deterministic for a seed: each conversation uses seed, seed + 1, ...
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

CATEGORY_NAMES = {1: "single-hop", 2: "multi-hop", 3: "open-domain", 4: "revised", 5: "temporal"}
SINGLE, MULTI, OPEN, REVISED, TEMPORAL = 1, 2, 3, 4, 5

SERVICES = [
    "tally-api", "courier", "ingest-gw", "shipment-svc", "quota-keeper", "fx-rates", "kyc-checker",
    "ledgerd", "doc-render", "webhook-relay", "catalog-sync", "tenant-admin", "otp-sender", "price-cache",
    "recon-batch", "search-edge",
]  # fmt: skip
QUEUES = ["orders.v2", "email-outbound", "recon-events", "kyc.requests", "webhooks.retry", "fx.ticks",
          "catalog.delta", "payouts.v3", "audit.stream", "doc.jobs"]  # fmt: skip
HOSTS = ["ip-10-4-7-21", "bastion-2", "c5-node-a3", "c5-node-b1", "batch-07", "m6-node-c4", "edge-2b",
         "ip-10-4-9-3", "gpu-r2", "cron-box-1"]  # fmt: skip
REGIONS = ["eu-central-1", "us-east-1", "eu-west-2", "ap-southeast-1", "us-west-2"]
JOBS = ["nightly-recon", "invoice-close", "search-reindex", "gdpr-sweep", "usage-rollup", "fx-backfill"]
PEOPLE = ["Dana", "Ravi", "Ines", "Wang Fang", "Kofi", "Mei", "Jonas", "Sara", "Bogdan", "Yuki"]
DATABASES = ["pg-main", "pg-ledger-2", "pg-reporting", "pg-tenants", "pg-events", "pg-archive"]
TABLES = ["invoices", "payouts", "tenants", "ledger_entries", "shipments", "api_keys", "webhook_deliveries",
          "refunds", "price_rules", "usage_events", "documents", "kyc_cases"]  # fmt: skip
COLUMNS = ["amount_minor", "external_ref", "status", "currency", "settled_at", "region_code", "attempts",
           "payload", "risk_score", "checksum"]  # fmt: skip
ENDPOINTS = ["/v1/invoices", "/v1/payouts", "/v1/tenants/:id", "/v1/refunds", "/v1/shipments",
             "/v1/usage", "/v1/documents/:id", "/v1/webhooks", "/v1/prices", "/v1/kyc/cases"]  # fmt: skip
FLAGS = ["ff_async_export", "ff_tax_preview", "ff_invoice_merge", "ff_new_switcher", "ff_usage_alerts",
         "ff_refund_wizard", "ff_cursor_paging"]  # fmt: skip
LIBS = ["sqlalchemy", "pydantic", "grpcio", "protobuf", "httpx", "celery", "alembic", "boto3"]
REPOS = ["git/billing-edge", "git/core-api", "git/ops-tools", "git/ledger", "git/docs-service", "git/kyc"]
NAMESPACES = ["payments", "core", "ingest", "platform", "billing", "edge"]
COLTYPES = ["numeric(12,2)", "bigint", "text", "jsonb", "varchar(64)", "timestamptz", "smallint", "char(3)"]


@dataclass
class Turn:
    speaker: str  # "a" (the developer) or "b" (the assistant)
    text: str
    tag: str | None = None  # the fact this turn plants, for the questions' evidence


class Builder:
    """One conversation: the world, the planted blocks and their questions, then the layout."""

    def __init__(self, style: str, lang: str, seed: int, sessions: int) -> None:
        self.r = random.Random(seed)
        self.style, self.lang, self.seed, self.sessions = style, lang, seed, sessions
        module = importlib.import_module(f"workchat_templates_{lang}")  # beside this file
        self.t: dict[str, list[str]] = getattr(module, style.upper())
        self.topics = getattr(module, f"{style.upper()}_TOPICS")
        self.proposals = getattr(module, f"{style.upper()}_PROPOSALS")
        self.features: list[str] = module.FEATURES
        r = self.r
        self.year = r.choice([2024, 2025])
        self.svcs = r.sample(SERVICES, 12)
        self.queues, self.hosts = r.sample(QUEUES, 8), r.sample(HOSTS, 8)
        self.people, self.tables = r.sample(PEOPLE, 6), r.sample(TABLES, 10)
        self.endpoints, self.flags = r.sample(ENDPOINTS, 9), r.sample(FLAGS, 6)
        self.plans: list[tuple[int, list[Turn]]] = []
        self.questions: list[tuple[str, list[str], int]] = []
        self.echoes: list[tuple[int, str]] = []  # (session, user text)
        self.count = 0
        self.late = sessions - 1  # the last session is filler only (the recent window)

    # -- text ---------------------------------------------------------------------------------------
    def defaults(self) -> dict[str, str]:
        r, y = self.r, self.year

        def ts() -> str:
            return f"{y}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z"

        table, col = r.choice(self.tables), r.choice(COLUMNS)
        return {
            "svc": r.choice(self.svcs), "other": r.choice(self.svcs), "queue": r.choice(self.queues),
            "host": r.choice(self.hosts), "region": r.choice(REGIONS), "person": r.choice(self.people),
            "ticket": f"INC-{r.randint(1000, 9999)}", "version": self.version(), "ts": ts(), "ts2": ts(),
            "hm": f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}", "n": str(r.choice([12, 45, 90, 180, 340, 1200])),
            "pct": str(r.randint(71, 96)), "ns": r.choice(NAMESPACES), "mem": self.mem(), "rss": self.mem(),
            "c": self.pick_c(), "c2": self.pick_c(), "b": self.pick_b(), "b2": self.pick_b(), "vt": self.pick_vt(),
            "lag": str(r.randint(80, 700) * 100), "ms": str(r.choice([250, 400, 600, 800, 1200, 1500])),
            "port": str(r.choice([8080, 8443, 9090, 7070, 9443, 8181, 6060, 5005])), "pod": self.pod(),
            "p": str(r.randint(0, 23)), "year": str(y), "days": str(r.randint(2, 20)), "rep": str(r.randint(2, 8)),
            "db": r.choice(DATABASES), "table": table, "col": col, "idx": self.idx(table, col),
            "idx2": self.idx(table, r.choice(COLUMNS)), "endpoint": r.choice(self.endpoints),
            "method": r.choice(["GET", "POST", "PATCH", "DELETE"]), "flag": r.choice(self.flags),
            "lib": r.choice(LIBS), "libver": self.libver(), "libver2": self.libver(), "repo": r.choice(REPOS),
            "mig": self.mig(table, col), "pr": str(r.randint(1200, 4999)), "ps": str(r.choice([20, 25, 50, 100])),
            "pmax": str(r.choice([100, 200, 500, 1000])), "pgver": r.choice(["13.14", "14.11", "15.6", "16.2"]),
            "feature": r.choice(self.features), "job": r.choice(JOBS), "parts": str(r.choice([6, 8, 12, 16, 24, 32])),
            "limit": str(r.choice([60, 120, 300, 600, 1200])), "coltype": r.choice(COLTYPES),
            "idtype": r.choice(["bigint", "uuid", "bigserial"]),
        }  # fmt: skip

    def version(self) -> str:
        return f"{self.r.randint(1, 5)}.{self.r.randint(0, 19)}.{self.r.randint(0, 9)}"

    def mem(self) -> str:
        return self.r.choice(["512Mi", "768Mi", "1Gi", "1536Mi", "2Gi", "3Gi"])

    def pick_c(self) -> str:
        return str(self.r.choice([4, 6, 8, 12, 16, 24, 32]))

    def pick_b(self) -> str:
        return str(self.r.choice([25, 50, 100, 200, 250, 500]))

    def pick_vt(self) -> str:
        return str(self.r.choice([30, 45, 60, 90, 120, 300]))

    def pod(self) -> str:
        return "".join(self.r.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))

    def idx(self, table: str, col: str) -> str:
        return self.r.choice([f"ix_{table}_{col}", f"{table}_{col}_idx", f"{table}_tenant_{col}_idx"])

    def libver(self) -> str:
        return f"{self.r.randint(0, 5)}.{self.r.randint(0, 30)}.{self.r.randint(0, 12)}"

    def mig(self, table: str, col: str) -> str:
        verb = self.r.choice(["add", "backfill", "index"])
        return f"{self.r.randint(12, 140):04d}_{verb}_{table}_{col}"

    def fill(self, template: str, **values: str) -> str:
        return template.format(**{**self.defaults(), **values})

    def say(self, key: str, **values: str) -> str:
        if key == "filler_assistant" and self.r.random() < 0.5:  # a long answer: two points
            first, second = self.r.sample(self.t[key], 2)
            return self.fill(first, **values) + "\n\n" + self.fill(second, **values)
        return self.fill(self.r.choice(self.t[key]), **values)

    # -- planting -----------------------------------------------------------------------------------
    def tag(self) -> str:
        self.count += 1
        return f"fact{self.count}"

    def session(self, low: int = 0, high: int | None = None) -> int:
        return self.r.randrange(low, self.late if high is None else high)

    def plant(self, session: int, turns: list[Turn]) -> None:
        self.plans.append((session, turns))

    def ask(self, key: str, tags: list[str], category: int, **values: str) -> None:
        self.questions.append((self.say(key, **values), tags, category))
        # The same question asked in passing elsewhere, unanswered there (a decoy sharing its words).
        for _ in range(self.r.choice([1, 1, 2])):
            self.echoes.append((self.session(0, self.late + 1), self.say("echo", q=self.say(key, **values))))

    def reply(self) -> Turn:
        """The assistant's answer to a stated fact: a short acknowledgement, sometimes a long aside."""
        text = self.say("ack")
        if self.r.random() < 0.65:
            text += "\n\n" + self.say("filler_assistant")
        return Turn("b", text)

    def stated(
        self, key: str, speaker: str, values: dict[str, str], asks: list[str], session: int = -1
    ) -> None:
        """A single-hop fact: the user states it (the assistant acknowledges), or the assistant answers
        a question with it; one question per `asks` key, each with this turn as evidence."""
        k = self.tag()
        where = self.session() if session < 0 else session
        if speaker == "a":
            self.plant(where, [Turn("a", self.say(key, **values), k), self.reply()])
        else:
            self.plant(
                where, [Turn("a", self.say(f"{key}_q", **values)), Turn("b", self.say(key, **values), k)]
            )
        for ask in asks:
            self.ask(ask, [k], SINGLE, **values)

    def temporal(self, kind: str, values: dict[str, str], ask: str = "") -> None:
        k = self.tag()
        self.plant(self.session(), [Turn("a", self.say(f"ev_{kind}", **values), k), self.reply()])
        for _ in range(self.r.choice([1, 2, 2])):  # the same thing planned, postponed, talked about
            self.echoes.append((self.session(), self.say(f"plan_{kind}", **values)))
        self.ask(ask or f"ask_{kind}", [k], TEMPORAL, **values)

    def revised(self, topic: dict[str, Any], values: dict[str, str], loose_ok: bool) -> None:
        """A decision made, changed, changed again; the question asks the current one (the third)."""
        a, b, c = self.r.sample(topic["options"], 3)
        first = self.session(0, self.late - 4)
        second = self.session(first + 1, self.late - 2)
        third = self.session(second + 1)
        base = {"topic": topic["topic"], **values}
        loose = self.r.choice(topic["loose"])
        if not loose_ok:  # the topic's second subject: its closing turn names it
            loose = self.fill(self.t["loose_svc"][0], loose=loose, **values)
        self.plant(
            first, [Turn("a", self.say("rev_a", opt=a, **base)), Turn("b", self.say("rev_a_reply", **base))]
        )
        self.plant(second, [Turn("a", self.say("rev_b", opt=b, **base)), self.reply()])
        k = self.tag()
        if self.r.random() < 0.5:
            self.plant(third, [Turn("a", self.say("rev_c", opt=c, loose=loose, **base), k), self.reply()])
        else:
            self.plant(third, [Turn("a", self.say("rev_c_q", loose=loose, **base)),
                               Turn("b", self.say("rev_c_assistant", opt=c, loose=loose, **base), k)])  # fmt: skip
        self.ask("ask_rev", [k], REVISED, **base)

    def chain(self, kind: str, first: dict[str, str], second: dict[str, str], ask: dict[str, str]) -> None:
        one, two = sorted(self.r.sample(range(self.late), 2))
        k1, k2 = self.tag(), self.tag()
        self.plant(one, [Turn("a", self.say(f"mh_{kind}_1", **first), k1), self.reply()])
        if self.r.random() < 0.3:  # the second link in the assistant's answer
            self.plant(
                two, [Turn("a", self.say("filler_user")), Turn("b", self.say(f"mh_{kind}_2", **second), k2)]
            )
        else:
            self.plant(two, [Turn("a", self.say(f"mh_{kind}_2", **second), k2), self.reply()])
        self.ask(f"ask_mh_{kind}", [k1, k2], MULTI, **ask)

    def concerns(
        self, proposal: dict[str, Any], svc: str, table: str, endpoint: str, first_use: bool
    ) -> None:
        c1, c2, c3 = self.r.sample(proposal["concerns"], 3)
        said = proposal["proposal"].format(svc=svc, table=table, endpoint=endpoint)
        loose = self.r.choice(proposal["loose"])
        if not first_use:  # the same proposal for another subject: the later turn names it
            subject = (
                svc
                if "{svc}" in proposal["proposal"]
                else table
                if "{table}" in proposal["proposal"]
                else endpoint
            )
            loose = self.fill(self.t["loose_svc"][0], loose=loose, subject=subject)
        start = self.session(0, self.late - 2)
        k1, k2 = self.tag(), self.tag()
        self.plant(start, [Turn("a", self.say("od_start", proposal=said)),
                           Turn("b", self.say("od_assist", c1=c1, c2=c2), k1)])  # fmt: skip
        self.plant(
            self.session(start + 1), [Turn("a", self.say("od_more", loose=loose, c3=c3), k2), self.reply()]
        )
        self.ask("ask_od", [k1, k2], OPEN, proposal=said)

    # -- the two styles -----------------------------------------------------------------------------
    def plan_ops(self) -> None:
        r, svcs = self.r, self.svcs
        for svc in r.sample(svcs, 4):
            self.stated("config", "a", {"svc": svc}, r.sample(["ask_c", "ask_b", "ask_vt"], r.choice([2, 3])))
        for svc in r.sample(svcs, 5):
            self.stated("oom", "b", {"svc": svc}, ["ask_mem"])
        for queue in r.sample(self.queues, 6):
            self.stated("lag", "a", {"queue": queue}, ["ask_lag"])
        placed = r.sample(svcs, 9)
        for i in range(3):
            k = self.tag()
            rows = [(svc, r.choice(self.hosts), self.defaults()["port"]) for svc in placed[3 * i : 3 * i + 3]]
            table = "\n".join(self.fill(self.t["row"][0], svc=s, host=h, port=p) for s, h, p in rows)
            self.plant(
                self.session(),
                [Turn("a", self.say("placement_q")), Turn("b", self.say("placement", rows=table), k)],
            )
            for s, h, p in rows:
                for ask in r.sample(["ask_host", "ask_port"], r.choice([1, 2])):
                    self.ask(ask, [k], SINGLE, svc=s, host=h, port=p)
        for svc in r.sample(svcs, 8):
            self.stated("page", "a", {"svc": svc}, ["ask_page"])
        for svc in r.sample(svcs, 5):
            self.stated("runbook", "b", {"svc": svc}, ["ask_ns"])
        events = iter(r.sample(svcs, 12))
        for _ in range(4):
            self.temporal("failover", {"svc": next(events), "region": r.choice(REGIONS)})
            self.temporal("rollback", {"svc": next(events), "version": self.version()})
        for svc in [next(events) for _ in range(4)]:
            self.temporal("cert", {"svc": svc})
        for queue in r.sample(self.queues, 3):
            self.temporal("replay", {"queue": queue})
        for host in r.sample(self.hosts, 3):
            self.temporal("drain", {"host": host})
        self.revisions(iter(r.sample(svcs, 12)))
        queues, hosts, chained = (
            iter(r.sample(self.queues, 3)),
            iter(r.sample(self.hosts, 3)),
            iter(r.sample(svcs, 9)),
        )
        dbs, jobs = iter(r.sample(DATABASES, 3)), iter(r.sample(JOBS, 3))
        for _ in range(3):
            q, svc = next(queues), next(chained)
            self.chain("queue", {"svc": svc, "queue": q}, {"queue": q}, {"svc": svc})
            host, job = next(hosts), next(jobs)
            self.chain("host", {"job": job, "host": host}, {"host": host}, {"job": job})
            svc, ticket = next(chained), f"INC-{r.randint(1000, 9999)}"
            self.chain("ticket", {"svc": svc, "ticket": ticket}, {"svc": svc}, {"ticket": ticket})
            svc, db = next(chained), next(dbs)
            self.chain("db", {"svc": svc, "db": db}, {"db": db}, {"svc": svc})
        self.discussions()

    def plan_design(self) -> None:
        r = self.r
        for table in r.sample(self.tables, 6):
            col = r.choice(COLUMNS)
            values = {"table": table, "col": col, "idx": self.idx(table, col)}
            self.stated("ddl", "b", values, r.sample(["ask_coltype", "ask_idx"], r.choice([1, 2, 2])))
        endpoints = r.sample(self.endpoints, 9)
        for i in range(3):
            k = self.tag()
            rows = [
                (e, r.choice(["GET", "POST", "PATCH"]), self.defaults()["limit"])
                for e in endpoints[3 * i : 3 * i + 3]
            ]
            table = "\n".join(self.fill(self.t["row"][0], endpoint=e, method=m, limit=x) for e, m, x in rows)
            self.plant(
                self.session(), [Turn("a", self.say("api_q")), Turn("b", self.say("api", rows=table), k)]
            )
            for e, m, x in rows:
                self.ask("ask_limit", [k], SINGLE, endpoint=e, method=m, limit=x)
        pins = r.sample([(s, lib) for s in self.svcs for lib in LIBS], 10)
        for svc, lib in pins:
            self.stated("pin", "a", {"svc": svc, "lib": lib}, ["ask_pin"])
        for table in r.sample(self.tables, 6):
            col = r.choice(COLUMNS)
            self.stated("mig", "a", {"table": table, "col": col, "mig": self.mig(table, col)}, ["ask_mig"])
        for endpoint in r.sample(self.endpoints, 5):
            self.stated("paging", r.choice("ab"), {"endpoint": endpoint}, ["ask_ps", "ask_pmax"])
        for table in r.sample(self.tables, 5):
            self.temporal("mig", {"mig": self.mig(table, r.choice(COLUMNS))}, "ask_mig_ev")
        for flag in r.sample(self.flags, 5):
            self.temporal("flag", {"flag": flag})
        for svc, lib in r.sample(
            [p for p in ((s, lib) for s in self.svcs for lib in LIBS) if p not in pins], 4
        ):
            self.temporal("upgrade", {"svc": svc, "lib": lib})
        for endpoint in r.sample(self.endpoints, 4):
            self.temporal("ga", {"endpoint": endpoint})
        subjects = {"endpoint": iter(r.sample(self.endpoints, 4)), "table": iter(r.sample(self.tables, 6)),
                    "svc": iter(r.sample(self.svcs, 4))}  # fmt: skip
        self.revisions(subjects, design=True)
        eps, svcs, tables = (
            iter(r.sample(self.endpoints, 5)),
            iter(r.sample(self.svcs, 5)),
            iter(r.sample(self.tables, 5)),
        )
        flags, features = iter(r.sample(self.flags, 5)), iter(r.sample(self.features, 5))
        for db in r.sample(DATABASES, 5):
            e, s = next(eps), next(svcs)
            self.chain("repo", {"endpoint": e, "svc": s}, {"svc": s}, {"endpoint": e})
            t = next(tables)
            self.chain("db", {"table": t, "db": db}, {"db": db}, {"table": t})
            f, feature = next(flags), next(features)
            self.chain("flag", {"flag": f, "feature": feature}, {"feature": feature}, {"flag": f})
        self.discussions()

    def revisions(self, subjects: Any, design: bool = False) -> None:
        """Each topic twice: the first time closed with a loose reference, the second naming its subject."""
        for round_ in range(2):
            for topic in self.topics:
                if design:
                    kind = topic["subject"]
                    subject = next(subjects[kind])
                    values = {"subject": subject, kind: subject}
                else:
                    svc = next(subjects)
                    values = {"svc": svc, "subject": svc}
                self.revised(topic, values, loose_ok=round_ == 0)

    def discussions(self) -> None:
        r = self.r
        for proposal in self.proposals:
            for use in range(3):
                svc, table, endpoint = r.choice(self.svcs), r.choice(self.tables), r.choice(self.endpoints)
                self.concerns(proposal, svc, table, endpoint, use == 0)

    # -- layout -------------------------------------------------------------------------------------
    def exchange(self) -> list[Turn]:
        user = self.say("filler_user")
        if self.r.random() < 0.5:
            user = (
                f"{user} {self.say('filler_user')}" if self.lang == "en" else user + self.say("filler_user")
            )
        return [
            Turn("a", user),
            Turn("b", self.say("filler_assistant") if self.r.random() < 0.9 else self.say("ack")),
        ]

    def build(self, turns_per_session: int) -> dict[str, Any]:
        getattr(self, f"plan_{self.style}")()
        r = self.r
        by_session: dict[int, list[list[Turn]]] = {}
        for session, turns in self.plans:
            by_session.setdefault(session, []).append(turns)
        day = datetime(self.year, r.randint(1, 6), r.randint(1, 28), 9, r.choice([0, 10, 30, 45]))
        speaker_a = {"en": "Sam", "zh": "张磊"}[self.lang]
        conversation: dict[str, Any] = {"speaker_a": speaker_a, "speaker_b": "Assistant"}
        dia_of: dict[str, str] = {}
        for number in range(1, self.sessions + 1):
            blocks = by_session.get(number - 1, [])
            filler = max((turns_per_session - sum(len(b) for b in blocks)) // 2, 1)
            exchanges = [self.exchange() for _ in range(filler)]
            # Asides (decoys) ride on user turns that plant nothing, added exchanges when there are few.
            echoes = [text for at, text in self.echoes if at == number - 1]
            hosts = [t for b in [*exchanges, *blocks] for t in b if t.speaker == "a" and t.tag is None] * 2
            while len(hosts) < len(echoes):
                exchanges.append(self.exchange())
                hosts += [exchanges[-1][0]] * 2
            for host, text in zip(r.sample(hosts, len(echoes)), echoes, strict=True):
                host.text += (" " if self.lang == "en" else "") + text
            for block in blocks:
                exchanges.insert(r.randrange(len(exchanges) + 1), block)
            exchanges.insert(0, [Turn("a", self.say("open")), Turn("b", self.say("filler_assistant"))])
            if number == self.sessions or r.random() < 0.4:
                exchanges.append([Turn("a", self.say("close")), Turn("b", self.say("ack"))])
            key = f"session_{number}"
            stamp = f"{day:%-I:%M %p} on {day.day} {day:%B}, {day.year}"
            conversation[f"{key}_date_time"] = stamp.replace("AM", "am").replace("PM", "pm")
            conversation[key] = []
            for offset, turn in enumerate((t for block in exchanges for t in block), start=1):
                dia = f"D{number}:{offset}"
                speaker = speaker_a if turn.speaker == "a" else "Assistant"
                conversation[key].append({"speaker": speaker, "dia_id": dia, "text": turn.text})
                if turn.tag:
                    dia_of[turn.tag] = dia
            day += timedelta(days=r.choice([1, 1, 2, 3, 4, 7]), hours=r.choice([-2, 0, 1, 3, 6]))
        qa = [
            {"question": q, "answer": "", "evidence": [dia_of[k] for k in keys], "category": category}
            for q, keys, category in self.questions
        ]
        return {"sample_id": f"styles-{self.style}-{self.lang}-{self.seed}", "conversation": conversation,
                "qa": qa, "category_names": {str(k): v for k, v in CATEGORY_NAMES.items()}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--style", choices=["ops", "design"], default="ops")
    parser.add_argument("--lang", choices=["en", "zh"], default="en")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=14, help="about this many turns per session")
    parser.add_argument("--seed", type=int, default=101)
    args = parser.parse_args()
    samples = [
        Builder(args.style, args.lang, args.seed + i, args.sessions).build(args.turns)
        for i in range(args.conversations)
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(samples, ensure_ascii=False, indent=1))
    from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer  # o200k_base, offline

    count = TiktokenTokenizer.for_model("gpt-4o").count
    for sample in samples:
        turns = [t for k, v in sample["conversation"].items() if isinstance(v, list) for t in v]
        tokens = sum(count(f"{t['speaker']}: {t['text']}") for t in turns)
        print(f"{sample['sample_id']}: {len(turns)} turns, {tokens} tokens, {len(sample['qa'])} questions")


if __name__ == "__main__":
    main()
