"""Synthetic work-chat development sets (issue 11): long technical sessions between a developer and an
assistant, laid out like the LoCoMo file, so `benchmarks/locomo.py --data FILE` scores them the same way.

    python benchmarks/workchat.py --lang en --out benchmarks/data/workchat-en.json
    python benchmarks/workchat.py --lang zh --out benchmarks/data/workchat-zh.json   # Chinese, English ids

Each conversation is a made-up team's services, hosts, jobs, people and tickets, talked about over a
dozen sessions (incidents, migrations, API design, reviews) with planted facts and questions of five
kinds, whose evidence is the turns that hold the answer:

- single-hop: one turn states it ("ledger-api listens on 8443 now").
- multi-hop: a fact chained through two turns said in different sessions ("nightly-export runs on
  etl-07" ... "etl-07 is in eu-west-1"); the question names only the first link.
- why: a decision and, in the developer's next turn, its reason, which does not repeat the names.
- revised: a value set, then changed sessions later; the question asks for the current one and the
  evidence is the turn that changed it (the old turn is a trap, not evidence).
- temporal: when something happened (the session's date answers it).

Around them, filler of the same vocabulary (the same services' other numbers, other services' ports,
deploys, reviews, explanations), so keyword overlap alone does not find the evidence. Deterministic for
a seed. The categories are named in each sample (`category_names`), which `locomo.py` reads.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

CATEGORY_NAMES = {1: "single-hop", 2: "multi-hop", 3: "why", 4: "revised", 5: "temporal"}

SERVICES = [
    "ledger-api", "auth-gw", "billing-worker", "search-indexer", "notif-svc", "payments-core",
    "inventory-sync", "report-gen", "user-profile", "audit-log", "rate-limiter", "media-proxy",
    "order-router", "geo-lookup", "feature-flags", "export-runner", "session-broker", "pricing-engine",
]  # fmt: skip
HOSTS = ["etl-07", "db-prod-3", "k8s-node-12", "batch-02", "edge-lb-4", "worker-19", "gpu-a6", "cron-01"]
REGIONS = ["us-east-2", "eu-west-1", "ap-south-1", "us-west-2", "eu-central-1", "sa-east-1"]
JOBS = ["nightly-export", "invoice-rollup", "index-rebuild", "cache-warmer", "gdpr-purge", "usage-meter"]
PEOPLE = ["Priya", "Marco", "Chen Jie", "Olga", "Tomás", "Aisha", "Kenji", "Fatima", "Lukas", "Noor"]
DATABASES = ["pg-orders", "pg-ledger", "mysql-legacy", "pg-analytics", "pg-users", "timescale-metrics"]
TABLES = ["orders", "invoices", "line_items", "sessions", "audit_events", "payouts", "accounts"]
BRANCHES = ["feat/retry-budget", "fix/tz-parsing", "chore/bump-deps", "feat/bulk-export", "fix/n-plus-one"]
MODULES = ["tests/test_refunds.py", "src/cache/lru.go", "pkg/auth/jwt.go", "app/billing/tax.py"]
TECH = ["Kafka", "RabbitMQ", "Redis", "Postgres", "gRPC", "S3", "ClickHouse", "Envoy", "Temporal"]

# (attribute, value maker) for single-hop facts and revisions.
ATTRIBUTES: dict[str, Any] = {
    "port": lambda r: str(r.choice([8080, 8443, 9090, 7443, 5050, 6060, 9443, 8181, 3030, 4040])),
    "timeout": lambda r: f"{r.choice([5, 10, 15, 20, 30, 45, 60, 90])}s",
    "pool": lambda r: str(r.choice([8, 12, 16, 24, 32, 48, 64])),
    "replicas": lambda r: str(r.choice([2, 3, 4, 6, 8, 10])),
    "ttl": lambda r: f"{r.choice([30, 60, 120, 300, 600, 900])}s",
    "retries": lambda r: str(r.choice([2, 3, 4, 5, 7])),
    "version": lambda r: f"v{r.randint(1, 4)}.{r.randint(0, 19)}.{r.randint(0, 9)}",
}

T: dict[str, dict[str, list[str]]] = {
    "en": {
        "state_port": ["{svc} listens on port {v} now, we moved it off the default.",
                       "FYI the port for {svc} is {v} after yesterday's change.",
                       "I switched {svc} to port {v} so it stops clashing with the sidecar.",
                       "{svc} is reachable on :{v} now, update your env files.",
                       "Moved {svc} over to {v}, the sidecar had grabbed the old one."],
        "ask_port": ["Which port does {svc} listen on?", "What port is {svc} on?"],
        "state_timeout": ["I set the upstream timeout of {svc} to {v}.",
                          "{svc} now gives up on upstream calls after {v}.",
                          "{svc} bails on a slow dependency after {v} now."],
        "ask_timeout": ["What is the upstream timeout of {svc}?", "After how long does {svc} give up on upstream calls?"],
        "state_pool": ["The DB connection pool of {svc} is {v} connections.",
                       "We sized the connection pool for {svc} at {v}.",
                       "{svc} holds at most {v} conns to Postgres now."],
        "ask_pool": ["How big is the connection pool of {svc}?", "How many DB connections does {svc}'s pool hold?"],
        "state_replicas": ["{svc} runs {v} replicas in prod.", "We scaled {svc} to {v} replicas.",
                           "Bumped {svc} to {v} pods after the traffic spike."],
        "ask_replicas": ["How many replicas does {svc} run in prod?", "To how many replicas is {svc} scaled?"],
        "state_ttl": ["Cache TTL for {svc} responses is {v}.", "{svc} caches its responses for {v}.",
                      "{svc} keeps answers around for {v} before it asks again."],
        "ask_ttl": ["What cache TTL does {svc} use?", "How long does {svc} cache its responses?"],
        "state_retries": ["{svc} retries a failed call {v} times before giving up.",
                          "Retry limit on {svc} is {v} attempts.",
                          "{svc} gives a flaky call {v} attempts, then surfaces the error."],
        "ask_retries": ["How many times does {svc} retry a failed call?", "What is the retry limit on {svc}?"],
        "state_version": ["{svc} is pinned to {v} in prod.", "Prod runs {svc} {v}, staging is ahead.",
                          "We're holding {svc} at {v} on the production cluster for now."],
        "ask_version": ["Which version of {svc} runs in prod?", "What version is {svc} pinned to in prod?"],
        "revise": ["Change of plan for {svc}: the {attr} goes to {v}, {old} was not working out.",
                   "Update on {svc}: we changed the {attr} from {old} to {v} after the load test.",
                   "Scratch the earlier {attr} for {svc}, it's {v} now."],
        "ask_revised": ["What is the current {attr} of {svc}?", "What {attr} did we end up with for {svc}?"],
        "chain_host_1": ["The {job} job runs on {host} now.", "We moved {job} to {host} last sprint."],
        "chain_host_2": ["{host} sits in {region}, in the rack that gets decommissioned next quarter.",
                         "Heads up, {host} is physically in {region}.",
                         "Reminder that {host} is one of the {region} boxes being retired."],
        "ask_host": ["In which region is the machine that runs the {job} job?",
                     "Which region does the {job} job run in?",
                     "Where geographically does {job} execute?"],
        "chain_owner_1": ["{person} owns {svc} since the reorg.", "{svc} belongs to {person}'s team now."],
        "chain_owner_2": ["{person} is on leave until {date}, so approvals go through the backup.",
                          "{person} is out until {date}."],
        "ask_owner": ["Until when is the owner of {svc} away?", "When is the person who owns {svc} back?"],
        "chain_db_1": ["{svc} writes everything to {db}.", "All of {svc}'s state lives in {db}."],
        "chain_db_2": ["{db} is at {pct}% disk, we need to clean it up.", "Disk on {db} reached {pct}% this morning."],
        "ask_db": ["How full is the disk of the database that {svc} writes to?",
                   "What disk usage did the database behind {svc} reach?",
                   "Is the storage under {svc}'s datastore running out?"],
        "chain_ticket_1": ["{ticket} was caused by {svc}, the postmortem is in the wiki.",
                           "Root cause of {ticket}: {svc}."],
        "chain_ticket_2": ["{svc} is still on {version} in prod.", "Prod still runs {svc} {version}, the upgrade slipped."],
        "ask_ticket": ["Which version is the service behind {ticket} running in prod?",
                       "What version does the service that caused {ticket} run in prod?"],
        "ack": ["Got it.", "Noted, thanks.", "Okay, I'll keep that in mind.", "Makes sense.", "Understood.",
                "Thanks for the heads-up.", "Good to know."],
        "why_prompt": ["Makes sense. What's the main reason?", "Okay. Why that choice?",
                       "Interesting, what drove that?"],
        "ask_why": ["Why did we decide to {decision}?", "What was the reason to {decision}?"],
        "event": ["We rolled back {svc} to {version} an hour ago, the new build leaked memory.",
                  "{ticket} fired for {svc} this morning, p99 went above two seconds.",
                  "We finished the cutover of {svc} to {db} today.",
                  "I rotated the signing keys of {svc} just now."],
        "ask_event": ["When did we roll back {svc}?", "When did {ticket} fire?",
                      "When did we finish the cutover of {svc} to {db}?", "When were the signing keys of {svc} rotated?"],
        "filler_user": [
            "Deploying {svc} {version} to staging now.",
            "CI is red on {branch}, looks like a flaky test in {module}.",
            "{person} asked whether {svc} can expose a readiness endpoint separate from liveness.",
            "The dashboard for {svc} shows p99 at {n} ms today, a bit above the usual.",
            "Can you review this query? SELECT id, status FROM {table} WHERE updated_at > now() - interval '1 day'",
            "I'm pairing with {person} on the {table} migration this afternoon.",
            "Staging {svc} has {n} pending messages in its queue, is that normal?",
            "We should document the {attr} settings for every service somewhere.",
            "Should {svc} talk to {other} over {tech} or plain HTTP?",
            "The load test against {svc} peaked at {n} requests per second.",
            "{svc} logs are full of connection reset warnings again.",
            "Let's write down the on-call runbook for {svc} before Friday.",
        ],
        "filler_assistant": [
            "For {svc}, I'd watch the error rate for the first hour after the rollout and keep the previous "
            "image tagged so a rollback is one command.",
            "A flaky test usually means shared state. Run the suite with random ordering and check whether "
            "{module} depends on a fixture another test mutates.",
            "An index on {table}(updated_at) would let the planner skip the sequential scan; check it with "
            "EXPLAIN ANALYZE first.",
            "Separate readiness from liveness: readiness should fail while {svc} warms its caches, liveness "
            "only when the process is wedged.",
            "A p99 of {n} ms could be GC pauses or a slow dependency. Compare it with {other}'s latency over "
            "the same window before tuning anything.",
            "For a zero-downtime change on {table}, add the column nullable, backfill in batches, then add "
            "the constraint NOT VALID and validate it separately.",
            "Connection resets between {svc} and {other} often come from an idle timeout on the load "
            "balancer that is shorter than the client's keep-alive.",
            "{tech} would give you ordering and replay, at the cost of running another cluster; plain HTTP "
            "is simpler if {svc} only needs request-response.",
            "A runbook for {svc} should cover how to drain it, where its dashboards are, and who to page.",
            "If the queue of {svc} keeps growing, scale the consumers or add backpressure at the producer.",
        ],
        "closing": ["Thanks, that's all for today.", "Great, let's pick this up tomorrow."],
    },
    "zh": {
        "state_port": ["{svc} 现在监听 {v} 端口，我们把它从默认端口挪走了。",
                       "说一下，昨天改完以后 {svc} 的端口是 {v}。",
                       "我把 {svc} 切到了 {v} 端口，免得和 sidecar 冲突。",
                       "{svc} 现在走 :{v}，记得改一下 env 文件。"],
        "ask_port": ["{svc} 监听的是哪个端口？", "{svc} 现在用哪个端口？"],
        "state_timeout": ["我把 {svc} 调上游的超时设成了 {v}。", "{svc} 调上游超过 {v} 就放弃。",
                          "依赖慢的话 {svc} 等 {v} 就不等了。"],
        "ask_timeout": ["{svc} 调上游的超时是多少？", "{svc} 调上游多久会放弃？"],
        "state_pool": ["{svc} 的数据库连接池是 {v} 个连接。", "我们把 {svc} 的连接池定成 {v}。",
                       "{svc} 到 Postgres 最多开 {v} 个 conn。"],
        "ask_pool": ["{svc} 的连接池有多大？", "{svc} 的连接池里有几个数据库连接？"],
        "state_replicas": ["{svc} 在生产环境跑 {v} 个副本。", "我们把 {svc} 扩到了 {v} 个副本。",
                           "流量高峰之后把 {svc} 加到了 {v} 个 pod。"],
        "ask_replicas": ["{svc} 在生产环境跑几个副本？", "{svc} 扩到了多少个副本？"],
        "state_ttl": ["{svc} 响应的缓存 TTL 是 {v}。", "{svc} 的响应缓存 {v}。"],
        "ask_ttl": ["{svc} 用的缓存 TTL 是多少？", "{svc} 的响应缓存多久？"],
        "state_retries": ["{svc} 调用失败会重试 {v} 次再放弃。", "{svc} 的重试上限是 {v} 次。",
                          "{svc} 碰到不稳定的调用最多试 {v} 回，然后把错误抛出来。"],
        "ask_retries": ["{svc} 调用失败会重试几次？", "{svc} 的重试上限是多少？"],
        "state_version": ["生产环境的 {svc} 锁在 {v}。", "生产跑的是 {svc} {v}，预发环境更新一些。"],
        "ask_version": ["生产环境跑的是哪个版本的 {svc}？", "生产环境的 {svc} 锁在哪个版本？"],
        "revise": ["{svc} 的计划变了：{attr} 改成 {v}，{old} 不太行。",
                   "{svc} 更新一下：压测之后我们把 {attr} 从 {old} 改成了 {v}。",
                   "之前说的 {svc} 的 {attr} 作废，现在是 {v}。"],
        "ask_revised": ["{svc} 现在的 {attr} 是多少？", "{svc} 的 {attr} 最后定的是多少？"],
        "chain_host_1": ["{job} 任务现在跑在 {host} 上。", "上个迭代我们把 {job} 挪到了 {host}。"],
        "chain_host_2": ["{host} 在 {region}，就是下个季度要下线的那个机架。", "提醒一下，{host} 物理上在 {region}。",
                         "别忘了 {host} 是 {region} 那批要退役的机器之一。"],
        "ask_host": ["跑 {job} 任务的那台机器在哪个区域？", "{job} 任务跑在哪个区域？", "{job} 实际是在哪个地域执行的？"],
        "chain_owner_1": ["重组以后 {svc} 归 {person} 负责。", "{svc} 现在归 {person} 的团队。"],
        "chain_owner_2": ["{person} 休假到 {date}，审批先找备份的人。", "{person} 要到 {date} 才回来。"],
        "ask_owner": ["{svc} 的负责人休假到什么时候？", "负责 {svc} 的人什么时候回来？"],
        "chain_db_1": ["{svc} 的数据全都写到 {db}。", "{svc} 的状态都存在 {db} 里。"],
        "chain_db_2": ["{db} 的磁盘用到了 {pct}%，得清理一下。", "今天早上 {db} 的磁盘到了 {pct}%。"],
        "ask_db": ["{svc} 写入的那个数据库磁盘用了多少？", "{svc} 背后的数据库磁盘使用率到了多少？",
                   "{svc} 的数据存储空间快满了吗？"],
        "chain_ticket_1": ["{ticket} 是 {svc} 引起的，复盘文档在 wiki 上。", "{ticket} 的根因：{svc}。"],
        "chain_ticket_2": ["生产环境的 {svc} 还是 {version}。", "生产还在跑 {svc} {version}，升级推迟了。"],
        "ask_ticket": ["引起 {ticket} 的那个服务在生产跑的是哪个版本？", "{ticket} 背后的服务生产环境是什么版本？"],
        "ack": ["收到。", "好的，记下了。", "明白，我会记住。", "有道理。", "了解。", "谢谢提醒。", "好的，知道了。"],
        "why_prompt": ["有道理。主要原因是什么？", "好的，为什么这么选？", "有意思，是什么促成的？"],
        "ask_why": ["我们为什么决定{decision}？", "当初{decision}的原因是什么？"],
        "event": ["一小时前我们把 {svc} 回滚到了 {version}，新版本内存泄漏。",
                  "今天早上 {svc} 触发了 {ticket}，p99 超过了两秒。",
                  "我们今天完成了 {svc} 到 {db} 的切换。",
                  "我刚刚轮换了 {svc} 的签名密钥。"],
        "ask_event": ["我们什么时候回滚的 {svc}？", "{ticket} 是什么时候触发的？",
                      "{svc} 到 {db} 的切换是什么时候完成的？", "{svc} 的签名密钥是什么时候轮换的？"],
        "filler_user": [
            "正在把 {svc} {version} 部署到预发环境。",
            "{branch} 上的 CI 挂了，看起来是 {module} 里有个不稳定的测试。",
            "{person} 问 {svc} 能不能把 readiness 和 liveness 接口分开。",
            "今天 {svc} 的看板显示 p99 是 {n} ms，比平时高一点。",
            "帮我看下这个查询？SELECT id, status FROM {table} WHERE updated_at > now() - interval '1 day'",
            "今天下午我和 {person} 结对做 {table} 的迁移。",
            "预发的 {svc} 队列里积压了 {n} 条消息，正常吗？",
            "我们应该把每个服务的 {attr} 配置都记录下来。",
            "{svc} 和 {other} 之间用 {tech} 还是普通 HTTP？",
            "对 {svc} 的压测峰值是每秒 {n} 个请求。",
            "{svc} 的日志里又全是 connection reset 的警告。",
            "周五之前把 {svc} 的值班手册写出来吧。",
        ],
        "filler_assistant": [
            "对 {svc}，上线后第一个小时盯住错误率，并保留上一个镜像的 tag，回滚只需一条命令。",
            "不稳定的测试通常是共享状态导致的。用随机顺序跑测试，看看 {module} 是否依赖被别的测试改过的 fixture。",
            "给 {table}(updated_at) 加索引可以让优化器跳过全表扫描；先用 EXPLAIN ANALYZE 确认。",
            "把 readiness 和 liveness 分开：{svc} 预热缓存时 readiness 应该失败，只有进程卡死时 liveness 才失败。",
            "p99 {n} ms 可能是 GC 停顿或者下游慢。调优之前先和同一时段 {other} 的延迟对比一下。",
            "要在 {table} 上做零停机变更：先加可空列，分批回填，再加 NOT VALID 约束并单独校验。",
            "{svc} 和 {other} 之间的 connection reset 往往是负载均衡的空闲超时比客户端的 keep-alive 短。",
            "{tech} 能提供顺序和重放，但要多维护一个集群；如果 {svc} 只需要请求响应，普通 HTTP 更简单。",
            "{svc} 的值班手册应该写清楚怎么摘流量、看板在哪、该呼叫谁。",
            "如果 {svc} 的队列一直涨，就扩消费者，或者在生产者那边加背压。",
        ],
        "closing": ["谢谢，今天就到这。", "好，明天接着弄。"],
    },
}  # fmt: skip

ATTR_NAMES = {
    "en": {"port": "port", "timeout": "upstream timeout", "pool": "connection pool size",
           "replicas": "replica count", "ttl": "cache TTL", "retries": "retry limit", "version": "version"},
    "zh": {"port": "端口", "timeout": "上游超时", "pool": "连接池大小", "replicas": "副本数",
           "ttl": "缓存 TTL", "retries": "重试上限", "version": "版本"},
}  # fmt: skip

# (decision, reason) per language, the same decisions in the same order.
DECISIONS = {
    "en": [
        ("move {svc} from RabbitMQ to Kafka", "The auditors want us to replay thirty days of events, and the old broker drops them after a day."),
        ("drop Redis as the session store of {svc}", "The failover in March lost every session, and Postgres already holds the data we need."),
        ("pin {svc} to Python 3.11", "The grpcio wheels for 3.12 segfault on our Alpine base image."),
        ("move {svc} off the shared cluster", "Its batch spikes starve the checkout pods every night around two."),
        ("use UUIDv7 for the ids in {svc}", "Sortable keys keep the B-tree inserts on the right-hand pages, random ones thrash the cache."),
        ("put {svc} behind the rate limiter", "A partner script hit it with forty thousand requests a minute last Tuesday."),
        ("keep {svc} on REST instead of gRPC", "The mobile team's SDK still cannot speak HTTP/2 through their proxy."),
        ("store money as integer cents in {svc}", "Float rounding left a batch of invoices off by one cent and finance noticed."),
        ("split the monolith's reporting out into {svc}", "Report queries were locking rows the checkout flow writes to."),
        ("turn off synchronous replication for {svc}", "The cross-region round trip added eighty milliseconds to every commit."),
        ("run {svc} migrations in a separate job", "Two pods raced on the same migration during the last deploy and one crashed halfway."),
        ("sign the webhooks of {svc} with HMAC", "Someone replayed an old payload from a leaked log and we could not tell it was forged."),
    ],
    "zh": [
        ("把 {svc} 从 RabbitMQ 迁到 Kafka", "审计要求能重放三十天的事件，旧的消息队列一天后就丢了。"),
        ("不再用 Redis 存 {svc} 的会话", "三月份那次故障切换把所有会话都丢了，而且 Postgres 里已经有需要的数据。"),
        ("把 {svc} 锁定在 Python 3.11", "3.12 的 grpcio wheel 在我们的 Alpine 基础镜像上会段错误。"),
        ("把 {svc} 从共享集群挪出去", "它的批处理高峰每天夜里两点左右都会把结算的 pod 饿死。"),
        ("在 {svc} 里用 UUIDv7 做 id", "有序的键让 B 树插入集中在右侧页面，随机的键会把缓存打乱。"),
        ("给 {svc} 加上限流", "上周二有个合作方的脚本每分钟打了四万个请求。"),
        ("让 {svc} 继续用 REST 而不是 gRPC", "移动端团队的 SDK 经过他们的代理还不支持 HTTP/2。"),
        ("在 {svc} 里用整数分来存金额", "浮点舍入让一批发票差了一分钱，财务发现了。"),
        ("把单体里的报表拆成 {svc}", "报表查询会锁住结算流程要写的行。"),
        ("关掉 {svc} 的同步复制", "跨区域的往返让每次提交多了八十毫秒。"),
        ("把 {svc} 的数据库迁移放到单独的任务里跑", "上次部署时两个 pod 抢着跑同一个迁移，其中一个跑到一半崩了。"),
        ("给 {svc} 的 webhook 加 HMAC 签名", "有人从泄露的日志里重放了一个旧请求，我们没法判断它是伪造的。"),
    ],
}  # fmt: skip


@dataclass
class Turn:
    speaker: str  # "a" (the developer) or "b" (the assistant)
    text: str
    tag: str | None = None  # the fact this turn plants, for the questions


@dataclass
class Conversation:
    sessions: list[list[Turn]] = field(default_factory=list)
    questions: list[tuple[str, list[str], int, str]] = field(default_factory=list)  # tags, not ids yet


def build(lang: str, seed: int, sessions: int, turns_per_session: int) -> dict[str, Any]:
    r = random.Random(seed)
    t = T[lang]
    names = ATTR_NAMES[lang]
    services = r.sample(SERVICES, 12)
    people = r.sample(PEOPLE, 6)
    world: dict[str, dict[str, str]] = {
        s: {a: make(r) for a, make in ATTRIBUTES.items()} for s in services
    }  # fmt: skip

    def fill(template: str, **values: str) -> str:
        base = {
            "svc": r.choice(services), "other": r.choice(services), "version": r.choice(
                [world[s]["version"] for s in services]), "branch": r.choice(BRANCHES),
            "module": r.choice(MODULES), "person": r.choice(people), "table": r.choice(TABLES),
            "n": str(r.choice([120, 340, 450, 800, 1200, 2300])), "tech": r.choice(TECH),
            "attr": names[r.choice(list(ATTRIBUTES))], "db": r.choice(DATABASES),
            "ticket": f"INC-{r.randint(1000, 9999)}",
        }  # fmt: skip
        base.update(values)
        return template.format(**base)

    joiner = " " if lang == "en" else ""

    def user() -> str:
        return joiner.join(fill(x) for x in r.sample(t["filler_user"], r.choice([1, 1, 2])))

    def assistant() -> str:
        # A real assistant explains at length: two to four points, about one service.
        svc, other = r.sample(services, 2)
        return joiner.join(
            fill(x, svc=svc, other=other) for x in r.sample(t["filler_assistant"], r.randint(2, 4))
        )

    def ack() -> str:
        return r.choice(t["ack"]) + (joiner + assistant() if r.random() < 0.5 else "")

    # Plan the planted facts: (session, [turns to insert in order], question, category).
    plans: list[tuple[int, list[Turn]]] = []
    questions: list[tuple[str, list[str], int]] = []
    counter = iter(range(10_000))
    late = sessions - 1  # the last session is filler and closing only (the recent window)

    def plant(session: int, turns: list[Turn]) -> None:
        plans.append((session, turns))

    def tag() -> str:
        return f"fact{next(counter)}"

    attrs = list(ATTRIBUTES)
    # single-hop: one stated attribute each, on distinct (service, attribute) pairs.
    pairs = r.sample([(s, a) for s in services for a in attrs], 22)
    for s, a in pairs[:10]:
        k = tag()
        plant(r.randrange(late), [Turn("a", fill(r.choice(t[f"state_{a}"]), svc=s, v=world[s][a]), k),
                                  Turn("b", ack())])  # fmt: skip
        questions.append((fill(r.choice(t[f"ask_{a}"]), svc=s), [k], 1))
    # Distractors: the same attributes of other services, stated with no question about them.
    for s, a in pairs[10:16]:
        plant(r.randrange(late), [Turn("a", fill(r.choice(t[f"state_{a}"]), svc=s, v=world[s][a])),
                                  Turn("b", ack())])  # fmt: skip
    # revised: stated early, changed at least two sessions later; the question asks for the current.
    for s, a in pairs[16:22]:
        first = r.randrange(0, late - 3)
        second = r.randrange(first + 2, late)
        old = world[s][a]
        new = ATTRIBUTES[a](r)
        while new == old:
            new = ATTRIBUTES[a](r)
        k = tag()
        plant(first, [Turn("a", fill(r.choice(t[f"state_{a}"]), svc=s, v=old)), Turn("b", ack())])
        plant(second, [Turn("a", fill(r.choice(t["revise"]), svc=s, attr=names[a], v=new, old=old), k),
                       Turn("b", ack())])  # fmt: skip
        questions.append((fill(r.choice(t["ask_revised"]), svc=s, attr=names[a]), [k], 4))
    # multi-hop: two links in different sessions, the question names only the first link's subject.
    chains = ["host", "owner", "db", "ticket"] * 2
    used_jobs = r.sample(JOBS, 2)
    hosts = r.sample(HOSTS, 2)
    chain_services = r.sample(services, 6)
    for i, kind in enumerate(chains):
        one, two = sorted(r.sample(range(late), 2))
        k1, k2 = tag(), tag()
        if kind == "host":
            host = hosts[i // 4]
            v1 = {"job": used_jobs[i // 4], "host": host}
            v2 = {"host": host, "region": r.choice(REGIONS)}
            ask = fill(r.choice(t["ask_host"]), job=used_jobs[i // 4])
        elif kind == "owner":
            person, svc = people[i // 4], chain_services[i // 4]
            day = datetime(2024, r.randint(3, 9), r.randint(1, 28))
            v1 = {"person": person, "svc": svc}
            v2 = {"person": person, "date": f"{day:%d %B}" if lang == "en" else f"{day.month}月{day.day}日"}
            ask = fill(r.choice(t["ask_owner"]), svc=svc)
        elif kind == "db":
            svc, db = chain_services[2 + i // 4], DATABASES[i // 4]
            v1 = {"svc": svc, "db": db}
            v2 = {"db": db, "pct": str(r.randint(71, 96))}
            ask = fill(r.choice(t["ask_db"]), svc=svc)
        else:
            svc, ticket = chain_services[4 + i // 4], f"INC-{r.randint(1000, 9999)}"
            v1 = {"ticket": ticket, "svc": svc}
            v2 = {"svc": svc, "version": world[svc]["version"]}
            ask = fill(r.choice(t["ask_ticket"]), ticket=ticket)
        plant(one, [Turn("a", fill(r.choice(t[f"chain_{kind}_1"]), **v1), k1), Turn("b", ack())])
        plant(two, [Turn("a", fill(r.choice(t[f"chain_{kind}_2"]), **v2), k2), Turn("b", ack())])
        questions.append((ask, [k1, k2], 2))
    # why: the decision, the assistant asking, the reason (no names repeated).
    for index in r.sample(range(len(DECISIONS[lang])), 8):
        decision, reason = DECISIONS[lang][index]
        svc = r.choice(services)
        k1, k2 = tag(), tag()
        said = decision.format(svc=svc)
        opening = f"We decided to {said}." if lang == "en" else f"我们决定{said}。"
        plant(r.randrange(late), [Turn("a", opening, k1), Turn("b", r.choice(t["why_prompt"])),
                                  Turn("a", reason, k2), Turn("b", ack())])  # fmt: skip
        questions.append((fill(r.choice(t["ask_why"]), decision=said), [k1, k2], 3))
    # temporal: an event in one session; its date answers "when".
    for which in r.sample(range(4), 4) + r.sample(range(4), 2):
        svc = r.choice(services)
        ticket = f"INC-{r.randint(1000, 9999)}"
        db = r.choice(DATABASES)
        k = tag()
        text = fill(t["event"][which], svc=svc, ticket=ticket, db=db)
        plant(r.randrange(late), [Turn("a", text, k), Turn("b", ack())])
        questions.append((fill(t["ask_event"][which], svc=svc, ticket=ticket, db=db), [k], 5))

    # Lay out the sessions: filler exchanges with the planted turns placed at random points.
    by_session: dict[int, list[list[Turn]]] = {}
    for session, turns in plans:
        by_session.setdefault(session, []).append(turns)
    start = datetime(2024, 3, 4, 9, 30)
    conversation: dict[str, Any] = {"speaker_a": "Alex" if lang == "en" else "李伟", "speaker_b": "Assistant"}
    dia_of: dict[str, str] = {}
    day = start
    for number in range(1, sessions + 1):
        blocks = by_session.get(number - 1, [])
        filler = max(turns_per_session // 2 - sum(len(b) for b in blocks) // 2, 4)
        exchanges: list[list[Turn]] = [[Turn("a", user()), Turn("b", assistant())] for _ in range(filler)]
        for block in blocks:
            exchanges.insert(r.randrange(len(exchanges) + 1), block)
        if number == sessions:
            exchanges.append([Turn("a", r.choice(t["closing"])), Turn("b", ack())])
        turns = [turn for block in exchanges for turn in block]
        key = f"session_{number}"
        conversation[f"{key}_date_time"] = f"{day:%-I:%M %p} on {day.day} {day:%B}, {day.year}".replace(
            "AM", "am"
        ).replace("PM", "pm")
        conversation[key] = []
        for offset, turn in enumerate(turns, start=1):
            dia = f"D{number}:{offset}"
            speaker = conversation["speaker_a"] if turn.speaker == "a" else "Assistant"
            conversation[key].append({"speaker": speaker, "dia_id": dia, "text": turn.text})
            if turn.tag:
                dia_of[turn.tag] = dia
        day += timedelta(days=r.choice([1, 2, 3, 6, 7]), hours=r.choice([-1, 0, 2, 5]))
    qa = [
        {"question": q, "answer": "", "evidence": [dia_of[k] for k in keys], "category": category}
        for q, keys, category in questions
    ]
    return {"sample_id": f"workchat-{lang}-{seed}", "conversation": conversation, "qa": qa,
            "category_names": {str(k): v for k, v in CATEGORY_NAMES.items()}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lang", choices=sorted(T), default="en")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--turns", type=int, default=34, help="about this many turns per session")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    samples = [build(args.lang, args.seed + i, args.sessions, args.turns) for i in range(args.conversations)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(samples, ensure_ascii=False, indent=1))
    turns = sum(len(v) for s in samples for k, v in s["conversation"].items() if isinstance(v, list))
    print(f"{len(samples)} conversations, {turns} turns, {sum(len(s['qa']) for s in samples)} questions")


if __name__ == "__main__":
    main()
