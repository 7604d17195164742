"""What the Responses and Messages fakes share beyond FakeServer and the fault flags: the
settings of a model endpoint (window, counting, scripted replies and summaries, the signing
key), the signer, and the scripted answer of a request."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from proxy.fakes.chat.replies import default_history_summary, default_reply, default_tool_summary
from proxy.fakes.common import FakeError, RecordedRequest, count_text_tokens, resolve
from proxy.fakes.faults import FaultInjection
from proxy.fakes.server import FakeServer
from proxy.fakes.signing import Signer
from proxy.prompts import default_dir

log = logging.getLogger(__name__)


class Failure(Exception):
    """An error answer on its way out: the status and the protocol's error body."""

    def __init__(self, err: FakeError) -> None:
        super().__init__(str(err.body))
        self.err = err


class ModelFake(FakeServer, FaultInjection):
    default_window = 128000
    default_encoding = "cl100k_base"

    def _init_model_settings(self) -> None:
        self.prompts_dir: Any = default_dir()
        self.require_api_key: str | None = None
        self.window: int = self.default_window
        self.model_windows: dict[str, int] = {}
        self.encoding: str = self.default_encoding
        self.token_scale: float = 1.0
        self.reply: Any = None
        self.summarizer: Any = None
        self.summarizer_marker: str | None = None
        self.summarizer_delay_s: float = 0.0
        self.signing_key: bytes | None = None
        self._signer: Signer | None = None
        self._init_faults()

    @property
    def signer(self) -> Signer:
        """Signs what only this fake may read; a fixed `signing_key` makes recorded sessions replayable."""
        if self._signer is None or (self.signing_key is not None and self._signer.key != self.signing_key):
            self._signer = Signer(self.signing_key)
        return self._signer

    @property
    def summarizer_requests(self) -> list[Any]:
        return [r.json for r in self.requests if r.kind == "summarizer"]

    def window_for(self, model: str) -> int:
        return self.model_windows.get(model, self.window)

    def _count(self, text: str) -> int:
        return count_text_tokens(text, self.encoding)

    async def _scripted(self, view: dict[str, Any], rec: RecordedRequest, normalize: Callable[[Any], Any],
                        error: Callable[[str], FakeError]) -> Any:
        """The scripted answer (`summarizer` for the proxy's summarizer calls, else `reply`; their
        defaults when None), normalized; a scripted FakeError or a broken callable raise Failure."""
        try:
            if rec.summarizer_kind:
                if self.summarizer_delay_s:
                    await asyncio.sleep(self.summarizer_delay_s)
                result = await resolve(self.summarizer, view)
                if result is None:
                    default = default_tool_summary if rec.summarizer_kind == "tool" else default_history_summary
                    result = default(view)
            else:
                result = await resolve(self.reply, view)
                if result is None:
                    result = default_reply(view)
            if isinstance(result, FakeError):
                raise Failure(result)
            return normalize(result)
        except (Failure, asyncio.CancelledError):
            raise
        except Exception as exc:  # a broken scripted callable: make it visible, not a hang
            self.errors.append(exc)
            log.exception("%s: scripted answer failed", type(self).__name__)
            raise Failure(error(f"fake upstream: scripted answer failed: {exc!r}")) from None
