"""Known context windows (proxy/windows.py): used when `models:` does not name the model."""

from __future__ import annotations

import logging

import pytest

from proxy.config import Config
from proxy.fakes.chat import FakeUpstream
from proxy.windows import known_window
from support.client import chat
from support.compaction_helpers import chat_history, proxy_count


@pytest.mark.parametrize(("model", "window"), [
    ("gpt-4o", 128_000), ("openai/gpt-4o-mini", 128_000), ("ft:gpt-4o-mini:org::abc", 128_000),
    ("gpt-4.1-mini", 1_047_576), ("gpt-5", 400_000), ("o3-mini", 200_000), ("o1-mini", 128_000),
    ("gpt-4", 8_192), ("gpt-4-0613", 8_192), ("gpt-4-turbo", 128_000), ("gpt-3.5-turbo", 16_385),
    ("claude-3-5-sonnet-20241022", 200_000), ("claude-sonnet-4-20250514", 200_000), ("claude-2.0", 100_000),
    ("claude-fable-5-1", 1_000_000), ("claude-opus-5-5", 1_000_000), ("claude-haiku-5-5", 1_000_000),
    ("anthropic/claude-sonnet-5-5-20261001", 1_000_000), ("claude-haiku-4-5", 200_000),
    ("llama3.1:8b", 128 * 1024), ("meta-llama/Llama-3.3-70B-Instruct", 128 * 1024),
    ("Meta-Llama-3-8B-Instruct", 8_192), ("llama-2-7b-chat", 4_096),
    ("qwen2.5:7b", 32_768), ("Qwen/Qwen3-8B", 32_768), ("qwen3-235b-a22b-instruct-2507", 262_144),
    ("mistral-large-latest", 128_000), ("codestral-latest", 256_000), ("mixtral-8x7b-instruct", 32_000),
    ("deepseek-chat", 128_000), ("deepseek-reasoner", 128_000), ("deepseek-coder-6.7b-instruct", 16_384),
])
def test_the_table_knows_common_families(model: str, window: int) -> None:
    assert known_window(model) == window


@pytest.mark.parametrize("model", ["smollm2", "my-finetune", "codellama-7b", ""])
def test_unknown_names_are_not_guessed(model: str) -> None:
    assert known_window(model) is None


def test_models_config_wins_over_the_table_and_unknown_models_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="proxy.windows")
    named = Config.model_validate({"models": {"gpt-4": {"context_window": 32_000}}})
    assert named.context_window("gpt-4") == 32_000
    assert named.context_window("claude-3-haiku") == 200_000
    # models.default is the operator's word for every model not named: it wins over the table
    # (a self-hosted server serves the window it was started with).
    assert Config.model_validate({"models": {"default": {"context_window": 8192}}}).context_window("llama3.1:8b") == 8192
    cfg = Config()
    assert [cfg.context_window("unknown-model-a") for _ in range(3)] == [128_000] * 3
    assert cfg.context_window("unknown-model-b") == 128_000
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert "'unknown-model-a'" in warnings[0] and "'unknown-model-b'" in warnings[1]


async def test_a_known_small_window_compacts_without_config(upstream: FakeUpstream, make_proxy, client_for) -> None:
    """gpt-4's 8192 tokens come from the table: a 7.5k-token request is past its threshold (6964)."""
    proxy = await make_proxy(upstream.base_url, {"compaction": {"prepare_percent": 0}})
    history = chat_history(13, 190)
    assert 6964 < proxy_count({"model": "gpt-4", "messages": history}) < 8192
    c = client_for(proxy)
    assert (await chat(c, history, model="gpt-4")).status == "summarized"
    # the same request for a 128k model is left alone
    assert (await chat(c, history, model="gpt-4o")).status == "none"
