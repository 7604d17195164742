"""`compaction-proxy events` and `compaction-proxy inspect`: the operator's commands."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import orjson

from proxy.config import Config, ConfigError, load_config
from proxy.ops.journal import read_events
from proxy.ops.prices import PRICES_DATE
from proxy.store import open_store

SUMMARY_LINES = 12


def _config(args: argparse.Namespace) -> Config | None:
    """The config with the command's --store / --upstream; None (the error printed) when bad."""
    overrides: dict[str, Any] = {}
    if getattr(args, "store", None):
        overrides["store"] = {"url": args.store}
    if getattr(args, "upstream", None):
        overrides["upstream"] = {"base_url": args.upstream}
    if getattr(args, "anthropic_upstream", None):
        overrides["anthropic"] = {"base_url": args.anthropic_upstream}
    try:
        return load_config(args.config, overrides=overrides)
    except ConfigError as e:
        print(f"compaction-proxy: config error: {e}", file=sys.stderr)
        return None


def events_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="compaction-proxy events",
                                description="List the journal of compaction events, newest first.")
    p.add_argument("--config", metavar="FILE", help="the proxy's YAML config (its store.url)")
    p.add_argument("--store", metavar="URL", help="store URL (overrides the config's)")
    p.add_argument("-n", "--limit", type=int, default=20, help="events to show (default 20)")
    p.add_argument("--full", action="store_true", help="whole summaries (default: their first lines)")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    args = p.parse_args(argv)
    cfg = _config(args)
    if cfg is None:
        return 2
    found = asyncio.run(_read(cfg, args.limit))
    if found is None:
        print("compaction-proxy events: the store cannot be read", file=sys.stderr)
        return 1
    for event in found:
        print(orjson.dumps(event).decode() if args.json else format_event(event, full=args.full))
    return 0


async def _read(cfg: Config, n: int) -> list[dict[str, Any]] | None:
    store = open_store(cfg.store.url, ttl_s=cfg.store.ttl_s, max_records=cfg.store.max_records)
    try:
        return await read_events(store, n)
    except Exception as e:  # StoreUnavailable, or a file that is no store
        print(f"compaction-proxy events: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    finally:
        await store.close()


def format_event(e: dict[str, Any], *, full: bool = False) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.get("time", 0)))
    head = (f"{when}  {e.get('tier')}  {e.get('model')}  conversation {e.get('conversation')}  "
            f"tokens {e.get('tokens_before')} -> {e.get('tokens_after')}  "
            f"{e.get('covered')} of {e.get('messages')} messages summarized  "
            f"{e.get('calls')} summarizer calls  waited {e.get('wait_ms', 0):.0f} ms  request {e.get('request_id')}")
    lines = [head]
    lines += [f"  cut: {c}" for c in e.get("cut") or []]
    if e.get("reason"):
        lines.append(f"  reason: {e['reason']}")
    if bill := e.get("bill"):
        lines.append(f"  bill so far ({bill.get('requests')} requests; prices of {PRICES_DATE}): "
                     f"direct ${bill.get('direct', 0):.4f}, through the proxy ${bill.get('proxy', 0):.4f} "
                     f"(summarizer ${bill.get('summarizer', 0):.4f}), saved ${bill.get('saved', 0):.4f}")
    summary = (e.get("summary") or "").splitlines()
    if summary:
        shown = summary if full else summary[:SUMMARY_LINES]
        lines.append("  summary:")
        lines += ["    " + s for s in shown]
        if len(shown) < len(summary):
            lines.append(f"    [... {len(summary) - len(shown)} more lines; --full shows them]")
    return "\n".join(lines)


def inspect_main(argv: list[str]) -> int:
    import os

    from proxy.errors import ProxyError
    from proxy.operator.inspect import format_report, inspect, protocol_of, request_headers

    p = argparse.ArgumentParser(
        prog="compaction-proxy inspect",
        description="Show what the proxy would forward for a request body: token counts against the threshold and "
                    "window, the cut, the tool results that become notes, the stored record reused, and a diff of "
                    "original vs forwarded. Calls no upstream unless --summarize; never writes the store.")
    p.add_argument("file", metavar="FILE", help="a request body (JSON): a POST /v1/chat/completions, a POST "
                   "/v1/responses or an Anthropic POST /v1/messages body; - reads stdin")
    p.add_argument("--config", metavar="FILE", help="the proxy's YAML config (windows, thresholds, store, upstream)")
    p.add_argument("--store", metavar="URL", help="store URL to look for stored summaries and notes (overrides the config's)")
    p.add_argument("--upstream", metavar="URL", help="upstream base URL for --summarize (overrides the config's)")
    p.add_argument("--anthropic-upstream", metavar="URL",
                   help="Anthropic upstream base URL for --summarize of a Messages body (overrides the config's)")
    p.add_argument("--protocol", choices=("chat", "responses", "messages"),
                   help="the body's API: chat completions, Responses or Anthropic Messages (default: told from the body)")
    p.add_argument("--api-key", help="the client's key: stored records are per credential (default: $OPENAI_API_KEY, "
                                     "for a Messages body $ANTHROPIC_API_KEY)")
    p.add_argument("--key-header", choices=("authorization", "x-api-key"), default="authorization",
                   help="the header the client sends its key in: records are per credential and header "
                        "(default: Authorization: Bearer, as the openai and anthropic packages send it; Claude "
                        "Code with an API key sends x-api-key)")
    p.add_argument("--session", help="the client's x-compaction-session, if it sends one")
    p.add_argument("--focus", help="the client's x-compaction-focus, if it sends one")
    p.add_argument("--summarize", action="store_true",
                   help="make the summaries for real: calls the configured upstream (the store is still not written)")
    p.add_argument("--json", action="store_true", help="the report as one JSON object (the forwarded body included)")
    args = p.parse_args(argv)
    cfg = _config(args)
    if cfg is None:
        return 2
    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else open(args.file, "rb").read()
    except OSError as e:
        print(f"compaction-proxy inspect: cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        protocol = args.protocol or protocol_of(orjson.loads(raw))
    except orjson.JSONDecodeError:
        protocol = "chat"  # (the dry run names the error)
    env = "ANTHROPIC_API_KEY" if protocol == "messages" else "OPENAI_API_KEY"
    headers = request_headers(args.api_key or os.environ.get(env), args.session, args.focus, args.key_header)
    try:
        report = asyncio.run(inspect(cfg, raw, headers=headers, summarize=args.summarize, protocol=protocol))
    except ProxyError as e:
        print(f"compaction-proxy inspect: the proxy would answer {e.status}: {e.message}", file=sys.stderr)
        return 1
    print(orjson.dumps(report.as_dict()).decode() if args.json else format_report(report))
    return 0
