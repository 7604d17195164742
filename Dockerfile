# compaction-proxy: an OpenAI-compatible reverse proxy that compacts long agent conversations.
#   docker build -t compaction-proxy .
#   docker run -p 8787:8787 compaction-proxy
FROM python:3.11-slim

# tiktoken reads its encodings from TIKTOKEN_CACHE_DIR; they are fetched below, at build time, so
# the container never downloads anything at start-up (and works without network access).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TIKTOKEN_CACHE_DIR=/opt/tiktoken

COPY pyproject.toml README.md /build/
COPY proxy /build/proxy
COPY prompts /build/prompts
RUN pip install /build \
    && python -c "import tiktoken; [tiktoken.get_encoding(n) for n in ('o200k_base', 'cl100k_base')]" \
    && rm -rf /build

# Non-root; /data is the working directory, where the default SQLite store (compaction-proxy.db)
# lives: mount a volume there to keep summaries across restarts.
RUN useradd --create-home --uid 10001 proxy && mkdir /data && chown proxy:proxy /data
USER proxy
WORKDIR /data

EXPOSE 8787
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('COMPACTION_PROXY_SERVER__PORT', '8787'), timeout=4)"
CMD ["compaction-proxy", "--host", "0.0.0.0"]
