"""Shared fixtures: a fake OpenAI upstream and the real proxy on loopback, real openai clients."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Offline machine: tiktoken reads its encodings from the shared cache (tests never download).
_SHARED = Path(__file__).resolve().parents[2] / "shared" / "tiktoken"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _SHARED.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_SHARED)

from proxy.fake_upstream import FakeUpstream  # noqa: E402
from support.proxy_server import start_proxy  # noqa: E402
from support.redis_server import redis_server  # noqa: E402,F401

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"shared fixtures not found at {FIXTURES}")
    return FIXTURES


@pytest.fixture
async def upstream():
    fake = FakeUpstream()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def make_proxy():
    """`await make_proxy(upstream_url, {"compaction": {...}})` -> a running proxy handle."""
    handles = []

    async def factory(upstream_url: str, settings: dict | None = None):
        h = await start_proxy(upstream_url, settings)
        handles.append(h)
        return h

    yield factory
    for h in reversed(handles):
        await h.close()


@pytest.fixture
async def proxy(upstream, make_proxy):
    return await make_proxy(upstream.base_url)


@pytest.fixture
def client(proxy):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=proxy.base_url, api_key="sk-test-key", max_retries=0)
