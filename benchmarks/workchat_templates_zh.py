# ruff: noqa: RUF001
"""Chinese templates (English identifiers) of `workchat_styles.py`: the same keys and placeholders as
`workchat_templates_en.py`, written as Chinese developers chat (fullwidth punctuation, English terms
left as they are: deploy, rollout, DLQ, p99, warm-up, session)."""

OPS: dict[str, list[str]] = {
    "echo": ["顺便问下，{q}", "{person} 刚问我：{q} 不急。", "岔开一句：{q} 我老是记不住。", "对了，{q}"],
    "loose_svc": ["{subject} 的{loose}"],
    "open": [
        "早。这周又是我值班，{hm} 的时候 {svc} 的告警把我叫醒了。",
        "接着上次 session 的内容继续。{person} 在 {hm} UTC 交接的，没什么急事。",
        "{hm} 了，继续昨天 {svc} 那摊事。",
        "新的 session，老问题。{svc} 的 warm-up 任务还是很慢。",
        "站会 {hm} 开始，先问个小问题。",
    ],
    "close": [
        "好，我交给 {person} 了，谢谢。",
        "这个 session 就到这。",
        "下线了，{hm} UTC 之后告警转给 {person}。",
    ],
    "ack": [
        "收到。",
        "记下了。",
        "嗯，和我看到的一致。",
        "明白，谢谢。",
        "了解。",
        "好，下次出事故时我会记着。",
    ],
    "config": [
        "这是 {svc} 生产环境现在的配置：\n```yaml\n{svc}:\n  worker_concurrency: {c}\n  batch_size: {b}\n"
        "  visibility_timeout: {vt}s\n```",
        "从 helm release 里拿到的 {svc} 生产值：\n```\nworker_concurrency={c}\nbatch_size={b}\n"
        "visibility_timeout={vt}s\n```\n预发的不一样，别看那个。",
        "生产上的 {svc}（{year} 的 chart）：并发 {c}，batch {b}，visibility timeout {vt}s。",
    ],
    "ask_c": ["{svc} 在生产上的 worker 并发是多少？", "生产环境 {svc} 开了几个并发 worker？"],
    "ask_b": ["{svc} 在生产上的 batch size 是多少？", "生产环境里 {svc} 每批处理多少条？"],
    "ask_vt": [
        "{svc} 在生产上的 visibility timeout 是多少？",
        "生产环境 {svc} 的 visibility timeout 设的多长？",
    ],
    "oom_q": ["{svc} 的 pod 从 {hm} 开始一直重启，怎么回事？", "{svc} 为什么一直在抖？"],
    "oom": [
        "这些重启是内存被杀，不是崩溃。你贴的事件里：\n```\n{ts} kubelet {svc}-{pod} OOMKilled "
        "container={svc} limit={mem}\n{ts2} kubelet {svc}-{pod} Back-off restarting failed container\n```\n"
        "warm-up 期间容器正好顶在 {mem} 的上限，要么调高 limit，要么把 warm-up 的缓存缩小。另外看看两次重启之间"
        "堆是不是一直涨，如果是，那就是泄漏而不是配额问题。",
        "是 OOM killer。关键的几行：\n```\n{ts} {svc}-{pod} exit 137 (OOMKilled), memory limit {mem}, rss at "
        "kill {rss}\n```\n所以生产上 {mem} 的上限对现在的 batch 来说太紧了。两个办法：\n\n| 办法 | 风险 |\n"
        "|---|---|\n| 调高 limit | 要加节点 |\n| 缩小 batch | 吞吐下降 |",
    ],
    "ask_mem": [
        "{svc} 的 pod 是在多大的内存上限被杀的？",
        "生产上 {svc} 被 OOMKilled 时的内存 limit 是多少？",
    ],
    "lag": [
        "{hm} UTC：{queue} 的消费积压峰值到了 {lag} 条，后来自己消下去了。",
        "{queue} 的 lag 图在 {hm} 左右冲到 {lag}，告警没响",
        "说一声，{queue} 在 {hm} 堆到了 {lag} 条消息，消费者才追上来",
    ],
    "ask_lag": ["{queue} 的消费积压最高到了多少？", "{queue} 积压的峰值是多少条？"],
    "placement_q": ["迁移完之后各个服务都跑在哪？", "能再列一下主机吗？", "这些都在哪几台机器上，我搞混了。"],
    "placement": [
        "截至今天的部署位置：\n\n| service | host | port |\n|---|---|---|\n{rows}\n\n其余的都还在共享资源池，"
        "预发和这个一样，只是端口不同。",
        "资产清单里是这样：\n\n| service | host | port |\n|---|---|---|\n{rows}\n\nwarm-up 脚本写死了这些端口，"
        "再挪的话记得一起改。",
    ],
    "row": ["| {svc} | {host} | {port} |"],
    "ask_host": ["{svc} 跑在哪台主机上？", "{svc} 部署在哪台机器？"],
    "ask_port": ["{svc} 监听哪个端口？", "{svc} 用的是哪个端口？"],
    "page": [
        "{svc} 的 p99 连续五分钟超过 {ms} ms 就会打电话告警。",
        "把 {svc} 的延迟告警设成 p99 > {ms} ms，呼主值班。",
    ],
    "ask_page": ["{svc} 的 p99 到多少会触发电话告警？", "{svc} 的延迟告警阈值是多少？"],
    "runbook_q": ["怎么重启 {svc} 才不会丢掉正在处理的任务？", "{svc} 安全重启的步骤是什么？"],
    "runbook": [
        "先摘流量再重启：\n```bash\nkubectl -n {ns} scale deploy/{svc} --replicas=0\nkubectl -n {ns} wait "
        "--for=delete pod -l app={svc} --timeout=120s\nkubectl -n {ns} scale deploy/{svc} --replicas={rep}\n```\n"
        "处理中的任务在 visibility timeout 过后会回到队列，不会丢，只是会晚一点。",
        "用 rollout restart，新 pod 通过 readiness 之前旧的不会下掉：\n```bash\nkubectl -n {ns} rollout restart "
        "deploy/{svc}\nkubectl -n {ns} rollout status deploy/{svc}\n```",
    ],
    "ask_ns": ["{svc} 部署在哪个 Kubernetes namespace？", "{svc} 在哪个 namespace 里跑？"],
    "ev_failover": [
        "搞定：{hm} UTC 把 {svc} 切到了 {region}，流量看着正常。",
        "刚把 {svc} 的流量切到 {region}，主集群已经摘空。",
    ],
    "plan_failover": ["哪天应该演练一下把 {svc} 切到 {region}。", "按现在的配额，{svc} 能切到 {region} 吗？"],
    "ask_failover": ["我们是什么时候把 {svc} 切到 {region} 的？"],
    "ev_rollback": [
        "{hm} 把 {svc} 回滚到了 {version}，新版本文件句柄泄漏。",
        "{svc} 已经回到 {version}，回滚一分钟前做完。",
    ],
    "plan_rollback": [
        "{svc} {version} 要是出问题就回滚，镜像还留着。",
        "{svc} 的 {version} 先留着，万一要回滚。",
    ],
    "ask_rollback": ["我们是什么时候把 {svc} 回滚到 {version} 的？"],
    "ev_replay": [
        "刚把 {queue} 的死信重放了，{n} 条都过了。",
        "{queue} 的 DLQ 又空了，{hm} 我把 {n} 条全重放了。",
    ],
    "plan_replay": [
        "{queue} 的 DLQ 有 {n} 条，找时间得重放一下。",
        "先别重放 {queue} 的死信，消费者的 bug 还没修。",
    ],
    "ask_replay": ["我们是什么时候重放 {queue} 的死信的？"],
    "ev_cert": [
        "今天给 {svc} 续了 TLS 证书，离过期还有 {days} 天。",
        "{svc} 的新证书已经生效，旧的 {days} 天后过期。",
    ],
    "plan_cert": ["{svc} 的证书 {days} 天后过期，得有人看一下。", "提醒：{svc} 的证书续期还是手动的。"],
    "ask_cert": ["我们是什么时候给 {svc} 续的 TLS 证书？"],
    "ev_drain": ["{hm} 起 {host} 已经 drain 并 cordon 了，可以换盘了。", "{host} 排空完了，pod 都调度走了。"],
    "plan_drain": ["打内核补丁的话迟早要把 {host} 排空。", "{host} 在下一批要 drain 的节点名单里。"],
    "ask_drain": ["我们是什么时候把 {host} 排空的？"],
    "rev_a": [
        "{svc} 的{topic}，先用{opt}吧。",
        "关于 {svc} 的{topic}，我提议：{opt}。",
        "{svc} 的{topic}我想用{opt}，有意见吗？",
    ],
    "rev_a_reply": ["作为第一步可以，下次出事故后再看。", "我没意见，起步成本最低。"],
    "rev_b": [
        "{svc} 的{topic}改一下：换成{opt}，第一个方案不行。",
        "更新：看了 {hm} 的情况，{svc} 的{topic}改成{opt}。",
    ],
    "rev_c": [
        "关于{loose}：最后定了，{opt}。这个讨论结束。",
        "好，{loose}最后定的是{opt}，这次是真的。",
        "{loose}那件事，我和 {person} 商量好了，{opt}，就这么上线。",
    ],
    "rev_c_assistant": [
        "总结一下{loose}最后定下的方案：**{opt}**。前面两个方案都不考虑了。",
        "{loose}的结论：\n\n| | 决定 |\n|---|---|\n| 之前 | 作废 |\n| 现在 | {opt} |",
    ],
    "rev_c_q": ["提醒我一下，{loose}最后怎么定的？", "那{loose}现在是什么方案？"],
    "ask_rev": ["{svc} 现在的{topic}是什么？", "{svc} 的{topic}最后定的是什么？"],
    "mh_queue_1": ["{svc} 现在消费 {queue}，旧 topic 下线了。", "确认了，{svc} 的消费组读的是 {queue}。"],
    "mh_queue_2": [
        "{queue} 有 {parts} 个分区，所以消费者最多 {parts} 个。",
        "看了 topic 配置：{queue} partitions={parts}，保留 3 天",
    ],
    "ask_mh_queue": ["{svc} 消费的那个 topic 有几个分区？"],
    "mh_host_1": ["cron 迁移之后 {job} 任务跑在 {host} 上。", "{job} 挪到 {host} 了。"],
    "mh_host_2": ["{host} 物理上在 {region}。", "提醒：{host} 在 {region} 的机架里。"],
    "ask_mh_host": ["跑 {job} 的那台机器在哪个区域？"],
    "mh_ticket_1": ["{ticket} 查到是 {svc} 的问题，明天复盘。", "{ticket} 的根因：{svc}。"],
    "mh_ticket_2": ["这一轮 {svc} 的值班是 {person}。", "{svc} 现在的主值班：{person}。"],
    "ask_mh_ticket": ["{ticket} 背后那个服务现在谁值班？"],
    "mh_db_1": ["{svc} 的状态全在 {db} 里。", "{svc} 只写 {db}。"],
    "mh_db_2": ["{hm} 的时候 {db} 磁盘到了 {pct}%。", "今天早上 {db} 的磁盘用到了 {pct}%。"],
    "ask_mh_db": ["{svc} 写的那个数据库磁盘用了多少？"],
    "od_start": ["我在考虑{proposal}，你怎么看？", "{proposal}这个想法怎么样？"],
    "od_assist": [
        "有几个顾虑：\n- {c1}\n- {c2}\n\n真要做的话，先上一个副本观察一周。",
        "我会谨慎一些。主要风险：\n\n| 风险 | 原因 |\n|---|---|\n| {c1} | 以前踩过坑 |\n| {c2} | 很难回退 |",
    ],
    "od_more": ["{person} 对{loose}又提了一个担心：{c3}。", "关于{loose}还有一个顾虑：{c3}。"],
    "ask_od": ["大家对{proposal}提了哪些顾虑？", "{proposal}有哪些风险被提出来？"],
    "filler_user": [
        "{hm} 又重启了一次 {svc}，这次 warm-up 花了 {n} 秒。",
        "队列那个问题又来了，{queue} 又在涨。",
        "之前那个不稳定的 deploy 为什么在 CI 里老是超时？",
        "{person} 说预发的 {svc} 用的是 worker_concurrency {c}、batch_size {b}，合理吗？",
        "{hm} UTC {svc} 的看板空白了一分钟。",
        "帮我看下这个？\n```\n{ts} ERROR {svc} lease expired on {queue} partition {p}\n{ts2} WARN {svc} "
        "retrying in {n}ms\n```",
        "上个 session 你说让我查 {queue} 的 DLQ，里面有 {n} 条。",
        "预发上要不要把 {svc} 的内存上限调到 {mem}？",
        "{host} 上的 {svc} 每 {n} 秒就报一次 connection reset。",
        "{svc} 的 p99 超过 {ms} ms 算严重吗？好像是 {year} 年的基线。",
        "{person} 想在 {region} 也放一份 {svc}，做温备。",
        "上次定下来的那个方案，对 {svc} 也适用吗？",
        "{svc} 的 session token 每 {n} 分钟过期，是不是太短了？",
    ],
    "filler_assistant": [
        "从你贴的日志看，lease 过期和 GC 停顿是对得上的：\n```\n{ts} GC pause {n}ms\n{ts2} lease expired "
        "{queue} p{p}\n```\n预发上的 visibility timeout 是 {vt}s，停顿超过这个时间消息就会被别的 worker 拿走。"
        "我会先把 batch size 调小。",
        "预发我会这样对比：\n\n| 配置 | 预发 | 建议 |\n|---|---|---|\n| worker_concurrency | {c} | {c2} |\n"
        "| batch_size | {b} | {b2} |\n\n生产先别动，等 warm-up 的数据稳定再说。",
        "每隔几秒一次 connection reset，通常是负载均衡的空闲超时比客户端 keep-alive 短。在 {host} 上查一下：\n"
        "```bash\nss -tan state time-wait | wc -l\nsysctl net.ipv4.tcp_keepalive_time\n```",
        "{queue} 在涨而消费者都健康，说明生产速度超过了消费速度；有 {p} 个分区，消费者最多加到这个数，再多就闲着了。",
        "warm-up 要 {n} 秒的话，这段时间 readiness 应该一直是 false；不然 pod 带着冷缓存接流量，每次发布后 p99 "
        "都会冲过 {ms} ms。",
        "CI 里那个不稳定的超时多半是等 {queue} 的集成测试，它用了固定的 sleep。改成轮询：\n```python\n"
        "for _ in range(50):\n    if consumer.lag() == 0:\n        break\n    time.sleep(0.2)\n```",
        "预发上 {svc} 用 {mem} 的内存上限没问题；生产数值不同是因为那边 batch 更大。看 warm-up 期间的 rss，"
        "不是之后的。",
        "session token 短主要是多了刷新请求。{n} 分钟的话每个用户每小时多几个请求，{svc} 扛得住。",
        "在 {region} 做温备，难点是数据复制和 DNS TTL，算力反而简单。\n\n| 部分 | 状态 |\n|---|---|\n"
        "| 数据 | 异步，落后几分钟 |\n| DNS | TTL {n}s |",
    ],
}

OPS_TOPICS: list[dict[str, list[str] | str]] = [
    {"topic": "发布策略", "loose": ["之前那个不稳定的 deploy", "发布那件事"],
     "options": ["蓝绿发布、手动切换", "5% 金丝雀跑一小时", "滚动发布，maxSurge 1", "25% 金丝雀加自动回滚"]},
    {"topic": "重试策略", "loose": ["重试那摊事", "我们争论过的重试"],
     "options": ["指数退避重试 3 次", "全抖动重试 5 次", "重试 2 次后直接进 DLQ", "不重试，由调用方重试"]},
    {"topic": "告警路由", "loose": ["告警太吵的问题", "呼叫的问题"],
     "options": ["呼主值班", "只发到 #ops-alerts", "工作时间打电话，其余时间发 Slack", "主备值班一起呼"]},
    {"topic": "积压的解决办法", "loose": ["队列那个问题", "积压的问题"],
     "options": ["再加两个消费者", "batch size 调到 500", "按租户拆 topic", "给小租户开一条优先通道"]},
    {"topic": "日志保留策略", "loose": ["日志保留的问题", "日志成本那件事"],
     "options": ["热存储 7 天", "热存储 14 天再转冷存储", "只在冷存储留 30 天", "热存储 3 天，错误日志留 90 天"]},
    {"topic": "扩缩容规则", "loose": ["自动扩容的想法", "扩容的争论"],
     "options": ["CPU 70% 时扩容", "队列深度超过 1000 时扩容", "固定 6 个副本", "每天 06:00 UTC 定时扩容"]},
]  # fmt: skip

OPS_PROPOSALS: list[dict[str, list[str] | str]] = [
    {"proposal": "把 {svc} 迁到 spot 实例", "loose": ["spot 的想法"],
     "concerns": ["长任务跑到一半被中断", "每次回收后都要重新 warm-up", "大促高峰时没有容量保证", "SIGKILL 时会丢正在处理的消息"]},
    {"proposal": "去掉 {svc} 的死信队列", "loose": ["砍掉 DLQ"],
     "concerns": ["毒消息会卡住分区", "修完 bug 后没法重放", "审计要求保留失败的消息", "告警会失去信号"]},
    {"proposal": "夜里 {svc} 只跑一个副本", "loose": ["夜间单副本"],
     "concerns": ["批处理窗口没有冗余", "发布就意味着停机", "每次节点排空值班都会被呼", "06:00 缓存是冷的"]},
    {"proposal": "让 {svc} 和 session 存储共用一个 Redis", "loose": ["共用 Redis 的方案"],
     "concerns": ["高负载时 session 键被淘汰", "一个吵闹的邻居会把两个都拖垮", "需要不同的持久化配置", "没有前缀会键冲突"]},
]  # fmt: skip

DESIGN: dict[str, list[str]] = {
    "echo": ["另外，{q}", "{person} 问我：{q} 不着急。", "题外话：{q} 我总记不住。", "趁我还记得：{q}"],
    "loose_svc": ["{subject} 的{loose}"],
    "open": [
        "今天的议程：1) {table} 的表结构 2) {endpoint} 的分页 3) {lib} 升级。",
        "设计评审 session。上次的记录在文档里，先从 {svc} 开始。",
        "继续 API 的工作，{person} {hm} 加入。",
        "进正题之前先热个身：{flag} 还是 10% 吗？",
    ],
    "close": ["好，我去更新设计文档。", "这个 session 就到这，谢谢。", "先到这，{person} 明天看文档。"],
    "ack": ["同意。", "没问题。", "好，我写进文档。", "行，记下了。", "至少 v1 这样是合理的。"],
    "ddl_q": ["能帮我起草一下 {table} 的表吗？", "{table} 的 DDL 大概长什么样？"],
    "ddl": [
        "草稿：\n```sql\nCREATE TABLE {table} (\n  id {idtype} PRIMARY KEY,\n  tenant_id bigint NOT NULL,\n  {col} "
        "{coltype} NOT NULL,\n  created_at timestamptz NOT NULL DEFAULT now()\n);\nCREATE INDEX {idx} ON {table} "
        "(tenant_id, {col});\n```\n复合索引服务按租户的列表查询；created_at 先不加索引，等真有查询需要再说。",
        "我会这样上线：\n```sql\nCREATE TABLE {table} (\n  id {idtype} PRIMARY KEY,\n  {col} {coltype} NOT NULL,\n"
        "  tenant_id bigint NOT NULL REFERENCES tenants(id)\n);\nCREATE INDEX {idx} ON {table} ({col});\n```\n"
        "{col} 从第一天就设 NOT NULL；大表以后再回填约束才是最痛苦的。",
    ],
    "ask_coltype": ["{table} 的 {col} 列是什么类型？", "{table}.{col} 我们给的是哪个 SQL 类型？"],
    "ask_idx": ["{table} 上 {col} 的索引叫什么？", "{table} 的 {col} 索引名是什么？"],
    "api_q": ["公开接口的限流是多少来着？", "给我一张限流的表。"],
    "api": [
        "现在的限流：\n\n| endpoint | method | 每分钟上限 |\n|---|---|---|\n{rows}\n\n超过后都返回 429 和 Retry-After。",
        "网关配置里是：\n\n| endpoint | method | 每分钟上限 |\n|---|---|---|\n{rows}\n",
    ],
    "row": ["| {endpoint} | {method} | {limit} |"],
    "ask_limit": ["{method} {endpoint} 的限流是多少？", "{method} {endpoint} 每分钟允许多少个请求？"],
    "pin": [
        "{svc} 的 lockfile 里把 {lib} 锁在 {libver}，新版本会把测试搞挂。",
        "{svc} 暂时停在 {lib} {libver}，升级被卡住了。",
    ],
    "ask_pin": ["{svc} 锁定的 {lib} 是哪个版本？"],
    "mig": ["给 {table} 加 {col} 的是 {mig} 这个迁移。", "{mig} 在 {table} 上加了 {col} 列。"],
    "ask_mig": ["哪个迁移给 {table} 加了 {col}？"],
    "paging_q": ["{endpoint} 默认怎么分页？", "{endpoint} 的分页大小是多少？"],
    "paging": [
        "{endpoint} 默认每页 {ps} 条，最大 {pmax}。",
        "不指定的话 {endpoint} 每页返回 {ps} 条，上限 {pmax}。",
    ],
    "ask_ps": ["{endpoint} 默认每页多少条？"],
    "ask_pmax": ["{endpoint} 每页最多多少条？"],
    "ev_mig": ["{mig} 刚在生产跑完，用了 {n} 秒，没有锁等待。", "{hm} 在生产执行了 {mig}。"],
    "plan_mig": ["{mig} 下周等回填完再在生产跑。", "{mig} 现在还只在预发上。"],
    "ask_mig_ev": ["{mig} 是什么时候在生产上跑的？"],
    "ev_flag": ["今天把 {flag} 对所有租户开到了 100%。", "从今天早上起 {flag} 全量打开了。"],
    "plan_flag": ["错误率稳定之前 {flag} 先保持 10%。", "周五之前别动 {flag}。"],
    "ask_flag": ["{flag} 是什么时候开到 100% 的？"],
    "ev_upgrade": ["{svc} 的 {lib} 升级合进去了（#{pr}）。", "{svc} 里 {lib} 的版本升级已合并，#{pr}。"],
    "plan_upgrade": ["得有人再试试升级 {svc} 的 {lib}。", "{svc} 升级 {lib} 的 PR 还是红的。"],
    "ask_upgrade": ["{svc} 的 {lib} 升级是什么时候合并的？"],
    "ev_ga": ["{endpoint} v2 今天正式 GA，文档已发布。", "我们宣布了新 {endpoint} 的 GA。"],
    "plan_ga": ["{endpoint} v2 能不能 GA 要看压测。", "文档没好之前不宣布 {endpoint} v2。"],
    "ask_ga": ["{endpoint} v2 是什么时候 GA 的？"],
    "rev_a": [
        "{subject} 的{topic}，第一版想法：{opt}。",
        "{subject} 的{topic}我倾向于{opt}。",
        "先把{opt}写进文档，作为 {subject} 的{topic}。",
    ],
    "rev_a_reply": ["作为起点可以，评审可能会改。", "好，取舍写在文档附录里了。"],
    "rev_b": [
        "评审有反对意见，所以 {subject} 的{topic}改成{opt}。",
        "根据 {person} 的意见，{subject} 的{topic}改成{opt}。",
    ],
    "rev_c": [
        "{loose}最终结论：{opt}。我去更新文档。",
        "{loose}最后还是定了{opt}。",
        "{person} 批了：{loose}就是{opt}。",
    ],
    "rev_c_assistant": [
        "今天之后的决策记录：\n\n| 议题 | 决定 | 状态 |\n|---|---|---|\n| {loose} | {opt} | 最终 |\n"
        "| 错误格式 | RFC 7807 problem+json | 最终 |",
        "所以{loose}定下来的方案是{opt}；前两版在文档里标成已作废。",
    ],
    "rev_c_q": ["{loose}最后定在哪了？", "能把{loose}的最终决定记一下吗？"],
    "ask_rev": ["{subject} 现在的{topic}是什么？", "{subject} 的{topic}最后定的是什么？"],
    "mh_repo_1": ["{endpoint} 由 {svc} 提供。", "打到 {endpoint} 的请求最后进了 {svc}。"],
    "mh_repo_2": ["{svc} 的代码在 {repo}。", "{svc} 的源码在 {repo}，不在 monorepo 里。"],
    "ask_mh_repo": ["{endpoint} 背后的代码在哪个仓库？"],
    "mh_db_1": ["{table} 在 {db} 里。", "{table} 这张表放在 {db}。"],
    "mh_db_2": ["{db} 跑的是 Postgres {pgver}。", "升级以后 {db} 是 Postgres {pgver}。"],
    "ask_mh_db": ["存 {table} 的那个数据库跑的是哪个 Postgres 版本？"],
    "mh_flag_1": ["{flag} 控制的是{feature}。", "{feature}藏在 {flag} 后面。"],
    "mh_flag_2": ["{feature}是 {person} 做的。", "{feature}是 {person} 的活。"],
    "ask_mh_flag": ["{flag} 背后的功能是谁做的？"],
    "od_start": ["你觉得{proposal}怎么样？", "有个提议：{proposal}。"],
    "od_assist": [
        "顾虑大致按顺序：\n1. {c1}\n2. {c2}\n\n单独哪一条都不算阻塞。",
        "| 顾虑 | 严重程度 |\n|---|---|\n| {c1} | 高 |\n| {c2} | 中 |",
    ],
    "od_more": ["{person} 对{loose}补充了一个顾虑：{c3}。", "{loose}还有一点：{c3}。"],
    "ask_od": ["大家对{proposal}提了哪些顾虑？", "{proposal}遇到了哪些反对意见？"],
    "filler_user": [
        "每页 {ps} 条的话 {endpoint} 还需要游标吗？",
        "{person} 问 {table} 到底要不要 {col} 这一列。",
        "{lib} 的 changelog 说 {libver2} 有破坏性变更，会影响 {svc} 吗？",
        "预发跑 {mig} 用了 {n} 秒，正常吗？",
        "{flag} 能不能只对新租户默认打开？",
        "上次定下来的那个方案，{table} 也适用吗？",
        "上个 session 我们跳过了 {endpoint} 的错误码，现在讨论？",
        "在 {table} 上加部分索引能带来什么？",
        "现在的草案里 {method} {endpoint} 是幂等的吗？",
        "{year} 年高峰时 {svc} 在 {endpoint} 上每分钟有 {n} 个请求。",
    ],
    "filler_assistant": [
        "游标只有在客户端翻得很深时才划算。每页 {ps} 条的话大多数客户端翻不过第三页，管理后台用 offset 就够了。\n"
        "```http\nGET {endpoint}?limit={ps}&after=eyJpZCI6IDQyfQ\n```",
        "部分索引对只查有效行的列表有帮助：\n```sql\nCREATE INDEX CONCURRENTLY {idx2} ON {table} (tenant_id) WHERE "
        "deleted_at IS NULL;\n```\n因为大部分行都归档了，索引会很小。",
        "对比几版草案：\n\n| 草案 | 写 | 读 |\n|---|---|---|\n| A | 一行 | 要 join |\n| B | 两行 | 不用 join |\n\n"
        "B 写入成本高，但 {table} 写得很少。",
        "幂等的话，接收 Idempotency-Key 头并保留 {n} 小时：\n```python\nif store.seen(key):\n    return "
        "store.response(key)\n```",
        "{lib} {libver2} 改了默认超时的处理；{svc} 是显式设置的，所以风险在测试里，不在生产。",
        "预发上 {mig} 用了 {n} 秒是因为表小；生产上要按分钟算，所以设好 lock_timeout 再跑：\n```sql\n"
        "SET lock_timeout = '3s';\n```",
        "只对新租户默认打开 {flag} 是常见做法；在创建租户时把默认值存下来，以后再改就不会影响老租户。",
        "错误码用稳定的字符串，不要用数字。\n\n| code | http |\n|---|---|\n| not_found | 404 |\n| conflict | 409 |\n"
        "| rate_limited | 429 |",
    ],
}

DESIGN_TOPICS: list[dict[str, list[str] | str]] = [
    {"topic": "分页方式", "subject": "endpoint", "loose": ["分页的问题", "列表怎么翻页"],
     "options": ["offset 加 limit", "不透明游标", "基于 (created_at, id) 的 keyset", "会过期的 page token"]},
    {"topic": "主键类型", "subject": "table", "loose": ["主键的争论", "键格式那件事"],
     "options": ["bigserial", "UUIDv4", "ULID", "UUIDv7"]},
    {"topic": "分区方案", "subject": "table", "loose": ["分区的方案", "大表怎么拆"],
     "options": ["按 created_at 每月分区", "按 tenant_id 列表分区", "按 tenant_id 哈希成 16 个", "不分区"]},
    {"topic": "缓存失效策略", "subject": "svc", "loose": ["缓存的做法", "读到旧数据的问题"],
     "options": ["60 秒 TTL", "每次更新时写穿", "靠 outbox 发事件失效", "干脆不缓存"]},
    {"topic": "删除语义", "subject": "table", "loose": ["删除的问题", "软删还是硬删"],
     "options": ["加 deleted_at 列", "挪到归档表", "硬删加审计日志", "用状态枚举"]},
    {"topic": "版本方案", "subject": "svc", "loose": ["版本的讨论", "怎么做版本"],
     "options": ["/v2 路径前缀", "Accept-Version 头", "按日期的版本", "不做版本"]},
]  # fmt: skip

DESIGN_PROPOSALS: list[dict[str, list[str] | str]] = [
    {"proposal": "把 {table} 换成 UUID 主键", "loose": ["换 UUID 的事"],
     "concerns": ["随机插入导致索引膨胀", "所有外键都得改", "客服用的 URL 变长", "迁移需要一段双写窗口"]},
    {"proposal": "{table} 迁移期间双写", "loose": ["双写的想法"],
     "concerns": ["两边数据慢慢不一致", "没有跨两边的事务", "写延迟翻倍", "不一致时谁来对账"]},
    {"proposal": "用 GraphQL 暴露 {svc}", "loose": ["GraphQL 的方案"],
     "concerns": ["查询成本没有上限", "缓存更难做", "要多维护一套 schema", "按字段限流说不清"]},
    {"proposal": "下线 {endpoint} 的 v1", "loose": ["下线旧 API"],
     "concerns": ["合作方还在用 v1", "移动端一年内都锁定 v1", "客服脚本在用", "还没有按客户端的用量数据"]},
]  # fmt: skip

FEATURES = ["批量导出", "税费预览", "发票合并", "租户切换", "用量提醒", "退款向导"]
