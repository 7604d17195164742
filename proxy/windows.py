"""Context windows of well-known models, for requests whose model `models:` does not name.

The figures are the providers' published input windows, as of 2025-09 and for Anthropic's fifth
generation 2026-11 (sources per family below).
Self-hosted servers serve the window they were started with (llama.cpp's `--ctx-size`, Ollama's
`num_ctx`, vLLM's `--max-model-len`), often far below the model's own: set `models:` (or
`models.default`) for them, which always wins over this table. Names are matched without a
provider prefix (`openai/gpt-4o`), a fine-tune prefix (`ft:`) or letter case; the first pattern
that matches the start of the name wins, so longer spellings come first.
"""

from __future__ import annotations

import functools
import logging
import re

DEFAULT_WINDOW = 128_000  # an unknown model's, with one warning per name


log = logging.getLogger("proxy.windows")

_K = 1024
_TABLE: list[tuple[str, int]] = [
    # OpenAI: platform.openai.com/docs/models (model pages, 2025-09)
    (r"gpt-5", 400_000),
    (r"gpt-4\.1", 1_047_576),
    (r"gpt-4\.5", 128_000),
    (r"(chatgpt-)?gpt-4o|chatgpt-4o", 128_000),
    (r"gpt-4-(turbo|\d{4}-preview|vision)", 128_000),
    (r"gpt-4-32k", 32_768),
    (r"gpt-4(-\d{4})?$", 8_192),
    (r"gpt-3\.5-turbo-instruct", 4_096),
    (r"gpt-3\.5-turbo", 16_385),
    (r"gpt-oss", 131_072),
    (r"o1-(mini|preview)", 128_000),
    (r"o[134](-|$)", 200_000),
    # Anthropic: docs.anthropic.com/en/docs/about-claude/models (2025-09; 1M for Sonnet 4 is a beta)
    # The fifth generation's windows are 1M natively (the model overview pages at
    # platform.claude.com/docs/en/models, 2026-11: Fable 5 / 5.1 / 5.2, Mythos, Opus 5 / 5.5,
    # Sonnet 5 / 5.5, Haiku 5.5)
    (r"claude-(fable|mythos|opus|sonnet|haiku)-5", 1_000_000),
    (r"claude-(3|sonnet-4|opus-4|haiku-4|2\.1)", 200_000),
    (r"claude-(2|instant)", 100_000),
    # Google Gemini: ai.google.dev/gemini-api/docs/models, each model's "Input token limit"
    # (read 2026-12: Gemini 3 / 3.1 Pro and Flash, 2.5 Pro / Flash / Flash-Lite, 2.0 Flash: 1,048,576;
    # 1.5 Pro: 2,097,152); Gemma 3 on the API: 131,072 (its model card on ai.google.dev/gemma)
    (r"gemini-1\.5-pro", 2_097_152),
    (r"gemini-(3|2\.5|2\.0|1\.5-flash|flash|pro)", 1_048_576),
    (r"gemma-3", 131_072),
    # Meta Llama: the model cards on huggingface.co/meta-llama (3.1: 2024-07, 3.2: 2024-09,
    # 3.3: 2024-12, 4: 2025-04)
    (r"(meta-)?llama-?4-?scout", 10_000_000),
    (r"(meta-)?llama-?4", 1_000_000),
    (r"(meta-)?llama-?3\.[123]", 128 * _K),
    (r"(meta-)?llama-?3", 8_192),
    (r"(meta-)?llama-?2", 4_096),
    # Qwen: the model cards on huggingface.co/Qwen (native windows, without YaRN scaling;
    # Qwen3-2507: 2025-07)
    (r"qwen3-.*2507", 262_144),
    (r"qwen3", 32_768),
    (r"qwq", 131_072),
    (r"qwen2\.5-1m", 1_010_000),
    (r"qwen2?\.?5?", 32_768),
    # Mistral: docs.mistral.ai/getting-started/models (2025-09)
    (r"codestral-22b|codestral-2405", 32_768),
    (r"codestral", 256_000),
    (r"mistral-(large|medium|nemo)|open-mistral-nemo|ministral|pixtral", 128_000),
    (r"mistral-small-(2501|24b-instruct-2501|3\.0)", 32_768),
    (r"mistral-small", 128_000),
    (r"mixtral-8x22b|open-mixtral-8x22b", 64_000),
    (r"mixtral|open-mixtral", 32_000),
    (r"(open-)?mistral-7b(-instruct)?-v0\.1", 8_192),
    (r"(open-)?mistral-7b", 32_000),
    # DeepSeek: api-docs.deepseek.com (deepseek-chat / deepseek-reasoner: 128K since V3.1,
    # 2025-08) and the model cards on huggingface.co/deepseek-ai
    (r"deepseek-(chat|reasoner|v3|r1|coder-v2|v2\.5)", 128_000),
    (r"deepseek-coder", 16_384),
]
_PATTERNS = [(re.compile(p), w) for p, w in _TABLE]
# Models with a longer window a request opts into (Anthropic: the `context-1m-2025-08-07` beta for
# Sonnet 4 / 4.5 / 4.6 and Opus 4.6, docs.claude.com "Context windows", 2026-02).
_LONG_CONTEXT = [(re.compile(r"claude-(sonnet-4|opus-4-6)"), 1_000_000)]
_MAX_WARNED = 1024  # model names come from clients: the set of warned ones is bounded
_warned: set[str] = set()


def _normal(model: str) -> str:
    return model.lower().rsplit("/", 1)[-1].removeprefix("ft:").replace("_", "-")


@functools.lru_cache(maxsize=4096)
def known_window(model: str) -> int | None:
    """The published window of a well-known model, or None (pure)."""
    name = _normal(model)
    return next((w for rx, w in _PATTERNS if rx.match(name)), None)


def long_window(model: str) -> int | None:
    """The window a request can opt into for this model (pure), or None."""
    name = _normal(model)
    return next((w for rx, w in _LONG_CONTEXT if rx.match(name)), None)


def window_for(model: str, configured: int | None, *, long_context: bool = False) -> int:
    """`configured` (from `models:`), else the table (the opted-into long window when
    `long_context` and the model has one), else DEFAULT_WINDOW with one warning."""
    if configured is not None:
        return configured
    known = (long_context and long_window(model)) or known_window(model)
    if known is not None:
        return known
    if model not in _warned and len(_warned) < _MAX_WARNED:
        _warned.add(model)
        log.warning("model %r: context window unknown (not in models: nor the built-in table); assuming %d tokens",
                    model, DEFAULT_WINDOW)
    return DEFAULT_WINDOW
