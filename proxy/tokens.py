"""Counting tokens the way the upstream will, cheaply enough for every request.

tiktoken per model family (design.md § Counting tokens), chat-format overhead per message, tool schemas counted, and a
per-message cache keyed by the message's digest so a long history is encoded once, not on every
request. The encodings ship inside the package (proxy/encodings.py), so counting needs no network;
only a broken install (those files missing or damaged, and no tiktoken cache) makes the counter
estimate bytes/4, and it says so once.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterable

from proxy import jsonbody
from proxy.farm import farm
from proxy.identifiers import scanned

from .encodings import get_encoding

log = logging.getLogger("proxy.tokens")

MESSAGE_OVERHEAD = 3  # <|start|>role ... <|end|> framing per message
REPLY_OVERHEAD = 3  # the assistant reply is primed with <|start|>assistant<|message|>
IMAGE_TOKENS = 765  # a high-detail 512px tile image: a fixed estimate
OTHER_PART_TOKENS = 256  # audio, files: we cannot see inside, count a fixed amount

O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "chatgpt-4o", "gpt-oss")
_O_SERIES = re.compile(r"o\d")  # o1, o3-mini, o4-mini ... and whatever o-model comes next


@functools.lru_cache(maxsize=1024)  # pure; asked on every request, of a few model names (bounded: clients name them)
def encoding_name_for(model: str) -> str:
    """o200k_base for the gpt-4o generation and later, cl100k_base for the rest (an approximation).

    Provider prefixes ("openai/gpt-4o") and fine-tune names ("ft:gpt-4o-mini:org::id") count as
    their base model.
    """
    m = model.lower().rsplit("/", 1)[-1].removeprefix("ft:")
    return "o200k_base" if m.startswith(O200K_PREFIXES) or _O_SERIES.match(m) else "cl100k_base"


# Counts cached per process, one per distinct message (or tool list): 130-250 bytes an entry, so
# at most about 8 MiB. Enough for the histories of a hundred or more long conversations; a miss costs
# one message's tokenization.
CACHE_SIZE = 32_768
# A text longer than this (a million tokens and more at the rate of prose, code or logs: the
# largest windows) is counted by its head and tail, scaled to its length: counting all of it cost
# ~0.6 s of CPU a MB (a 40 MB body: 25 s), and no window holds it whatever its exact count.
ESTIMATE_CHARS = 1 << 22


class TokenCounter:
    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self._encodings: dict[str, Any] = {}
        self._failed: set[str] = set()
        self._cache: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self._cache_size = cache_size
        self.estimating = False

    # -- encodings ---------------------------------------------------------------------------
    def load(self, names: Iterable[str] = ("o200k_base", "cl100k_base")) -> bool:
        """Load encodings up front (start-up). Returns False, after one warning, when none loads."""
        for name in names:
            self._get_encoding(name)
        if not self._encodings:
            self.estimating = True
            log.warning(
                "no tiktoken encoding could be loaded (the package's proxy/encoding_files is missing or "
                "damaged, and TIKTOKEN_CACHE_DIR=%s has none); token counts are estimated as bytes/4",
                os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>"),
            )
        return bool(self._encodings)

    def _get_encoding(self, name: str) -> Any:
        """The named encoding; if it cannot be loaded, any loaded one (another family's encoding is
        a far better estimate than bytes/4), else None. A failed load is not retried."""
        enc = self._encodings.get(name)
        if enc is None and name not in self._failed:
            enc = self._load(name)
        if enc is None:
            enc = next(iter(self._encodings.values()), None)
        return enc

    def _load(self, name: str) -> Any:
        try:
            enc = get_encoding(name)
        except Exception as e:  # a broken install, an unknown name: both mean "estimate"
            self._failed.add(name)
            log.debug("tiktoken encoding %s unavailable: %s", name, e)
            return None
        self._encodings[name] = enc
        return enc

    def count_text(self, text: str, encoding: str) -> int:
        if not text:
            return 0
        enc = self._get_encoding(encoding)
        if enc is None:
            return (len(text.encode("utf-8", "surrogatepass")) + 3) // 4
        if len(text) > ESTIMATE_CHARS:  # over any window: its head and tail counted, scaled to its length
            sample = scanned(text)
            return -(-farm.call(sample_tokens, enc.name, sample) * len(text) // len(sample))
        return len(enc.encode_ordinary(text))

    # -- messages ----------------------------------------------------------------------------
    def cached(self, encoding: str, digest: Hashable) -> int | None:
        """The cached count of a message, without counting (or refreshing its place)."""
        return self._cache.get((encoding, digest))

    def count_message(self, msg: dict[str, Any], encoding: str, digest: Hashable,
                      count: Callable[[dict[str, Any], str], int] | None = None) -> int:
        """Tokens of one message, cached by (encoding, digest): any key that identifies the message.
        `count` counts a message of another protocol (default: a chat message)."""
        key = (encoding, digest)
        cached = self._cache.get(key)
        if cached is not None:
            try:
                self._cache.move_to_end(key)
            except KeyError:  # evicted meanwhile by a count running in a worker thread
                pass
            return cached
        n = (count or self._count_message_uncached)(msg, encoding)
        self._put(key, n)
        return n

    def _put(self, key: tuple[Any, ...], n: int) -> None:
        self._cache[key] = n
        if len(self._cache) > self._cache_size:
            try:
                self._cache.popitem(last=False)
            except KeyError:  # emptied meanwhile by a count running in a worker thread
                pass

    def count_keyed(self, encoding: str, digest: Hashable, count: Callable[[], int]) -> int:
        """`count()`, cached by (encoding, digest) like a message: for a protocol whose items are
        not chat messages (their adapter knows how to count them)."""
        key = (encoding, digest)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        n = count()
        self._put(key, n)
        return n

    def _count_message_uncached(self, msg: dict[str, Any], enc: str) -> int:
        n = MESSAGE_OVERHEAD + self.count_text(str(msg.get("role", "")), enc)
        n += self.count_content(msg.get("content"), enc)
        name = msg.get("name")
        if isinstance(name, str):
            n += self.count_text(name, enc) + 1
        for call in msg.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            fn = call.get("function") or {}
            if isinstance(fn, dict):
                n += 3 + self.count_text(str(fn.get("name", "")), enc)
                n += self.count_text(str(fn.get("arguments", "")), enc)
        if isinstance(msg.get("tool_call_id"), str):
            n += self.count_text(msg["tool_call_id"], enc)
        return n

    def count_content(self, content: Any, enc: str) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content, enc)
        if isinstance(content, list):
            n = 0
            for part in content:
                if not isinstance(part, dict):
                    continue
                kind = part.get("type")
                if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
                    n += self.count_text(part["text"], enc)
                elif kind == "refusal" and isinstance(part.get("refusal"), str):
                    n += self.count_text(part["refusal"], enc)
                elif kind in ("image_url", "input_image", "image"):
                    n += IMAGE_TOKENS
                else:
                    n += OTHER_PART_TOKENS
            return n
        return self.count_text(jsonbody.dumps(content).decode(), enc)

    def count_tools(self, tools: Any, encoding: str) -> int:
        """Tool schemas are sent to the model as text; count their JSON (a close upper estimate).
        Agents resend the same schemas every request: cached like messages."""
        if not tools:
            return 0
        raw = jsonbody.dumps(tools)
        key = (encoding, "tools", hash(raw))
        n = self._cache.get(key)
        if n is None:
            n = self.count_text(raw.decode(), encoding)
            self._put(key, n)
        return n


_sampler: TokenCounter | None = None  # the worker process's own (proxy/farm.py)


def sample_tokens(encoding: str, sample: str) -> int:
    """The tokens of a huge text's sample, counted in the worker process (loading the encoding
    there once): a million tokens listed and dropped off the proxy's interpreter."""
    global _sampler
    _sampler = _sampler or TokenCounter()
    return _sampler.count_text(sample, encoding)
