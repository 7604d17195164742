"""The bill (design.md § The operator's view): what the requests cost through the proxy against what they would have
cost sent directly, both with the provider's prompt cache, from the upstream's own usage.

Through the proxy (measured): each forwarded request's usage (prompt, cached, completion tokens),
plus every summarizer call's usage, priced by its own model.

Directly (estimated; nothing was sent): the client's original request of the same answer.
- prompt tokens: the forwarded request's usage.prompt_tokens plus what the proxy removed
  (x-compaction-tokens-before - x-compaction-tokens-after, the proxy's count);
- cached tokens: the provider would have read from its cache the longest prefix this request
  shares with the previous original request of the same conversation (same model, same tools):
  the proxy's count of the tool schemas and of the leading messages the two have in common, at
  most the prompt, read the way OpenAI's cache reads (nothing under 1024 tokens, then whole steps
  of 128). The first request of a conversation has none. No cache eviction is assumed: the
  estimate is, if anything, kind to the direct path, so the savings shown are not overstated;
- completion tokens: the same as the forwarded request's (the same answer).
A request whose answer reported no usage (a stream without stream_options.include_usage) is not
billed; `unbilled` counts those. Models without a price are billed in tokens only.

Figures cover this process since it started (per conversation: the newest `max_conversations`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

from proxy.exchange import Exchange, Prefix
from proxy.ops.hooks import Hooks, SummarizerCall
from proxy.ops.prices import PRICES_DATE, PriceTable


@dataclass(slots=True)
class Figures:
    requests: int = 0  # billed requests (their answer reported usage)
    unbilled: int = 0  # answers without usage
    unpriced: int = 0  # billed requests or summarizer calls whose model has no price
    summarizer_calls: int = 0
    direct_prompt: int = 0
    direct_cached: int = 0
    proxy_prompt: int = 0
    proxy_cached: int = 0
    completion: int = 0
    summarizer_prompt: int = 0
    summarizer_cached: int = 0
    summarizer_completion: int = 0
    direct: float = 0.0  # US dollars
    proxy: float = 0.0  # US dollars, summarizer calls included
    summarizer: float = 0.0  # the summarizer calls' part of `proxy`

    @property
    def saved(self) -> float:
        return self.direct - self.proxy

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "saved": self.saved}


@dataclass(slots=True)
class _Conversation:
    figures: Figures = field(default_factory=Figures)
    model: str = ""
    last: Prefix | None = None  # the previous original request (for the direct cache estimate)
    last_model: str = ""


CACHE_MIN_TOKENS, CACHE_STEP_TOKENS = 1024, 128  # OpenAI's prompt cache


def cacheable(tokens: int) -> int:
    """How much of a shared prefix of `tokens` the provider's cache serves."""
    if tokens < CACHE_MIN_TOKENS:
        return 0
    return tokens - (tokens - CACHE_MIN_TOKENS) % CACHE_STEP_TOKENS


def shared_prefix_tokens(prev: Prefix | None, prev_model: str, cur: Prefix, model: str) -> int:
    """The proxy's count of what `cur` shares at its start with `prev`: the tool schemas and the
    leading messages the two have in common (0 when the model or the tools differ)."""
    if prev is None or prev_model != model or prev.tools_tokens != cur.tools_tokens:
        return 0
    n = min(len(prev.keys), len(cur.keys))
    if prev.keys[:n] == cur.keys[:n]:  # the usual case: the conversation only grew
        common = n
    else:
        common = next(i for i, (a, b) in enumerate(zip(prev.keys, cur.keys)) if a != b)
    return cur.tools_tokens + sum(cur.tokens[:common])


class Bill(Hooks):
    def __init__(self, prices: PriceTable, max_conversations: int = 1000) -> None:
        self.prices = prices
        self.max_conversations = max_conversations
        self.total = Figures()
        self._conversations: OrderedDict[str, _Conversation] = OrderedDict()

    def _conversation(self, key: str) -> _Conversation:
        c = self._conversations.get(key)
        if c is None:
            c = self._conversations[key] = _Conversation()
            while len(self._conversations) > self.max_conversations:
                self._conversations.popitem(last=False)
        else:
            self._conversations.move_to_end(key)
        return c

    def request_done(self, ex: Exchange) -> None:
        prefix = ex.prefix
        if prefix is None or ex.tokens_before is None:
            return  # not a protocol adapter's request that reached the upstream
        c = self._conversation(ex.conversation)
        model = ex.model
        last, last_model = c.last, c.last_model
        c.model, c.last, c.last_model = model, prefix, model
        u = ex.usage
        if u is None or ex.code != 200:
            c.figures.unbilled += 1
            self.total.unbilled += 1
            return
        after = ex.tokens_after
        prompt, cached, completion = u.prompt, u.cached, u.completion
        direct_prompt = prompt + ex.tokens_before - after if after is not None else prompt
        if direct_prompt < 0:
            direct_prompt = 0
        # The prefix shared with the previous request is looked for only when the provider's cache
        # could serve any of this prompt: cacheable() is 0 under CACHE_MIN_TOKENS whatever it is.
        direct_cached = (cacheable(min(direct_prompt, shared_prefix_tokens(last, last_model, prefix, model)))
                         if direct_prompt >= CACHE_MIN_TOKENS else 0)
        price = self.prices.find(model)
        # (written out for both figures, the costs once: a bill is made on every request)
        for f in (c.figures, self.total):
            f.requests += 1
            f.direct_prompt += direct_prompt
            f.direct_cached += direct_cached
            f.proxy_prompt += prompt
            f.proxy_cached += cached
            f.completion += completion
        if price is None:
            c.figures.unpriced += 1
            self.total.unpriced += 1
        else:
            # (Price.cost written out, the same sums in the same order: two calls cost as much)
            inp, cin, out = price.input, price.cached_input, price.output
            direct = ((direct_prompt - direct_cached) * inp + direct_cached * cin + completion * out) / 1e6
            proxy = ((prompt - cached) * inp + cached * cin + completion * out) / 1e6
            for f in (c.figures, self.total):
                f.direct += direct
                f.proxy += proxy

    def summarizer_done(self, call: SummarizerCall) -> None:
        u = call.tokens
        if u is None:
            return  # failed before an answer: nothing billed
        price = self.prices.find(call.model)
        targets = [self.total]
        if call.conversation:
            targets.append(self._conversation(call.conversation).figures)
        cost = price.cost(u.prompt, u.cached, u.completion) if price is not None else 0.0
        for f in targets:
            f.summarizer_calls += 1
            f.summarizer_prompt += u.prompt
            f.summarizer_cached += u.cached
            f.summarizer_completion += u.completion
            f.summarizer += cost
            f.proxy += cost
            if price is None:
                f.unpriced += 1

    # -- reading -------------------------------------------------------------------------------
    def totals(self) -> Figures:
        return self.total

    def conversation(self, key: str) -> dict[str, Any] | None:
        c = self._conversations.get(key)
        return None if c is None else {"conversation": key, "model": c.model, **c.figures.as_dict()}

    def report(self, limit: int = 50) -> dict[str, Any]:
        recent = list(self._conversations)[-limit:][::-1]
        return {
            "prices_date": PRICES_DATE,
            "total": self.total.as_dict(),
            "conversations": [self.conversation(k) for k in recent],
        }
