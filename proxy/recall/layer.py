"""Recall for one process (design.md § Recall): keeps the originals a forwarded request stands in for, and
starts the recall session of a request. The protocol routes call it; the protocol-specific parts
(the declaration's shape, the answering loop) live beside it (proxy/protocols/chat/recall.py, ...).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable, Sequence

from proxy import offload
from proxy.config import Config
from proxy.ops.hooks import Hooks
from proxy.prompts import Prompts
from proxy.recall.keep import Span, find_again, forwarded_parts, request_maps, request_parts, unread_bytes, written
from proxy.recall.originals import Original, Originals
from proxy.recall.session import RecallSession
from proxy.recall.tool import tool_name
from proxy.store.base import Store
from proxy.tokens import TokenCounter

log = logging.getLogger("proxy.recall")

SAVED_CACHE = 100_000  # (scope, handle) pairs known to be stored, so a request does not ask again


class Recall:
    def __init__(self, cfg: Config, store: Store, prompts: Prompts, counter: TokenCounter, hooks: Hooks | None = None) -> None:
        self.cfg = cfg.recall
        self.log_content = cfg.server.log_content
        self.store = store
        self.originals = Originals(store)
        self.prompts = prompts
        self.counter = counter
        self.hooks = hooks or Hooks()
        self._saved: OrderedDict[str, None] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    def name_for(self, client_tools: Sequence[str]) -> str:
        return tool_name(self.cfg.tool_name, client_tools)

    async def keep(self, scope: str, request: Any, forwarded: Any, n_system: int) -> bool:
        """Store the originals the forwarded conversation (neutral) stands in for, those not stored
        yet; `request` is the client's (adapter.Request). True when it carries any replacement:
        then the recall tool is declared. Finding them reads what is new in the request (the
        previous request's maps kept, keep.request_maps), off the loop past offload's size; a
        summary's spans not stored yet are written out off the loop past it too."""
        # (a thread only asks the cache `in`, one step under the GIL, however the loop changes it)
        known = lambda h: f"{scope}:{h}" in self._saved  # noqa: E731
        found, spans = await offload.sized(unread_bytes(request), _find, request, forwarded, n_system, known)
        if not found:
            return False
        originals = list(found.values()) if not spans else \
            await offload.sized(len(request.raw), written, request_parts(request), n_system, found, spans)
        await self._save(scope, originals)
        return True

    async def _save(self, scope: str, found: list[Original]) -> None:
        new = [o for o in found if f"{scope}:{o.handle}" not in self._saved]
        if not new:
            for o in found:
                self._saved.move_to_end(f"{scope}:{o.handle}")
            return
        stored = await self.originals.saved(scope, [o.handle for o in new])
        await self.originals.save(scope, *(o for o in new if o.handle not in stored))
        if getattr(self.store, "healthy", True):  # else: try again on the next request
            for o in new:
                self._saved[f"{scope}:{o.handle}"] = None
            while len(self._saved) > SAVED_CACHE:
                self._saved.popitem(last=False)
        log.debug("recall: %d original(s) kept, %d already stored", len(new) - len(stored), len(stored))

    def session(self, scope: str, name: str, encoding: str, protocol: str) -> RecallSession:
        count: Callable[[str], int] = lambda text: self.counter.count_text(text, encoding)  # noqa: E731
        return RecallSession(name, self.originals, scope, self.cfg.max_rounds, self.cfg.max_tokens, count,
                             self.prompts, self.log_content, on_call=self.hooks.recall,
                             protocol=protocol)


def _find(request: Any, forwarded: Any, n_system: int,
          known: Callable[[str], bool]) -> tuple[dict[str, Original], list[Span]]:
    return find_again(request, request_maps(request), forwarded_parts(request, forwarded), n_system, known)
