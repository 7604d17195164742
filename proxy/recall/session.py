"""One client request's recall rounds (design.md § Recall), whatever the protocol: answers the model's
recall calls, counts them, and knows when the rounds are used up.

Counting and logging never include content (queries, excerpts) unless server.log_content is on.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from proxy.prompts import Prompts
from proxy.recall.originals import Originals
from proxy.recall.tool import answer

log = logging.getLogger("proxy.recall")


@dataclass
class RecallSession:
    name: str  # the tool's name in this request
    originals: Originals
    scope: str
    max_rounds: int
    max_tokens: int
    count: Callable[[str], int]
    prompts: Prompts
    log_content: bool = False
    on_call: Callable[[str, str], None] = lambda outcome, protocol: None  # the metrics hook
    protocol: str = ""  # the route's (chat, responses, messages): the metrics' label
    rounds: int = 0  # recall rounds answered (each asks the upstream once more)
    unanswered: list[str] = field(default_factory=list)  # recall call ids left out of the client's turn
    outcomes: Counter[str] = field(default_factory=Counter)
    lookup_s: float = 0.0

    @property
    def calls(self) -> int:
        return sum(self.outcomes.values())

    @property
    def exhausted(self) -> bool:
        """No more rounds: the model has been told, the next round is its last."""
        return self.rounds >= self.max_rounds

    async def answer_calls(self, arguments: list[str]) -> list[str]:
        """The tool results for one round's recall calls, in order."""
        last = self.exhausted
        self.rounds += 1
        out = []
        for args in arguments:
            if last:
                text, outcome = self.prompts.text("recall-exhausted"), "exhausted"
            else:
                t0 = time.perf_counter()
                a = await answer(args, self.originals, self.scope, max_tokens=self.max_tokens, count=self.count,
                                 prompts=self.prompts)
                self.lookup_s += time.perf_counter() - t0
                text, outcome = a.text, a.outcome
            self.outcomes[outcome] += 1
            self.on_call(outcome, self.protocol)
            if self.log_content:
                log.info("recall %s: %s -> %s", outcome, args[:200], text[:200])
            else:
                log.debug("recall call answered: %s (%d characters)", outcome, len(text))
            out.append(text)
        return out

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        return f"{self.calls} recall call(s) in {self.rounds} round(s): {parts}"
