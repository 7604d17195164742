"""Prompt files from prompts/, loaded once at start-up and rendered with explicit placeholders.

Placeholders are written `{{name}}`. Rendering is one pass over the template, so text substituted
into it (conversations, tool output) is never itself scanned for placeholders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")

# file stem -> placeholders it must contain
PROMPT_FILES: dict[str, frozenset[str]] = {
    "summarization-system": frozenset(),
    "compaction-summary": frozenset(),
    "compaction-update-summary": frozenset(),
    "compaction-turn-prefix": frozenset(),
    "compaction-cached-summary": frozenset({"point"}),
    "compaction-cached-summary-again": frozenset(),
    "compaction-summary-context": frozenset({"summary"}),
    "system-annotation": frozenset({"message_count"}),
    "tool-result-summarizer": frozenset({"tool_name"}),
    "recall-tool": frozenset(),
    "recall-exhausted": frozenset(),
    "recall-unavailable": frozenset(),
    "recall-unanswered": frozenset(),
}


# The headings the summary format prompts ask for, in order. A summary lacking some is completed
# by code (compaction/acceptance.py); compaction.required_headings can make some mandatory.
SUMMARY_HEADINGS = (
    "## Active Task",
    "## Goal",
    "## Constraints & Preferences",
    "## Progress",
    "### Done",
    "### In Progress",
    "### Blocked",
    "## Key Decisions",
    "## Answered Questions",
    "## Next Steps",
    "## Critical Context",
)


class PromptError(Exception):
    pass


@dataclass(frozen=True)
class Template:
    name: str
    text: str

    def render(self, **values: object) -> str:
        def sub(m: re.Match[str]) -> str:
            key = m.group(1)
            if key not in values:
                raise PromptError(f"prompt {self.name}: no value for {{{{{key}}}}}")
            return str(values[key])

        return _PLACEHOLDER.sub(sub, self.text)


def default_dir() -> Traversable:
    """Where the prompt files are: the prompts/ beside the package in a checkout (first: an
    editable install maps proxy.prompt_files to the checkout it was made from, which need not be
    this one), else the package's own copy (a directory, or a folder inside a wheel or zip, read
    through importlib.resources)."""
    checkout = Path(__file__).resolve().parent.parent / "prompts"
    if (checkout / "summarization-system.md").is_file():
        return checkout
    try:
        pkg = resources.files("proxy.prompt_files")
        if pkg.joinpath("summarization-system.md").is_file():
            return pkg
    except ModuleNotFoundError:
        pass
    return checkout


class Prompts:
    def __init__(self, directory: str | Path | Traversable | None = None) -> None:
        self.directory: Traversable = Path(directory) if isinstance(directory, str) else directory or default_dir()
        self._t: dict[str, Template] = {}
        for stem, required in PROMPT_FILES.items():
            path = self.directory.joinpath(f"{stem}.md")
            try:
                text = path.read_text(encoding="utf-8").strip()
            except OSError as e:
                raise PromptError(f"prompt file {path}: {e.strerror or e}") from None
            found = set(_PLACEHOLDER.findall(text))
            if missing := required - found:
                raise PromptError(f"prompt file {path}: missing placeholder(s) {sorted(missing)}")
            if unknown := found - required:
                raise PromptError(f"prompt file {path}: unknown placeholder(s) {sorted(unknown)}")
            self._t[stem] = Template(stem, text)

    def __getitem__(self, stem: str) -> Template:
        return self._t[stem]

    def text(self, stem: str) -> str:
        return self._t[stem].text
