# context-gateway image: the gateway on the embedded defaults (SQLite + local data under /srv/data).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

# jemalloc in place of glibc's malloc: as little memory held as glibc with the gateway's fixed mmap
# threshold, without that threshold's ~12 % on the background jobs (BENCHMARKS.md, issue 29).
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(ls /usr/lib/*-linux-gnu/libjemalloc.so.2)" /usr/local/lib/libjemalloc.so.2
ENV LD_PRELOAD=/usr/local/lib/libjemalloc.so.2

WORKDIR /build
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN pip install . && rm -rf /build

RUN useradd --create-home --uid 10001 gateway && mkdir -p /srv/data && chown -R gateway /srv
USER gateway
WORKDIR /srv
VOLUME ["/srv/data"]
EXPOSE 8080

# Mount a config and point GATEWAY_CONFIG at it, e.g.
#   docker run -p 8080:8080 -v $PWD/config.yaml:/etc/context-gateway/config.yaml \
#     -e GATEWAY_CONFIG=/etc/context-gateway/config.yaml -e OPENAI_API_KEY context-gateway
# Without a config, the gateway forwards to OpenAI with each client's own key.
CMD ["context-gateway", "serve", "--host", "0.0.0.0", "--port", "8080"]
