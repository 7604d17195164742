"""The serving command's flags (`compaction-proxy [--config FILE] [--port N] ...`) and its event
loop: shared by the command itself (cli.py), `wrap` (launch.py) and `health`, which read the
same flags to find the same proxy."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from proxy import __version__

SWITCH_INTERVAL_S = 0.001


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="compaction-proxy",
        description="Reverse proxy for OpenAI (Chat Completions, Responses) and Anthropic (Messages) clients that "
        "compacts long conversations and oversized tool results.",
        epilog="Other commands: `compaction-proxy wrap claude|codex|gemini|opencode|aider|goose [-- ARGS]` or "
        "`compaction-proxy wrap -- CMD` (run an agent through a proxy started for it), `compaction-proxy demo` (watch it compact a scripted agent session; no key, "
        "no network), `compaction-proxy events --help` (the journal of compaction events), "
        "`compaction-proxy inspect --help` (what the proxy would forward for a request body), "
        "`compaction-proxy fake-upstream --help` (a strict fake provider on loopback, to try a client with no key), "
        "`compaction-proxy health --help` (a running proxy's /healthz at its configured address).",
    )
    p.add_argument("--config", metavar="FILE", help="YAML config file (default: none; env COMPACTION_PROXY_CONFIG)")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 8787)")
    p.add_argument("--upstream", metavar="URL", help="OpenAI-compatible upstream base URL (default https://api.openai.com/v1)")
    p.add_argument(
        "--anthropic-upstream", metavar="URL",
        help="Messages API upstream for Anthropic clients (default https://api.anthropic.com)",
    )
    p.add_argument(
        "--gemini-upstream", metavar="URL",
        help="Gemini API upstream for Google clients, without a version (default https://generativelanguage.googleapis.com)",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p.parse_args(argv)


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.host is not None:
        out.setdefault("server", {})["host"] = args.host
    if args.port is not None:
        out.setdefault("server", {})["port"] = args.port
    if args.upstream is not None:
        out.setdefault("upstream", {})["base_url"] = args.upstream
    if args.anthropic_upstream is not None:
        out.setdefault("anthropic", {})["base_url"] = args.anthropic_upstream
    if args.gemini_upstream is not None:
        out.setdefault("gemini", {})["base_url"] = args.gemini_upstream
    return out


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # Windows, or a platform without wheels: the default loop works too
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


