"""compaction.summarizer: summaries may be made by another server, key and model than the chat's.

Two fake upstreams on loopback: the chat goes to the first, the summaries to the second.
"""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, load_config
from proxy.fakes.chat import FakeUpstream
from support.client import openai_client
from support.conversations import MODEL, WINDOW, send, synthetic

CLIENT_KEY = "sk-client-key-for-the-chat"


@pytest.fixture
async def second():
    async with FakeUpstream() as fake:
        yield fake


def _settings(**summarizer: object) -> dict:
    return {"models": {MODEL: {"context_window": WINDOW}}, "compaction": {"prepare_percent": 0, "summarizer": summarizer}}


async def _compact_once(proxy) -> None:
    async with openai_client(proxy, CLIENT_KEY) as c:
        turn = await send(c, synthetic("elsewhere"))
    assert turn.status == "summarized", turn


async def test_summaries_go_to_the_second_upstream_with_its_key_and_model(upstream: FakeUpstream, second: FakeUpstream,
                                                                          make_proxy) -> None:
    upstream.window = second.window = WINDOW
    proxy = await make_proxy(upstream.base_url, _settings(base_url=second.base_url, api_key="sk-summaries",
                                                          model="cheap-model"))
    await _compact_once(proxy)
    assert upstream.records("summarizer") == [] and len(upstream.records("chat")) == 1
    assert upstream.records("chat")[0].headers["authorization"] == f"Bearer {CLIENT_KEY}"
    made = second.records("summarizer")
    assert made and second.records("chat") == []
    assert {r.json["model"] for r in made} == {"cheap-model"}
    assert {r.headers.get("authorization") for r in made} == {"Bearer sk-summaries"}


async def test_a_second_server_without_a_key_never_sees_the_clients_key(upstream: FakeUpstream, second: FakeUpstream,
                                                                       make_proxy) -> None:
    upstream.window = second.window = WINDOW
    proxy = await make_proxy(upstream.base_url, _settings(base_url=second.base_url))
    await _compact_once(proxy)
    made = second.records("summarizer")
    assert made and upstream.records("summarizer") == []
    assert {r.json["model"] for r in made} == {MODEL}  # the request's model, by default
    assert all("authorization" not in r.headers for r in made)
    assert all(CLIENT_KEY not in str(r.headers) for r in second.requests)


async def test_by_default_summaries_go_to_the_upstream_with_the_clients_key(upstream: FakeUpstream, make_proxy) -> None:
    upstream.window = WINDOW
    proxy = await make_proxy(upstream.base_url, _settings())
    await _compact_once(proxy)
    made = upstream.records("summarizer")
    assert made and {r.headers["authorization"] for r in made} == {f"Bearer {CLIENT_KEY}"}
    assert {r.json["model"] for r in made} == {MODEL}


async def test_summarizer_model_is_the_older_name_of_summarizer_model(upstream: FakeUpstream, make_proxy) -> None:
    upstream.window = WINDOW
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": WINDOW}},
                                                 "compaction": {"prepare_percent": 0, "summarizer_model": "gpt-4o-mini"}})
    await _compact_once(proxy)
    assert {r.json["model"] for r in upstream.records("summarizer")} == {"gpt-4o-mini"}


def test_config_names_and_conflicts() -> None:
    env = {"COMPACTION_PROXY_COMPACTION__SUMMARIZER__BASE_URL": "http://127.0.0.1:9/v1/",
           "COMPACTION_PROXY_COMPACTION__SUMMARIZER__API_KEY": "sk-env"}
    cfg = load_config(environ=env)
    assert cfg.compaction.summarizer.base_url == "http://127.0.0.1:9/v1"
    assert cfg.compaction.summarizer.api_key is not None and cfg.compaction.summarizer.api_key.get_secret_value() == "sk-env"
    assert "sk-env" not in repr(cfg)
    with pytest.raises(ConfigError, match="summarizer_model is the older name of summarizer.model"):
        load_config(environ={}, overrides={"compaction": {"summarizer_model": "a", "summarizer": {"model": "b"}}})
    with pytest.raises(ConfigError, match="compaction.summarizer.base_url"):
        load_config(environ={}, overrides={"compaction": {"summarizer": {"base_url": "127.0.0.1:9"}}})
