"""Blind work-chat set for benchmarks/locomo.py: an evaluation set the retrieval code was never tuned on.

Written without reading the gateway or the other work-chat generators, with its own domain, vocabulary
and phrasing (templates in workchat_blind_text.py). Each conversation is a developer talking with an AI
assistant at a greenhouse-IoT company (Rust sensor ingest, Go billing, a TypeScript console and mobile
backend, a Python data pipeline and forecasting; four of the six projects per conversation): 26-36
dated sessions over three to five months, about 215 exchanges (430-445 turns) and 19-20k tokens.
Assistant answers carry diffs, SQL, Go/TypeScript/Rust/Python snippets, stack traces, shell transcripts,
query plans and markdown tables; user turns are terse, pasted output, English typos, loose references
back ("that cron thing").
Identifiers (tickets, shas, ports, hosts, env vars, versions, flags, tables) recur with near-miss values
in filler that shares the facts' vocabulary.

About 100 questions per conversation, five categories (`category_names` in the file), each with the
dia_ids of the turns that hold its answer:
  1 single-hop: one turn states it, often inside a code block, a table or a paste;
  2 multi-hop: two turns in different sessions, the question names only the first link
    ("the port of the service that replaced X");
  3 open-domain: several turns together, in other words than the question's;
  4 revised: a decision made, changed, changed again sessions apart; evidence is the last one only;
  5 temporal: when something was actually done; other sessions plan it or postpone it.
English, or Chinese prose with English identifiers (`--lang zh`). Conversation i uses seed + i (mixed with
the language, so an English and a Chinese set are never translations of each other). The generator checks
that every answer is written in its evidence turns (a temporal answer is its evidence session's date).

    python benchmarks/workchat_blind.py --lang en --seed 501 --out benchmarks/data/blind-en.json
    python benchmarks/workchat_blind.py --lang zh --seed 502 --out benchmarks/data/blind-zh.json
    python benchmarks/locomo.py --baselines-only --data benchmarks/data/blind-en.json,benchmarks/data/blind-zh.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import workchat_blind_text as T

CATEGORY_NAMES = {"1": "single-hop", "2": "multi-hop", "3": "open-domain", "4": "revised", "5": "temporal"}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]  # fmt: skip
MULTI_KINDS = {
    "svc": [
        "port",
        "env",
        "version",
        "cron",
        "memlimit",
        "topic",
        "bucket",
        "owner",
        "timeout",
        "alert",
        "batch",
    ],
    "host": ["itype", "ip"],
}
ORGS = ["verdantix", "growgrid", "leafline", "agrosense", "tendril"]
_CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


def tokens(text: str) -> int:
    """Rough tokens: a CJK character is one, other text four characters a token."""
    cjk = len(_CJK.findall(text))
    return cjk + (len(text) - cjk) // 4


@dataclass
class Ex:
    """One exchange: a user turn and the assistant's answer."""

    user: str
    assistant: str
    ids: tuple[str, str] = ("", "")
    session: int = -1
    s: str = ""  # the service it is about, for the paragraph `build` may append

    def text(self, side: str) -> str:
        return self.user if side == "u" else self.assistant


@dataclass
class Item:
    """Exchanges placed in distinct sessions (in order when `ordered`), and the questions they answer."""

    exs: list[Ex]
    ordered: bool = False
    spread: int = 1
    qa: list[dict[str, Any]] = field(default_factory=list)


class Conversation:
    def __init__(self, seed: int, lang: str, sample_id: str) -> None:
        self.r = r = random.Random(f"{lang}:{seed}")  # the two languages are not translations of each other
        self.L = 0 if lang == "en" else 1
        self.sample_id = sample_id
        self.user = r.choice(T.USERS[self.L])
        self.team = r.sample(T.TEAM[self.L], 8)
        self.projects = r.sample(sorted(T.PROJECTS), 4)
        self.proj_of: dict[str, str] = {}
        self.svcs: list[str] = []
        self.tables: list[str] = []
        for key in self.projects:
            for s in T.PROJECTS[key]["svcs"]:
                self.proj_of[s] = key
                self.svcs.append(s)
            for t in T.PROJECTS[key]["tables"]:
                self.proj_of[t] = key
                self.tables.append(t)
        self.prefix = {k: r.choice(T.PROJECTS[k]["prefix"]) for k in self.projects}
        self.region = {k: r.choice(T.REGIONS) for k in self.projects}
        self.org = r.choice(ORGS)
        self.hosts: list[str] = []
        self.fresh = r.sample(T.FRESH_SVCS, len(T.FRESH_SVCS))
        self.used: set[tuple[str, str]] = set()  # (kind, subject) stated somewhere
        self.values: set[tuple[str, str]] = set()  # (kind, value) stated somewhere
        self.taken: dict[str, set[int]] = {}  # detail pools (bugs, features) already asked about
        self.shas: list[str] = []
        self.smalltalk: list[Any] = []
        self.links: set[Any] = set()  # multi-hop first links and temporal events already used
        self.asked: list[tuple[str, str]] = []  # (kind, service) of single-hop questions
        self.host_set: set[str] = set()
        for _ in range(8):
            self.hosts.append(self.new_host(r.choice(self.projects)))

    # ---- small helpers
    def t(self, pair: tuple[str, str]) -> str:
        return pair[self.L]

    def fmt(self, pair: tuple[str, str], c: dict[str, Any]) -> str:
        return pair[self.L].format(**c)

    def people(self) -> tuple[str, str]:
        a, b = self.r.sample(self.team, 2)
        return a, b

    def lang_of(self, subject: str) -> str:
        return T.PROJECTS[self.proj_of.get(subject, self.projects[0])]["lang"]

    def new_host(self, project: str) -> str:
        for _ in range(100):
            name = f"{T.PROJECTS[project]['host']}-{self.region[project]}-{self.r.randint(1, 14):02d}"
            if name not in self.host_set:
                break
        else:
            name = f"{T.PROJECTS[project]['host']}-{self.region[project]}-{len(self.host_set) + 20}"
        self.host_set.add(name)
        self.proj_of[name] = project
        return name

    def new_svc(self, like: str) -> str:
        name = self.fresh.pop()
        self.proj_of[name] = self.proj_of.get(like, self.projects[0])
        return name

    def pick(self, pool_name: str, pool: list[Any], unique: bool) -> Any:
        taken = self.taken.setdefault(pool_name, set())
        free = [i for i in range(len(pool)) if i not in taken] if unique else []
        i = self.r.choice(free) if free else self.r.randrange(len(pool))
        if unique:
            taken.add(i)
        return pool[i]

    def sha(self) -> str:
        if self.shas and self.r.random() < 0.4:  # near miss: same first characters as an earlier sha
            return self.r.choice(self.shas)[:3] + "".join(self.r.choice("0123456789abcdef") for _ in range(4))
        return "".join(self.r.choice("0123456789abcdef") for _ in range(7))

    # ---- facts: (kind, subject) -> value, and the exchange that states it
    def context(self, kind: str, subject: str, asked: bool) -> dict[str, Any]:
        r, L = self.r, self.L
        person, person2 = self.people()
        project = self.proj_of.get(subject, self.projects[0])
        c: dict[str, Any] = {"s": subject, "person": person, "person2": person2, "ns": project,
                             "lang": self.lang_of(subject), "p": self.t(T.PROJECTS[project]["name"])}  # fmt: skip
        if kind in ("ticket", "sha"):
            bug = self.pick("bug", T.BUGS, asked)
            c.update(x=bug[L], xq=bug[2 + L], msg=bug[4])
        elif kind == "env":
            purpose = r.choice(T.ENV_PURPOSES)
            c.update(x=purpose[L], suffix=purpose[2])
        elif kind == "column":
            purpose = self.pick("column", T.COL_PURPOSES, asked)
            c.update(x=purpose[L], cols=purpose[2])
        elif kind == "flag":
            feature = self.pick("feature", T.FEATURES, asked)
            c.update(x=feature[L], slug=feature[2])
        elif kind == "version":
            c["lib"] = r.choice(T.LIBS[c["lang"]])
            c["x"] = c["lib"][0]
        elif kind == "p99":
            c["x"] = r.choice(T.ENDPOINTS)
        elif kind == "timeout":
            c["x"] = r.choice([s for s in self.svcs if s != subject])
        c["v"] = self.value(kind, c)
        return c

    def value(self, kind: str, c: dict[str, Any]) -> str:
        for _ in range(60):
            v = self.raw_value(kind, c)
            if (kind, v) not in self.values:
                break
        self.values.add((kind, v))
        return v

    def raw_value(self, kind: str, c: dict[str, Any]) -> str:
        r, s = self.r, c["s"]
        project = self.proj_of.get(s, self.projects[0])
        if kind == "port":
            return str(r.choice([3000, 4000, 5000, 7000, 8000, 9000]) + r.randint(1, 99))
        if kind == "env":
            return f"{s.upper().replace('-', '_')}_{c['suffix']}"
        if kind == "ticket":
            return f"{self.prefix[project]}-{r.randint(1000, 1999)}"
        if kind == "sha":
            v = self.sha()
            self.shas.append(v)
            return v
        if kind == "version":
            _, pattern, low, high = c["lib"]
            v = pattern.format(r.randint(low, high))
            return v + f".{r.randint(0, 9)}" if v.count(".") < 2 else v
        if kind == "host":
            return self.new_host(project)
        if kind == "column":
            return r.choice(c["cols"])
        if kind == "flag":
            return r.choice(
                [f"{c['slug']}_v2", f"ff_{c['slug']}", f"{project}.{c['slug']}", f"enable_{c['slug']}"]
            )
        if kind == "exception":
            return r.choice(T.EXCEPTIONS[c["lang"]])
        if kind == "index":
            a, b = r.sample(["tenant_id", "created_at", "device_id", "status", "ts", "account_id"], 2)
            return r.choice([f"idx_{s}_{a}_{b}", f"{s}_{a}_{b}_idx"])
        if kind == "cron":
            m, h, k = r.choice([0, 5, 15, 20, 30, 40, 45]), r.randint(0, 6), r.choice([10, 15, 20, 30])
            return r.choice(
                [f"{m} {h} * * *", f"*/{k} * * * *", f"{m} {h} * * 1-5", f"{m} */{r.randint(2, 6)} * * *"]
            )
        if kind == "memlimit":
            return r.choice(T.MEMLIMITS)
        if kind == "p99":
            return f"{r.randint(45, 900)} ms"
        if kind == "topic":
            return f"{project}.{r.choice(T.TOPIC_NOUNS)}.v{r.randint(2, 4)}"
        if kind == "bucket":
            return f"{self.org}-{project}-exports-{r.choice(['prod', 'prod-eu', 'v2', 'archive'])}"
        if kind == "owner":
            return c["person"]
        if kind == "timeout":
            return r.choice(
                [f"{r.choice([2, 3, 5, 8, 10, 12, 15, 20, 30, 45])}s", f"{r.choice([250, 400, 750, 1500])}ms"]
            )
        if kind == "alert":
            return "".join(w.title() for w in s.split("-")) + r.choice(T.ALERT_SUFFIXES)
        if kind == "batch":
            return str(r.choice([200, 250, 400, 500, 750, 1000, 1500, 2000, 2500, 5000]))
        if kind == "itype":
            return r.choice(T.ITYPES)
        if kind == "ip":
            return f"10.{r.randint(0, 40)}.{r.randint(0, 255)}.{r.randint(2, 254)}"
        raise ValueError(kind)

    def fact(self, kind: str, subject: str, asked: bool = True) -> tuple[Ex, str, dict[str, Any]]:
        """The exchange stating `subject`'s `kind`, which side holds it, and its context (value "v")."""
        c = self.context(kind, subject, asked)
        self.used.add((kind, subject))
        side, user, answer = self.r.choice(T.KINDS[kind]["ev"])
        if "{block}" in user[0] + answer[0]:
            c["block"] = self.block(kind, c)
        about = subject if subject in self.svcs else self.r.choice(self.svcs)
        return Ex(self.fmt(user, c), self.fmt(answer, c), s=about), side, c

    def subject_for(self, kind: str) -> str | None:
        pool = {"svc": self.svcs, "table": self.tables, "host": self.hosts}[T.KINDS[kind]["subj"]]
        free = [s for s in pool if (kind, s) not in self.used]
        return self.r.choice(free) if free else None

    # ---- code blocks: T.BLOCKS filled in with the fact's context and a few made-up neighbours
    def block(self, kind: str, c: dict[str, Any]) -> str:
        r, s, v, lang = self.r, c["s"], c.get("v", ""), c["lang"]
        c = {
            **c,
            "n": r.randint(100, 400),
            "m": r.randint(2, 900),
            "org": self.org,
            "mod": s.replace("-", "_"),
        }
        name = kind
        if kind == "port":
            name, c["old"] = r.choice(["port_yaml", "port_diff"]), int(v) + r.choice([-3, -2, -1, 1, 2, 10])
        elif kind == "ticket":
            near = [
                f"{v.split('-')[0]}-{int(v.split('-')[1]) + d}" for d in r.sample([-12, -3, -1, 1, 4, 9], 2)
            ]
            rows = [(v, c["x"], ("in progress", "进行中"))] + [
                (t, issue[self.L], r.choice([("todo", "待处理"), ("review", "评审中")]))
                for t, issue in zip(near, r.sample(T.MINOR_ISSUES, 2), strict=True)
            ]
            return self.table(kind, [(a, b, self.t(st)) for a, b, st in rows])
        elif kind == "sha":
            lines = [f"{v} fix({s}): {c['msg']}", f"{self.sha()} chore: bump lint config"]
            lines += [
                f'{self.sha()} Revert "chore: bump lint config"',
                f"{self.sha()} build: update base image",
            ]
            c["lines"] = "\n".join(r.sample(lines, 4))
        elif kind == "version":
            parts = v.split(".")
            c["newer"] = ".".join([*parts[:-1], str(int(parts[-1]) + r.randint(1, 3))])
            c["path"] = T.GO_PATHS.get(c["x"], c["x"])
        elif kind == "column":
            c["sqltype"] = "timestamptz" if v.endswith("_at") else "text"
        elif kind == "memlimit":
            c["old"] = r.choice([m for m in T.MEMLIMITS if m != v])
        elif kind == "p99":
            others = r.sample([e for e in T.ENDPOINTS if e != c["x"]], 3)
            rows = [(c["x"], v)] + [(e, f"{r.randint(45, 900)} ms") for e in others]
            return self.table(
                kind,
                [
                    (e, r.randint(80, 2400), f"{r.randint(8, 40)} ms", p, f"0.0{r.randint(1, 9)} %")
                    for e, p in rows
                ],
            )
        elif kind == "topic":
            c["old"] = f"{self.proj_of.get(s, 'core')}.{r.choice(T.TOPIC_NOUNS)}"
        elif kind == "bucket":
            c["day"] = f"2023-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
        elif kind == "timeout":
            c["ms"] = int(v[:-2]) if v.endswith("ms") else int(v[:-1]) * 1000
            c["sec"] = c["ms"] / 1000
        elif kind == "itype":
            rows = [(s, v)] + [(self.new_host(r.choice(self.projects)), r.choice(T.ITYPES)) for _ in range(2)]
            return self.table(
                kind, [(h, ty, f"eu-central-1{r.choice('abc')}", r.choice(["gp2", "gp3"])) for h, ty in rows]
            )
        elif kind == "ip":
            rows = [
                (s, v),
                (self.new_host(r.choice(self.projects)), v.rsplit(".", 1)[0] + f".{r.randint(2, 254)}"),
            ]
            c["lines"] = "\n".join(f"{ip}\t{h}" for h, ip in r.sample(rows, 2))
        elif kind in ("pods", "top"):
            pods = [
                f"{s}-{r.randint(5, 9)}d{r.choice('bcdf')}{r.randint(100, 999)}-{r.choice('xkq')}{r.randint(10, 99)}"
                for _ in range(3)
            ]
            if kind == "pods":
                rows = [
                    f"{p:<34}{'0/1' if i == 2 else '1/1'}   {'Pending' if i == 2 else 'Running':<9}{r.randint(0, 3)}  {r.randint(1, 9)}d"
                    for i, p in enumerate(pods)
                ]
                c["lines"] = "NAME" + " " * 30 + "READY STATUS   RESTARTS AGE\n" + "\n".join(rows)
            else:
                rows = [f"{p:<34}{r.randint(80, 900)}m         {r.randint(200, 1900)}Mi" for p in pods]
                c["lines"] = "NAME" + " " * 30 + "CPU(cores)   MEMORY(bytes)\n" + "\n".join(rows)
        if f"{kind}_{lang}" in T.BLOCKS:
            name = f"{kind}_{lang}"
        return T.BLOCKS[name].format(**c)

    def table(self, kind: str, rows: list[tuple[Any, ...]]) -> str:
        """A markdown table, its rows shuffled so the fact is not always first."""
        body = ["| " + " | ".join(str(x) for x in row) + " |" for row in self.r.sample(rows, len(rows))]
        head = self.t(T.HEADS[kind])
        return "\n".join([head, "|" + "---|" * head.count(" | ") + "---|", *body])

    # ---- the five categories
    def single(self, kind: str) -> Item | None:
        subject = self.subject_for(kind)
        if subject is None:
            return None
        ex, side, c = self.fact(kind, subject)
        if subject in self.svcs:
            self.asked.append((kind, subject))
        q = self.fmt(self.r.choice(T.KINDS[kind]["q"]), c)
        return Item([ex], qa=[dict(q=q, a=c["v"], cat=1, needles=[(0, side, c["v"])])])

    def multi(self) -> Item:
        r = self.r
        while True:  # one question per (relation, first link)
            name = r.choice(sorted(T.RELATIONS))
            rel = T.RELATIONS[name]
            old = r.choice(self.svcs if rel["src"] == "svc" else self.tables)
            if (name, old) not in self.links:
                self.links.add((name, old))
                break
        new = self.new_svc(old) if rel["dst"] == "svc" else self.new_host(self.proj_of[old])
        part = r.choice(T.SPLIT_PARTS)[self.L]
        side1, user, answer = r.choice(rel["ev"])
        c1 = {"old": old, "new": new, "part": part}
        link = Ex(self.fmt(user, c1), self.fmt(answer, c1))
        kind = r.choice(MULTI_KINDS[rel["dst"]])
        ex, side2, c = self.fact(kind, new)
        q = r.choice(T.KINDS[kind]["q"])[self.L].format(**{**c, "s": self.fmt(rel["np"], c1)})
        return Item(
            [link, ex], qa=[dict(q=q, a=c["v"], cat=2, needles=[(0, side1, new), (1, side2, c["v"])])]
        )

    def scene(self) -> dict[str, Any]:
        """Subjects and people for the open, revised and temporal templates."""
        r = self.r
        person, person2 = self.people()
        s = r.choice(self.svcs)
        return {"s": s, "t": r.choice(self.tables), "c": r.choice(T.CUSTOMERS[self.L]), "person": person,
                "person2": person2, "p": self.t(T.PROJECTS[self.proj_of[s]]["name"]), "hm": f"{r.randint(9, 17)}:{r.choice(['05', '20', '40', '55'])}",
                "rt": T.RUNTIMES[self.lang_of(s)]}  # fmt: skip

    def reply(self, c: dict[str, Any], other: tuple[str, str] | None) -> str:
        return self.fmt(other, c) if other else self.t(self.r.choice(T.ACKS))

    def open(self, topic: tuple[Any, ...]) -> Item:
        question, aspects = topic
        c = self.scene()
        if "{s} model" in question[0]:
            c["s"] = next((s for s in self.svcs if self.proj_of[s] == "ml"), c["s"])
        if "{s} UI" in question[0]:
            c["s"] = next(
                (s for s in self.svcs if s in ("web-console", "tenant-admin", "app-config")), c["s"]
            )
        exs, needles, keys = [], [], []
        if self.r.random() < 0.3:
            aspects = self.r.sample(aspects, len(aspects) - 1)
        for i, (side, text, other, key) in enumerate(aspects):
            said = self.fmt(text, c)
            exs.append(
                Ex(said, self.reply(c, other), s=c["s"])
                if side == "u"
                else Ex(self.fmt(other, c), said, s=c["s"])
            )
            needles.append((i, side, self.t(key)))
            keys.append(self.t(key))
        return Item(exs, qa=[dict(q=self.fmt(question, c), a="; ".join(keys), cat=3, needles=needles)])

    def revised(self, topic: tuple[Any, ...]) -> Item:
        r = self.r
        what, alias, values = topic
        c = self.scene()
        a, b, final = r.sample(values, 3)
        if r.random() < 0.25:
            final = a  # back to the first choice after all
        topic_text, alias_text = self.fmt(what, c), self.fmt(alias, c)
        exs, sides = [], []
        for pool, old, new in ((T.REV_A, None, a), (T.REV_B, a, b), (T.REV_C, b, final)):
            side, user, answer = r.choice(pool)
            reason = self.fmt(r.choice(T.REV_REASONS), c)
            cc = {
                **c,
                "topic": topic_text,
                "alias": alias_text,
                "v": self.t(new),
                "old": self.t(old or new),
                "reason": reason,
            }
            exs.append(Ex(self.fmt(user, cc), self.reply(cc, answer), s=c["s"]))
            sides.append(side)
        q = self.fmt(r.choice(T.REV_Q), {"topic": topic_text})
        qa = dict(q=q, a=self.t(final), cat=4, needles=[(2, sides[2], self.t(final))])
        return Item(exs, ordered=True, spread=2, qa=[qa])

    def temporal(self, event: tuple[Any, ...], unique: bool) -> Item:
        r = self.r
        what, alias = event
        while True:  # no two events with the same wording
            c = self.scene()
            c.update(
                h=r.choice(self.hosts),
                flag=f"ff_{r.choice(T.FEATURES)[2]}",
                feature=r.choice(T.FEATURES)[self.L],
            )
            c["event"] = self.fmt(what, c)
            if c["event"] not in self.links:
                self.links.add(c["event"])
                break
        c["alias"] = self.fmt(alias, c) if unique else c["event"]
        steps = (
            [T.EV_PLAN]
            + [T.EV_POSTPONE] * (r.random() < 0.45)
            + [T.EV_DONE]
            + [T.EV_AFTER] * (r.random() < 0.2)
        )
        exs, done = [], 0
        for pool in steps:
            side, user, answer = r.choice(pool)
            cc = {**c, "reason": self.fmt(r.choice(T.EV_REASONS), c)}
            if pool is T.EV_DONE:
                done, done_side = len(exs), side
                needle = c["alias"] if "{alias}" in user[self.L] else c["event"]
            exs.append(Ex(self.fmt(user, cc), self.reply(cc, answer), s=c["s"]))
        q = self.fmt(r.choice(T.EV_Q), c)
        return Item(
            exs, ordered=True, qa=[dict(q=q, a=None, cat=5, needles=[(done, done_side, needle)], done=done)]
        )

    def filler(self) -> Ex:
        r = self.r
        roll = r.random()
        if roll < 0.3:  # a fact nobody asks about, same kinds and near-miss values
            kind = r.choice(sorted(T.KINDS))
            subject = self.subject_for(kind)
            if subject is not None:
                return self.fact(kind, subject, asked=False)[0]
        if roll < 0.82:
            block, (user, answer) = r.choice(T.FILLER)
            c, kind = self.scene(), r.choice(sorted(T.KINDS))
            if self.asked and r.random() < 0.6:  # near an asked fact: same service, same kind of thing
                kind, c["s"] = r.choice(self.asked)
            c.update(kw=self.t(T.KINDS[kind]["kw"]), lang=self.lang_of(c["s"]), ns=self.proj_of[c["s"]])
            if block:
                c["block"] = self.block(block, c)
            return Ex(self.fmt(user, c), self.fmt(answer, c), s=c["s"])
        if not self.smalltalk:
            self.smalltalk = r.sample(T.SMALLTALK, len(T.SMALLTALK))
        user, answer = self.smalltalk.pop()
        return Ex(self.fmt(user, self.scene()), self.t(answer), s="-")

    # ---- putting it together
    def items(self) -> list[Item]:
        r = self.r
        kinds = sorted(T.KINDS) * 2
        r.shuffle(kinds)
        items = [it for it in (self.single(k) for k in kinds[:40]) if it is not None]
        items += [self.multi() for _ in range(15)]
        items += [self.open(topic) for topic in self.open_topics()[:15]]
        items += [self.revised(topic) for topic in T.REVISED]
        events = r.sample(T.EVENTS, len(T.EVENTS)) + r.sample(T.EVENTS, 4)
        items += [self.temporal(e, events.count(e) == 1) for e in events]
        return items

    def open_topics(self) -> list[tuple[Any, ...]]:
        topics = list(T.OPEN)
        if "ml" not in self.projects:
            topics = [t for t in topics if "{s} model" not in t[0][0]]
        if not {"console", "mobile"} & set(self.projects):
            topics = [t for t in topics if "{s} UI" not in t[0][0]]
        self.r.shuffle(topics)
        return topics

    def place(self, items: list[Item], count: int) -> list[list[Ex]]:
        r = self.r
        sessions: list[list[Ex]] = [[] for _ in range(count)]
        for item in items:
            k = len(item.exs)
            for _ in range(200):
                pick = r.sample(range(count), k)
                if item.ordered:
                    pick.sort()
                    if any(b - a < item.spread for a, b in itertools.pairwise(pick)):
                        continue
                break
            for ex, at in zip(item.exs, pick, strict=True):
                ex.session = at
                sessions[at].append(ex)
        return sessions

    def tail(self, ex: Ex, share: float = 0.8) -> Ex:
        """Sometimes lengthens an assistant answer with a generic paragraph about the same service."""
        acks = {self.t(a) for a in T.ACKS}
        if ex.s != "-" and ex.assistant not in acks and self.r.random() < share:
            s = ex.s or self.r.choice(self.svcs)
            for tail in self.r.sample(T.TAILS, 1 + (self.r.random() < 0.45)):
                if self.r.random() < 0.5:  # about a neighbouring service, to spread the names around
                    s = self.r.choice([x for x in self.svcs if self.proj_of[x] == self.proj_of[s]])
                ex.assistant += "\n\n" + self.fmt(tail, {"s": s, "ns": self.proj_of[s]})
        return ex

    def typo(self, text: str, protected: set[str]) -> str:
        if self.L or self.r.random() > 0.2 or "```" in text:
            return text
        words = [m for m in re.finditer(r"\b[a-z]{5,}\b", text) if m.group() not in protected]
        if not words:
            return text
        m = self.r.choice(words)
        w, i = m.group(), self.r.randrange(1, len(m.group()) - 2)
        w = self.r.choice([w[:i] + w[i + 1] + w[i] + w[i + 2 :], w[:i] + w[i + 1 :], w[:i] + w[i] + w[i:]])
        return text[: m.start()] + w + text[m.end() :]

    def build(self) -> dict[str, Any]:
        r = self.r
        items = self.items()
        for item in items:
            for ex in item.exs:
                self.tail(ex)
        count = r.randint(26, 36)
        sessions = self.place(items, count)
        target = r.randint(19000, 21500)
        used = sum(tokens(ex.user) + tokens(ex.assistant) for s in sessions for ex in s)
        added = 0
        while added < 10 or (used < target and added < 24):
            ex = self.tail(self.filler())
            least = min(len(s) for s in sessions)
            at = r.choice([i for i, s in enumerate(sessions) if len(s) <= least + 1])
            sessions[at].append(ex)
            used += tokens(ex.user) + tokens(ex.assistant)
            added += 1
        protected = {
            w for it in items for qa in it.qa for n in qa["needles"] for w in re.findall(r"\w+", n[2])
        }
        protected |= {w for s in self.svcs + self.tables for w in re.findall(r"\w+", s)}
        evidence_turns = {
            id(it.exs[n[0]]) for it in items for qa in it.qa for n in qa["needles"] if n[1] == "u"
        }
        start = datetime(r.choice([2023, 2024]), r.randint(1, 6), r.randint(1, 28))
        days = sorted(r.sample(range(r.randint(95, 150)), count))
        conversation: dict[str, Any] = {"speaker_a": self.user, "speaker_b": "Assistant"}
        dates = []
        for number, (day, exs) in enumerate(zip(days, sessions, strict=True), 1):
            r.shuffle(exs)
            when = start + timedelta(days=day, hours=r.randint(8, 19), minutes=r.randint(0, 59))
            dates.append(when)
            half = "am" if when.hour < 12 else "pm"
            conversation[f"session_{number}_date_time"] = (
                f"{(when.hour - 1) % 12 + 1}:{when.minute:02d} {half} on {when.day} {MONTHS[when.month - 1]}, {when.year}"
            )
            turns = []
            for j, ex in enumerate(exs):
                ex.session = number - 1
                ex.ids = (f"D{number}:{2 * j + 1}", f"D{number}:{2 * j + 2}")
                user = ex.user if id(ex) in evidence_turns else self.typo(ex.user, protected)
                turns.append({"speaker": self.user, "dia_id": ex.ids[0], "text": user})
                turns.append({"speaker": "Assistant", "dia_id": ex.ids[1], "text": ex.assistant})
            conversation[f"session_{number}"] = turns
        qa = []
        for item in items:
            for q in item.qa:
                evidence = [item.exs[i].ids[0 if side == "u" else 1] for i, side, _ in q["needles"]]
                for i, side, needle in q["needles"]:
                    if needle not in item.exs[i].text(side):
                        raise AssertionError(
                            f"{self.sample_id}: {needle!r} not in {item.exs[i].text(side)!r}"
                        )
                answer = q["a"]
                if q["cat"] == 5:
                    when = dates[item.exs[q["done"]].session]
                    answer = (
                        f"{when.year}年{when.month}月{when.day}日"
                        if self.L
                        else f"{when.day} {MONTHS[when.month - 1]}, {when.year}"
                    )
                if (
                    self.L
                ):  # "接替 X 的那个服务 里": no space between Chinese words once a phrase is filled in
                    q["q"] = re.sub(r"(?<=[\u4e00-\u9fff]) (?=[\u4e00-\u9fff])", "", q["q"])
                qa.append({"question": q["q"], "answer": answer, "evidence": evidence, "category": q["cat"]})
        r.shuffle(qa)
        return {
            "sample_id": self.sample_id,
            "conversation": conversation,
            "qa": qa,
            "category_names": CATEGORY_NAMES,
        }


def stats(sample: dict[str, Any]) -> str:
    conv = sample["conversation"]
    turns = [t for k, v in conv.items() if re.fullmatch(r"session_\d+", k) for t in v]
    sessions = sum(1 for k in conv if re.fullmatch(r"session_\d+", k))
    known = {t["dia_id"] for t in turns}
    missing = sum(e not in known for q in sample["qa"] for e in q["evidence"])
    per = {c: sum(q["category"] == int(c) for q in sample["qa"]) for c in CATEGORY_NAMES}
    cats = " ".join(f"{CATEGORY_NAMES[c]}={n}" for c, n in per.items())
    return (f"{sample['sample_id']}: {sessions} sessions, {len(turns)} turns, ~{sum(tokens(t['text']) for t in turns)} tokens, "
            f"{len(sample['qa'])} questions ({cats}), missing evidence {missing}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lang", choices=["en", "zh"], default="en")
    parser.add_argument("--seed", type=int, default=501)
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    samples = [
        Conversation(args.seed + i, args.lang, f"blind-{args.lang}-{args.seed}-{i}").build()
        for i in range(args.conversations)
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(samples, ensure_ascii=False, indent=1))
    for sample in samples:
        print(stats(sample), file=sys.stderr)


if __name__ == "__main__":
    main()
