# compaction-proxy: an OpenAI-compatible reverse proxy that compacts long agent conversations.
#   docker build -t compaction-proxy .
#   docker run -p 8787:8787 compaction-proxy
FROM python:3.11-slim

# tiktoken's encodings ship inside the package (proxy/encoding_files): nothing is downloaded at
# build time or at start-up, and the container counts exactly without network access.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md /build/
COPY proxy /build/proxy
COPY prompts /build/prompts
RUN pip install /build && rm -rf /build

# Non-root. Debian's base-passwd already has a user `proxy` (uid 13), hence `compaction`. /data is
# the working directory, where the default SQLite store (compaction-proxy.db) lives: mount a
# volume there to keep summaries across restarts.
RUN useradd --create-home --uid 10001 --user-group compaction && mkdir /data && chown compaction:compaction /data
USER compaction
WORKDIR /data

EXPOSE 8787
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('COMPACTION_PROXY_SERVER__PORT', '8787'), timeout=4)"
CMD ["compaction-proxy", "--host", "0.0.0.0"]
