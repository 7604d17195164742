"""Shared fixtures: a fake OpenAI upstream and the real proxy on loopback, real openai clients."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from proxy.fakes.chat import FakeUpstream
from support.client import KEY, openai_client
from support.proxy_server import start_proxy
from support.redis_server import redis_server  # noqa: F401

# Hypothesis's per-example deadline (200 ms) and its check on slow data generation time the
# machine, not the code: a loaded 2-core machine trips them on any test. (Its own "ci" profile,
# loaded when CI is set, drops them too; this one keeps the rest of whichever profile is loaded.)
settings.register_profile("suite", parent=settings.default, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

# Real agent transcripts, copied into the repository (provenance and licence in its README.md).
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Test files sit in folders that mirror the code (protocols/chat, compaction, ops ...), and a few
# import helpers of another by its module name (test_metrics.scrape): every folder is importable.
# (Module names stay unique across folders: pytest imports each test file by its own name.)
for _folder in sorted(Path(__file__).resolve().parent.rglob("test_*.py")):
    if str(_folder.parent) not in sys.path and "e2e" not in _folder.parts:
        sys.path.append(str(_folder.parent))


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
async def upstream():
    fake = FakeUpstream()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def make_proxy():
    """`await make_proxy(upstream_url, {"compaction": {...}}, clock=FakeClock())` -> a running proxy handle."""
    handles = []

    async def factory(upstream_url: str, settings: dict | None = None, **kw):
        h = await start_proxy(upstream_url, settings, **kw)
        handles.append(h)
        return h

    yield factory
    for h in reversed(handles):
        await h.close()


@pytest.fixture
async def proxy(upstream, make_proxy):
    return await make_proxy(upstream.base_url)


@pytest.fixture
async def client_for():
    """`client_for(proxy_or_fake, key)`: a real AsyncOpenAI client (support.client.openai_client),
    closed after the test inside its loop."""
    made = []

    def make(to, key: str = KEY, **kw):
        made.append(openai_client(to, key, **kw))
        return made[-1]

    yield make
    for c in made:
        await c.close()


@pytest.fixture
def client(proxy, client_for):
    return client_for(proxy)


# The quick subset, `scripts/test -m quick`, for the edit-test loop: every test but those of the
# files below, which start processes, replay whole sessions through every protocol or wait on
# real time. They are about four fifths of the suite's time (measured: docs/development.md); CI
# runs everything.
SLOW_FILES = frozenset({
    "test_recall_protocols.py", "test_protocols_careless.py", "test_recall_symbols.py", "test_careless_tiers.py",
    "test_recall_flow.py", "test_wrap.py", "test_inspect.py", "test_workers.py", "test_recall_websocket.py",
    "test_recall_streams.py", "test_scaleout.py", "test_server_limits.py", "test_soak.py", "test_protocols_shared.py",
    "test_loop_bounds.py", "test_crash_recovery.py", "test_socket_limits.py", "test_health_command.py",
    "test_shutdown.py", "test_prepared.py", "test_journal.py", "test_fake_upstream_command.py", "test_config_cli.py",
    "test_dashboard.py", "test_logs.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name not in SLOW_FILES and "e2e" not in item.keywords:
            item.add_marker(pytest.mark.quick)
