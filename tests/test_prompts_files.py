"""Static checks on the prompt files in prompts/ (pure file reads, no proxy code involved)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"

# file name -> (allowed placeholders, required placeholders)
PLACEHOLDERS: dict[str, tuple[set[str], set[str]]] = {
    "summarization-system.md": (set(), set()),
    "compaction-summary.md": (set(), set()),
    "compaction-update-summary.md": (set(), set()),
    "compaction-turn-prefix.md": (set(), set()),
    "compaction-cached-summary.md": ({"point"}, {"point"}),
    "compaction-cached-summary-again.md": (set(), set()),
    "compaction-summary-context.md": ({"summary"}, {"summary"}),
    "system-annotation.md": ({"message_count"}, {"message_count"}),
    "tool-result-summarizer.md": ({"tool_name"}, {"tool_name"}),
    "recall-tool.md": (set(), set()),
    "recall-exhausted.md": (set(), set()),
    "recall-unavailable.md": (set(), set()),
}

# The product's own list: the prompts must ask for exactly what the summarizer checks.
from proxy.prompts import SUMMARY_HEADINGS  # noqa: E402

TURN_PREFIX_HEADINGS = ["## Original Request", "## Early Progress", "## Context for Suffix"]

PLACEHOLDER_RE = re.compile(r"\{\{([^{}]*)\}\}")
HEADING_RE = re.compile(r"^#{2,3} .+$", re.MULTILINE)
CJK_RE = re.compile(r"[\u4e00-\u9fff]")


def read(name: str) -> str:
    return (PROMPTS / name).read_text(encoding="utf-8")


def headings(text: str) -> list[str]:
    return [h.strip() for h in HEADING_RE.findall(text)]


@pytest.mark.parametrize("name", sorted(PLACEHOLDERS))
def test_file_exists_and_not_empty(name: str) -> None:
    path = PROMPTS / name
    assert path.is_file(), f"missing prompt file {path}"
    assert read(name).strip(), f"{name} is empty"


@pytest.mark.parametrize("name", sorted(PLACEHOLDERS))
def test_placeholders(name: str) -> None:
    allowed, required = PLACEHOLDERS[name]
    text = read(name)
    found = set(PLACEHOLDER_RE.findall(text))
    assert found <= allowed, f"{name}: unexpected placeholders {sorted(found - allowed)}"
    assert required <= found, f"{name}: missing placeholders {sorted(required - found)}"
    # No stray double braces once the real placeholders are removed.
    rest = PLACEHOLDER_RE.sub("", text)
    assert "{{" not in rest and "}}" not in rest, f"{name}: stray double braces"


@pytest.mark.parametrize("name", ["compaction-summary.md", "compaction-update-summary.md"])
def test_summary_format_headings(name: str) -> None:
    text = read(name)
    for heading in SUMMARY_HEADINGS:
        assert re.search(rf"^{re.escape(heading)}\s*$", text, re.MULTILINE), f"{name}: no {heading!r}"
    # The format skeleton lists every heading once, in the required order.
    assert headings(text) == list(SUMMARY_HEADINGS)
    assert "- [x]" in text and "- [ ]" in text
    assert "(none)" in text


def test_turn_prefix_headings() -> None:
    assert headings(read("compaction-turn-prefix.md")) == TURN_PREFIX_HEADINGS


def test_summary_context_wrapper() -> None:
    text = read("compaction-summary-context.md")
    open_at = text.find("<summary>")
    slot_at = text.find("{{summary}}")
    close_at = text.find("</summary>")
    assert -1 < open_at < slot_at < close_at, "expected <summary> ... {{summary}} ... </summary>"
    assert re.search(r"^\{\{summary\}\}$", text, re.MULTILINE), "placeholder must sit on its own line"
    wrapper = text[:open_at]
    assert CJK_RE.search(wrapper), "wrapper must contain a Chinese version"
    assert re.search(r"[A-Za-z]{4,}", wrapper), "wrapper must contain an English version"
    # Keep the wrapper short: English words plus CJK characters counted roughly as words.
    english_words = len(re.findall(r"[A-Za-z']+", wrapper))
    cjk_chars = len(CJK_RE.findall(wrapper))
    assert english_words <= 110, english_words
    assert english_words + cjk_chars // 2 <= 180


def test_system_annotation_is_short() -> None:
    text = read("system-annotation.md").strip()
    assert len(re.findall(r"[.!?](\s|$)", text)) <= 2
    assert len(text) < 400


def test_tool_result_summarizer() -> None:
    text = read("tool-result-summarizer.md")
    for marker in ("--- BEGIN TOOL OUTPUT ---", "--- END TOOL OUTPUT ---"):
        assert marker in text
    assert re.search(r"^\[Summary of \{\{tool_name\}\} output\]$", text, re.MULTILINE)
    for heading in ("## Key facts", "## Identifiers preserved", "## Original size"):
        assert re.search(rf"^{re.escape(heading)}\s*$", text, re.MULTILINE), heading
    assert "untrusted" in text.lower()
    assert "2000" in text
