# compaction-proxy: an OpenAI-compatible reverse proxy that compacts long agent conversations.
#   docker build -t compaction-proxy .
#   docker run -p 8787:8787 compaction-proxy
# Base image by tag: pin it by digest too where the registry is reachable (`docker buildx
# imagetools inspect python:3.11-slim`), as FROM python:3.11-slim@sha256:<digest>. The lock below is
# for Python 3.11: a new base's Python needs `deploy/requirements.lock` made again (docs/operations.md).
FROM python:3.11-slim

# tiktoken's encodings ship inside the package (proxy/encoding_files): nothing is downloaded at
# start-up, and the container counts exactly without network access.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies from the lock, each file checked against its hash (a changed or substituted file
# fails the build), the build backend included; then the package itself with no resolution at all.
COPY deploy/requirements.lock /build/requirements.lock
RUN pip install --require-hashes --no-deps -r /build/requirements.lock
COPY pyproject.toml README.md /build/
COPY proxy /build/proxy
COPY prompts /build/prompts
RUN pip install --no-deps --no-build-isolation /build && rm -rf /build

# Non-root. Debian's base-passwd already has a user `proxy` (uid 13), hence `compaction`. /data is
# the working directory, where the default SQLite store (compaction-proxy.db) lives: mount a
# volume there to keep summaries across restarts.
RUN useradd --create-home --uid 10001 --user-group compaction && mkdir /data && chown compaction:compaction /data
USER compaction
WORKDIR /data

EXPOSE 8787
# The serving process's own flags, config file and environment give the address checked (a
# `--port` or a config file's port is followed, not only the environment's).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["compaction-proxy", "health", "--pid", "1"]
CMD ["compaction-proxy", "--host", "0.0.0.0"]
