"""English templates of `workchat_styles.py`: the on-call ("ops") and the design-review ("design") styles.

Placeholders are filled by the generator (the world's names, values and times). A key's list holds
variants of one kind of turn; `ask_*` keys are the questions, `plan_*` keys mention an event without it
happening (traps for "when" questions).
"""

OPS: dict[str, list[str]] = {
    "echo": [
        "Also, {q}",
        "{person} asked me: {q} No rush.",
        "Unrelated: {q} I keep forgetting.",
        "And before I forget, {q}",
    ],
    "loose_svc": ["{loose} on {subject}"],
    "open": [
        "Morning. On call again, pager went off at {hm} for {svc}.",
        "Back on this. {person} handed over at {hm} UTC, nothing urgent in the notes.",
        "{hm} here, picking up where we left off in the last session.",
        "New session, same fires. The warm-up job for {svc} is still slow.",
        "Hey, quick one before standup at {hm}.",
    ],
    "close": [
        "Ok, handing over to {person} now. Thanks.",
        "That's it for this session.",
        "Logging off, pager goes to {person} at {hm} UTC.",
    ],
    "ack": [
        "Got it.",
        "Noted.",
        "Ok, that matches what I see.",
        "Makes sense, thanks.",
        "Understood.",
        "Good to know, I'll keep it in mind for the next incident.",
    ],
    "config": [
        "This is what's live for {svc} in prod right now:\n```yaml\n{svc}:\n  worker_concurrency: {c}\n"
        "  batch_size: {b}\n  visibility_timeout: {vt}s\n```",
        "Pulled the prod values for {svc} from the helm release:\n```\nworker_concurrency={c}\n"
        "batch_size={b}\nvisibility_timeout={vt}s\n```\nstaging differs, ignore that one.",
        "prod {svc} as deployed ({year} chart): concurrency {c}, batch {b}, visibility timeout {vt}s.",
    ],
    "ask_c": [
        "What worker concurrency does {svc} run with in prod?",
        "How many concurrent workers does {svc} have in production?",
    ],
    "ask_b": ["What batch size does {svc} use in prod?", "How big are {svc}'s batches in production?"],
    "ask_vt": [
        "What is the visibility timeout of {svc} in prod?",
        "How long is {svc}'s visibility timeout in production?",
    ],
    "oom_q": ["{svc} pods keep restarting since {hm}, what's going on?", "Why is {svc} flapping?"],
    "oom": [
        "The restarts are memory kills, not crashes. From the events you pasted:\n```\n{ts} kubelet "
        "{svc}-{pod} OOMKilled container={svc} limit={mem}\n{ts2} kubelet {svc}-{pod} Back-off restarting "
        "failed container\n```\nThe container sits right at the {mem} limit during the warm-up, so either "
        "raise the limit or shrink the warm-up cache. I'd also check whether the heap grows between "
        "restarts, which would point at a leak rather than sizing.",
        "It's the OOM killer. The relevant lines:\n```\n{ts} {svc}-{pod} exit 137 (OOMKilled), memory "
        "limit {mem}, rss at kill {rss}\n```\nSo the prod limit of {mem} is too tight for the current "
        "batch sizes. Two options:\n\n| option | risk |\n|---|---|\n| raise the limit | more nodes |\n"
        "| smaller batches | lower throughput |",
    ],
    "ask_mem": [
        "What memory limit were {svc}'s pods killed at?",
        "At which memory limit did {svc} get OOMKilled in prod?",
    ],
    "lag": [
        "{hm} UTC: consumer lag on {queue} peaked at {lag} messages, then drained by itself.",
        "lag graph for {queue} topped out at {lag} around {hm}, no alert fired",
        "fyi {queue} backed up to {lag} messages at {hm} before the consumers caught up",
    ],
    "ask_lag": ["How high did the consumer lag on {queue} peak?", "What was the peak backlog on {queue}?"],
    "placement_q": [
        "Where does everything run now after the move?",
        "Can you list the hosts again?",
        "Which boxes are these on, I lost track.",
    ],
    "placement": [
        "Here's the placement as of today:\n\n| service | host | port |\n|---|---|---|\n{rows}\n\n"
        "Everything else stays on the shared pool, and staging mirrors this with different ports.",
        "From the inventory:\n\n| service | host | port |\n|---|---|---|\n{rows}\n\nThe warm-up "
        "scripts assume these ports, so update them if anything moves again.",
    ],
    "row": ["| {svc} | {host} | {port} |"],
    "ask_host": ["Which host does {svc} run on?", "On which box is {svc} deployed?"],
    "ask_port": ["Which port does {svc} listen on?", "What port is {svc} on?"],
    "page": [
        "The page for {svc} fires when p99 stays above {ms} ms for five minutes.",
        "Set the {svc} latency alert to p99 > {ms} ms, it pages the primary.",
    ],
    "ask_page": [
        "At what p99 latency does the page for {svc} fire?",
        "What's the latency threshold of {svc}'s alert?",
    ],
    "runbook_q": [
        "How do I bounce {svc} without dropping in-flight jobs?",
        "What's the safe restart for {svc}?",
    ],
    "runbook": [
        "Drain first, then restart:\n```bash\nkubectl -n {ns} scale deploy/{svc} --replicas=0\n"
        "kubectl -n {ns} wait --for=delete pod -l app={svc} --timeout=120s\nkubectl -n {ns} scale "
        "deploy/{svc} --replicas={rep}\n```\nIn-flight jobs go back to the queue once their visibility "
        "timeout passes, so nothing is lost, only delayed.",
        "Use a rollout restart, it keeps the old pods until the new ones pass readiness:\n```bash\n"
        "kubectl -n {ns} rollout restart deploy/{svc}\nkubectl -n {ns} rollout status deploy/{svc}\n```",
    ],
    "ask_ns": ["Which Kubernetes namespace is {svc} deployed in?", "In which namespace does {svc} run?"],
    "ev_failover": [
        "Done: failed {svc} over to {region} at {hm} UTC, traffic looks normal.",
        "We just moved {svc}'s traffic to {region}, the primary is drained.",
    ],
    "plan_failover": [
        "We should rehearse failing {svc} over to {region} one of these days.",
        "Is a failover of {svc} to {region} even possible with the current quotas?",
    ],
    "ask_failover": ["When did we fail {svc} over to {region}?"],
    "ev_rollback": [
        "Rolled {svc} back to {version} at {hm}, the new build leaked file handles.",
        "{svc} is back on {version}, rollback finished a minute ago.",
    ],
    "plan_rollback": [
        "If {svc} {version} misbehaves we roll back, the image is still tagged.",
        "Keep {version} of {svc} around in case we need a rollback.",
    ],
    "ask_rollback": ["When did we roll {svc} back to {version}?"],
    "ev_replay": [
        "Replayed the dead letters of {queue} just now, {n} messages went through.",
        "The {queue} DLQ is empty again, I replayed all {n} at {hm}.",
    ],
    "plan_replay": [
        "At some point we need to replay the {queue} DLQ, it has {n} messages.",
        "Don't replay the {queue} dead letters yet, the consumer bug is not fixed.",
    ],
    "ask_replay": ["When did we replay the dead letters of {queue}?"],
    "ev_cert": [
        "Renewed the TLS cert of {svc} today, it was {days} days from expiring.",
        "New cert is live on {svc}, the old one expired in {days} days.",
    ],
    "plan_cert": [
        "The cert of {svc} expires in {days} days, somebody should look at it.",
        "Reminder: cert renewal for {svc} is still manual.",
    ],
    "ask_cert": ["When did we renew the TLS certificate of {svc}?"],
    "ev_drain": [
        "{host} is drained and cordoned as of {hm}, the disk swap can start.",
        "Finished draining {host}, all pods rescheduled.",
    ],
    "plan_drain": [
        "We'll have to drain {host} for the kernel patch eventually.",
        "{host} is on the list of nodes to drain next.",
    ],
    "ask_drain": ["When did we drain {host}?"],
    "rev_a": [
        "For {topic} on {svc}, let's start with {opt}.",
        "Proposal for {svc}'s {topic}: {opt}.",
        "I'd do {opt} for {svc}, as the {topic}. Objections?",
    ],
    "rev_a_reply": [
        "Reasonable as a first step. I'd revisit it after the next incident.",
        "Fine by me, it's the least work to start with.",
    ],
    "rev_b": [
        "Change of plan on the {topic} for {svc}: {opt} instead, the first idea didn't hold up.",
        "Update: {svc} goes to {opt} as its {topic}, after what we saw at {hm}.",
    ],
    "rev_c": [
        "About {loose}: final call is {opt}. Closing the discussion.",
        "ok, for {loose} we settled on {opt}, really this time.",
        "re {loose} -- {person} and I agreed on {opt}, that's what ships.",
    ],
    "rev_c_assistant": [
        "To recap the approach we settled on for {loose}: **{opt}**. The earlier two "
        "options are off the table.",
        "Summary of where {loose} landed:\n\n| | decision |\n|---|---|\n| before | "
        "superseded |\n| now | {opt} |",
    ],
    "rev_c_q": ["Remind me where we landed on {loose}?", "So what's the plan for {loose} now?"],
    "ask_rev": ["What is the current {topic} for {svc}?", "Which {topic} did we end up with for {svc}?"],
    "mh_queue_1": [
        "{svc} consumes from {queue} now, the old topic is retired.",
        "Confirmed that {svc}'s consumer group reads {queue}.",
    ],
    "mh_queue_2": [
        "{queue} has {parts} partitions, which caps consumers at {parts}.",
        "checked the topic config: {queue} partitions={parts}, retention 3d",
    ],
    "ask_mh_queue": ["How many partitions does the topic {svc} consumes from have?"],
    "mh_host_1": ["The {job} job runs on {host} since the cron move.", "{job} got moved to {host}."],
    "mh_host_2": ["{host} is in {region}, physically.", "Reminder: {host} sits in the {region} rack."],
    "ask_mh_host": ["In which region is the machine that runs {job}?"],
    "mh_ticket_1": ["{ticket} traced back to {svc}, postmortem tomorrow.", "Root cause of {ticket}: {svc}."],
    "mh_ticket_2": [
        "{person} is on call for {svc} this rotation.",
        "{svc}'s primary on-call right now: {person}.",
    ],
    "ask_mh_ticket": ["Who is on call for the service behind {ticket}?"],
    "mh_db_1": ["{svc} keeps all its state in {db}.", "{svc} writes to {db}, nothing else."],
    "mh_db_2": ["{db} was at {pct}% disk at {hm}.", "Disk on {db} hit {pct}% this morning."],
    "ask_mh_db": ["How full was the disk of the database {svc} writes to?"],
    "od_start": ["Thinking about {proposal}. Thoughts?", "What do you think about {proposal}?"],
    "od_assist": [
        "A few concerns with that:\n- {c1}\n- {c2}\n\nIf we still do it, start with one "
        "replica and watch it for a week.",
        "I'd be careful. Main risks:\n\n| risk | why |\n|---|---|\n| {c1} | it has bitten us "
        "before |\n| {c2} | hard to undo |",
    ],
    "od_more": ["{person} raised another worry about {loose}: {c3}.", "One more concern on {loose}: {c3}."],
    "ask_od": ["What concerns were raised about {proposal}?", "What are the risks people saw in {proposal}?"],
    "filler_user": [
        "{hm} restarted {svc} again, the warm-up took {n}s this time.",
        "the thing with the queue is back, {queue} is growing again.",
        "any idea why that flaky deploy from before keeps timing out in CI?",
        "{person} says staging {svc} runs with worker_concurrency {c} and batch_size {b}, is that sane?",
        "At {hm} UTC the dashboards for {svc} went blank for a minute.",
        "Can you look at this?\n```\n{ts} ERROR {svc} lease expired on {queue} partition {p}\n{ts2} WARN "
        "{svc} retrying in {n}ms\n```",
        "In our last session you said to check the {queue} DLQ. It has {n} messages.",
        "Should we bump the memory limit of {svc} to {mem} on staging?",
        "{svc} on {host} logs connection resets every {n} seconds.",
        "Is p99 above {ms} ms bad for {svc}? It's the {year} baseline I think.",
        "{person} wants {svc} on {region} too, for the warm standby.",
        "the approach we settled on last time, does it also apply to {svc}?",
        "The session tokens of {svc} expire every {n} minutes, too short?",
    ],
    "filler_assistant": [
        "Looking at the log you pasted, the lease expiries line up with the GC pauses:\n```\n{ts} GC pause "
        "{n}ms\n{ts2} lease expired {queue} p{p}\n```\nThe visibility timeout on staging is {vt}s, so a "
        "pause longer than that hands the message to another worker. I'd lower the batch size first.",
        "For staging I'd compare like this:\n\n| setting | staging | suggested |\n|---|---|---|\n| "
        "worker_concurrency | {c} | {c2} |\n| batch_size | {b} | {b2} |\n\nProd should stay as it is until "
        "the warm-up numbers are stable.",
        "Connection resets every few seconds usually mean an idle timeout on the load balancer shorter "
        "than the client's keep-alive. On {host} check:\n```bash\nss -tan state time-wait | wc -l\n"
        "sysctl net.ipv4.tcp_keepalive_time\n```",
        "A growing {queue} with healthy consumers means producers outpace them; with {p} partitions you "
        "can add consumers up to that number, beyond it they sit idle.",
        "If the warm-up takes {n}s, readiness should stay false for that long; otherwise the pod gets "
        "traffic with a cold cache and the p99 spikes above {ms} ms right after every deploy.",
        "The flaky CI timeout is most likely the integration test that waits on {queue}; it uses a fixed "
        "sleep. Replace it with a poll:\n```python\nfor _ in range(50):\n    if consumer.lag() == 0:\n"
        "        break\n    time.sleep(0.2)\n```",
        "On staging a memory limit of {mem} is fine for {svc}; the prod numbers are different because "
        "batches there are bigger. Watch rss during the warm-up, not after.",
        "Short session tokens mostly cost refresh traffic. At {n} minutes that is a few requests per "
        "user per hour, nothing {svc} can't absorb.",
        "For a warm standby in {region} the open questions are data replication and DNS TTL; compute is "
        "the easy part.\n\n| piece | status |\n|---|---|\n| data | async, minutes behind |\n| DNS | TTL "
        "{n}s |",
    ],
}

OPS_TOPICS: list[dict[str, list[str] | str]] = [
    {"topic": "deploy strategy", "loose": ["that flaky deploy from before", "the deploy thing"],
     "options": ["blue-green with a manual switch", "a canary at 5% for one hour", "rolling, maxSurge 1",
                 "a canary at 25% with automatic rollback"]},
    {"topic": "retry policy", "loose": ["the retry mess", "the retries we argued about"],
     "options": ["3 retries with exponential backoff", "5 retries with full jitter",
                 "2 retries, then straight to the DLQ", "no retries, the caller retries"]},
    {"topic": "alert routing", "loose": ["the alert noise thing", "the paging question"],
     "options": ["page the primary on-call", "post to #ops-alerts only",
                 "page in business hours, Slack otherwise", "page both primary and secondary"]},
    {"topic": "backlog fix", "loose": ["the thing with the queue", "the backlog problem"],
     "options": ["two more consumers", "batch size raised to 500", "the topic split by tenant",
                 "a priority lane for small tenants"]},
    {"topic": "log retention", "loose": ["the retention question", "the logs cost thing"],
     "options": ["7 days hot", "14 days hot, then cold storage", "30 days in cold storage only",
                 "3 days hot, errors kept 90 days"]},
    {"topic": "scaling rule", "loose": ["the autoscaling idea", "the scaling debate"],
     "options": ["scale on CPU at 70%", "scale on queue depth over 1000", "a fixed 6 replicas",
                 "scheduled scale-up at 06:00 UTC"]},
]  # fmt: skip

OPS_PROPOSALS: list[dict[str, list[str] | str]] = [
    {"proposal": "moving {svc} to spot instances", "loose": ["the spot idea"],
     "concerns": ["interruptions in the middle of long jobs", "the warm-up after each reclaim",
                  "no capacity guarantee during sales peaks", "losing in-flight messages on SIGKILL"]},
    {"proposal": "dropping the dead-letter queue of {svc}", "loose": ["killing the DLQ"],
     "concerns": ["poison messages would block the partition", "no way to replay after a bug fix",
                  "the auditors expect failed messages to be kept", "alerts would lose their signal"]},
    {"proposal": "running {svc} with one replica at night", "loose": ["the night-time single replica"],
     "concerns": ["no redundancy during the batch window", "a deploy would mean downtime",
                  "the on-call would get paged for every node drain", "cold caches at 06:00"]},
    {"proposal": "sharing one Redis between {svc} and the session store", "loose": ["the shared Redis plan"],
     "concerns": ["evictions of session keys under load", "one noisy neighbour takes both down",
                  "different persistence settings needed", "key collisions without prefixes"]},
]  # fmt: skip

DESIGN: dict[str, list[str]] = {
    "echo": [
        "Also, {q}",
        "{person} asked me: {q} No rush.",
        "Unrelated: {q} I keep forgetting.",
        "And before I forget, {q}",
    ],
    "loose_svc": ["{loose} for {subject}"],
    "open": [
        "Agenda for today: 1) {table} schema 2) pagination on {endpoint} 3) the {lib} upgrade.",
        "Design review session. Notes from last time are in the doc; starting with {svc}.",
        "Let's continue the API work. {person} joins at {hm}.",
        "Warm-up question before we dive in: is {flag} still at 10%?",
    ],
    "close": [
        "Good, I'll update the design doc.",
        "Enough for this session, thanks.",
        "Let's stop here, {person} reviews the doc tomorrow.",
    ],
    "ack": [
        "Agreed.",
        "Sounds right.",
        "Ok, I'll write that into the doc.",
        "Fine, noted.",
        "Makes sense for v1 at least.",
    ],
    "ddl_q": ["Can you draft the table for {table}?", "What would the DDL for {table} look like?"],
    "ddl": [
        "Draft:\n```sql\nCREATE TABLE {table} (\n  id {idtype} PRIMARY KEY,\n  tenant_id bigint NOT NULL,\n"
        "  {col} {coltype} NOT NULL,\n  created_at timestamptz NOT NULL DEFAULT now()\n);\nCREATE INDEX {idx} "
        "ON {table} (tenant_id, {col});\n```\nThe composite index serves the per-tenant listing; "
        "created_at stays unindexed until we see a query that needs it.",
        "Here's what I'd ship:\n```sql\nCREATE TABLE {table} (\n  id {idtype} PRIMARY KEY,\n  {col} "
        "{coltype} NOT NULL,\n  tenant_id bigint NOT NULL REFERENCES tenants(id)\n);\nCREATE INDEX "
        "{idx} ON {table} ({col});\n```\nKeep {col} NOT NULL from day one; backfilling a constraint "
        "later on a big table is the painful part.",
    ],
    "ask_coltype": ["What type is the {col} column of {table}?", "Which SQL type did we give {table}.{col}?"],
    "ask_idx": [
        "What is the index on {table}'s {col} called?",
        "What's the name of the {col} index on {table}?",
    ],
    "api_q": ["What are the limits on the public endpoints again?", "Table of the rate limits, please."],
    "api": [
        "Current limits:\n\n| endpoint | method | limit per minute |\n|---|---|---|\n{rows}\n\nAll "
        "of them return 429 with Retry-After when exceeded.",
        "From the gateway config:\n\n| endpoint | method | limit per minute |\n|---|---|---|\n{rows}\n",
    ],
    "row": ["| {endpoint} | {method} | {limit} |"],
    "ask_limit": [
        "What is the rate limit on {method} {endpoint}?",
        "How many requests per minute does {method} {endpoint} allow?",
    ],
    "pin": [
        "We pin {lib} to {libver} in {svc}'s lockfile, newer ones break the tests.",
        "{svc} stays on {lib} {libver} for now, the upgrade is blocked.",
    ],
    "ask_pin": ["Which version of {lib} is {svc} pinned to?"],
    "mig": [
        "Migration {mig} is the one that adds {col} to {table}.",
        "{mig} adds the {col} column on {table}.",
    ],
    "ask_mig": ["Which migration adds {col} to {table}?"],
    "paging": [
        "Default page size for {endpoint} is {ps}, max {pmax}.",
        "{endpoint} returns {ps} items per page unless asked, capped at {pmax}.",
    ],
    "paging_q": ["How does {endpoint} page by default?", "What are the page sizes on {endpoint}?"],
    "ask_ps": ["What's the default page size of {endpoint}?"],
    "ask_pmax": ["What's the maximum page size of {endpoint}?"],
    "ev_mig": [
        "{mig} ran on prod just now, took {n}s with no lock waits.",
        "Applied {mig} in production at {hm}.",
    ],
    "plan_mig": ["We run {mig} on prod next week, after the backfill.", "{mig} is still only on staging."],
    "ask_mig_ev": ["When did {mig} run on production?"],
    "ev_flag": ["Flipped {flag} to 100% for all tenants today.", "{flag} is fully on as of this morning."],
    "plan_flag": [
        "{flag} stays at 10% until the error rate settles.",
        "Let's not touch {flag} before Friday.",
    ],
    "ask_flag": ["When did {flag} go to 100%?"],
    "ev_upgrade": [
        "Merged the {lib} upgrade for {svc} (#{pr}).",
        "The {lib} bump in {svc} is merged, #{pr}.",
    ],
    "plan_upgrade": [
        "Someone should try upgrading {lib} in {svc} again.",
        "The {lib} upgrade PR of {svc} is still red.",
    ],
    "ask_upgrade": ["When was the {lib} upgrade of {svc} merged?"],
    "ev_ga": [
        "{endpoint} v2 is GA as of today, docs are published.",
        "We announced GA of the new {endpoint}.",
    ],
    "plan_ga": [
        "GA for {endpoint} v2 depends on the load test.",
        "Not announcing {endpoint} v2 before the docs.",
    ],
    "ask_ga": ["When did {endpoint} v2 go GA?"],
    "rev_a": [
        "First take on {topic} for {subject}: {opt}.",
        "For {subject}, {topic}: I'd go with {opt}.",
        "Let's write {opt} into the doc as the {topic} of {subject}.",
    ],
    "rev_a_reply": [
        "Fine as a starting point; the review may change it.",
        "Ok. The trade-offs are in the doc's appendix.",
    ],
    "rev_b": [
        "Reviewers pushed back, so the {topic} of {subject} becomes {opt}.",
        "Changing the {topic} for {subject} to {opt} after {person}'s comments.",
    ],
    "rev_c": [
        "Last word on {loose}: {opt}. Updating the doc.",
        "For {loose}, we settled on {opt} after all.",
        "{person} signed off: {loose} is {opt}.",
    ],
    "rev_c_assistant": [
        "Decision log after today:\n\n| topic | decision | status |\n|---|---|---|\n| "
        "{loose} | {opt} | final |\n| error format | RFC 7807 problem+json | final |",
        "So the approach we settled on for {loose} is {opt}; the previous two drafts are "
        "marked superseded in the doc.",
    ],
    "rev_c_q": ["Where did we land on {loose}?", "Can you log the final decision on {loose}?"],
    "ask_rev": [
        "What is the current {topic} for {subject}?",
        "Which {topic} did we settle on for {subject}?",
    ],
    "mh_repo_1": ["{endpoint} is served by {svc}.", "Requests to {endpoint} end up in {svc}."],
    "mh_repo_2": ["{svc}'s code lives in {repo}.", "The source of {svc} is in {repo}, not the monorepo."],
    "ask_mh_repo": ["Which repository holds the code behind {endpoint}?"],
    "mh_db_1": ["{table} lives in {db}.", "The {table} table is in {db}."],
    "mh_db_2": ["{db} runs Postgres {pgver}.", "{db} is on Postgres {pgver} since the upgrade."],
    "ask_mh_db": ["Which Postgres version runs the database that holds {table}?"],
    "mh_flag_1": ["{flag} guards the {feature}.", "The {feature} is behind {flag}."],
    "mh_flag_2": ["{person} built the {feature}.", "The {feature} is {person}'s work."],
    "ask_mh_flag": ["Who built the feature behind {flag}?"],
    "od_start": ["What do you think about {proposal}?", "Proposal on the table: {proposal}."],
    "od_assist": [
        "Concerns, roughly in order:\n1. {c1}\n2. {c2}\n\nNone is a blocker alone.",
        "| concern | severity |\n|---|---|\n| {c1} | high |\n| {c2} | medium |",
    ],
    "od_more": ["{person} added a concern about {loose}: {c3}.", "Another point on {loose}: {c3}."],
    "ask_od": ["What concerns were raised about {proposal}?", "Which objections came up against {proposal}?"],
    "filler_user": [
        "Does {endpoint} need a cursor if the page size is {ps}?",
        "{person} asks whether {table} should have a {col} column at all.",
        "The {lib} changelog mentions a breaking change in {libver2}, does it hit {svc}?",
        "Staging ran {mig} in {n}s, is that ok?",
        "Can {flag} default to on for new tenants only?",
        "the approach we settled on last time, does it cover {table} too?",
        "In the last session we skipped the {endpoint} error codes. Now?",
        "What would a partial index on {table} buy us?",
        "Is {method} {endpoint} idempotent in the current draft?",
        "{svc} gets {n} requests per minute on {endpoint} at peak in {year}.",
    ],
    "filler_assistant": [
        "A cursor only pays off when clients page deep. With a page size of {ps} most clients never "
        "pass page three, so offset is fine for the admin views.\n```http\nGET {endpoint}?limit={ps}&"
        "after=eyJpZCI6IDQyfQ\n```",
        "A partial index would help the listing that filters on active rows:\n```sql\nCREATE INDEX "
        "CONCURRENTLY {idx2} ON {table} (tenant_id) WHERE deleted_at IS NULL;\n```\nIt stays small "
        "because most rows are archived.",
        "Comparing the drafts:\n\n| draft | writes | reads |\n|---|---|---|\n| A | one row | join |\n| "
        "B | two rows | no join |\n\nB costs more on writes, which {table} has few of.",
        "For idempotency, accept an Idempotency-Key header and keep it {n} hours:\n```python\nif "
        "store.seen(key):\n    return store.response(key)\n```",
        "{lib} {libver2} changed the default timeout handling; {svc} sets it explicitly, so the risk is "
        "in the tests, not in prod.",
        "On staging {mig} took {n}s because the table is small; on prod expect minutes, so run it with "
        "lock_timeout set:\n```sql\nSET lock_timeout = '3s';\n```",
        "Defaulting {flag} on for new tenants only is a common pattern; store the default at tenant "
        "creation so flipping it later doesn't change existing tenants.",
        "Error codes: keep them stable strings, not numbers.\n\n| code | http |\n|---|---|\n| "
        "not_found | 404 |\n| conflict | 409 |\n| rate_limited | 429 |",
    ],
}

DESIGN_TOPICS: list[dict[str, list[str] | str]] = [
    {"topic": "pagination", "subject": "endpoint", "loose": ["the paging question", "how lists page"],
     "options": ["offset and limit", "opaque cursors", "keyset on (created_at, id)", "page tokens that expire"]},
    {"topic": "id type", "subject": "table", "loose": ["the id debate", "the key format thing"],
     "options": ["bigserial", "UUIDv4", "ULID", "UUIDv7"]},
    {"topic": "partitioning", "subject": "table", "loose": ["the partitioning plan", "how we split the big table"],
     "options": ["monthly on created_at", "by tenant_id list", "hash of tenant_id into 16", "no partitioning"]},
    {"topic": "cache invalidation", "subject": "svc", "loose": ["the caching approach", "the stale reads issue"],
     "options": ["a 60s TTL", "write-through on every update", "events from the outbox", "no cache at all"]},
    {"topic": "delete semantics", "subject": "table", "loose": ["the delete question", "soft vs hard delete"],
     "options": ["a deleted_at column", "an archive table", "hard delete plus audit log", "a status enum"]},
    {"topic": "versioning scheme", "subject": "svc", "loose": ["the versioning discussion", "how we version"],
     "options": ["a /v2 path prefix", "an Accept-Version header", "date-based versions", "no versioning"]},
]  # fmt: skip

DESIGN_PROPOSALS: list[dict[str, list[str] | str]] = [
    {"proposal": "switching {table} to UUID keys", "loose": ["the UUID switch"],
     "concerns": ["index bloat from random inserts", "every foreign key has to change",
                  "URLs get longer for support staff", "the migration needs a dual-write window"]},
    {"proposal": "dual writes during the {table} migration", "loose": ["the dual-write idea"],
     "concerns": ["the two stores drifting apart", "no transaction spans both", "double write latency",
                  "who reconciles when they disagree"]},
    {"proposal": "exposing {svc} over GraphQL", "loose": ["the GraphQL plan"],
     "concerns": ["unbounded query cost", "caching gets harder", "a second schema to maintain",
                  "rate limits per field are unclear"]},
    {"proposal": "dropping v1 of {endpoint}", "loose": ["retiring the old API"],
     "concerns": ["partners still on v1", "the mobile app pins v1 for a year", "support scripts use it",
                  "no usage data per client yet"]},
]  # fmt: skip

FEATURES = ["bulk export", "tax preview", "invoice merge", "tenant switcher", "usage alerts", "refund wizard"]
