"""`compaction-proxy wrap AGENT [-- ARGS]`: run a coding agent with its model traffic through the
proxy, in one command.

It starts a proxy on a free loopback port (or uses a running one, `--proxy URL`), runs the agent
with its base URL pointed there the way that agent reads it (environment variables, or Codex's
`-c` overrides: nothing in the user's files is edited), passes the agent's exit status through and
stops the proxy it started. `wrap -- CMD ARGS` runs any command with OPENAI_BASE_URL,
ANTHROPIC_BASE_URL, GOOGLE_GEMINI_BASE_URL and CODE_ASSIST_ENDPOINT set.

The proxy runs in this process while the agent runs as a child in the terminal's foreground
process group: Ctrl-C reaches the agent as it would without `wrap` (Claude Code and Codex cancel a
turn on it and go on), and the proxy ignores it, so it keeps serving the session. SIGTERM and
SIGHUP sent to `wrap` are passed to the agent. The proxy's log goes to a file, not into the agent's
screen; its store is in the user's cache directory unless the config names one, so summaries are
reused across runs (`--resume`, `codex resume`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

PROG = "compaction-proxy wrap"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
CODEX_PROVIDER = "compaction_proxy"


@dataclass(frozen=True)
class Pointing:
    """What points an agent at the proxy: variables set in its environment, arguments put before
    the user's."""

    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)


def _generic(origin: str, environ: dict[str, str]) -> Pointing:
    return Pointing({"OPENAI_BASE_URL": f"{origin}/v1", "ANTHROPIC_BASE_URL": origin, **_gemini(origin, environ).env})


def _claude(origin: str, environ: dict[str, str]) -> Pointing:
    return Pointing({"ANTHROPIC_BASE_URL": origin})  # the anthropic SDK's base: no /v1


def _codex(origin: str, environ: dict[str, str]) -> Pointing:
    """A model provider of its own given with `-c` (Codex's built-in `openai` provider cannot be
    redefined), speaking Responses; the key from OPENAI_API_KEY when set, else Codex's own login."""
    p = f"model_providers.{CODEX_PROVIDER}"
    auth = f'{p}.env_key="OPENAI_API_KEY"' if environ.get("OPENAI_API_KEY") else f"{p}.requires_openai_auth=true"
    settings = [f'model_provider="{CODEX_PROVIDER}"', f'{p}.name="compaction-proxy"', f'{p}.base_url="{origin}/v1"',
                f'{p}.wire_api="responses"', auth]
    return Pointing(args=[a for s in settings for a in ("-c", s)])


def _gemini(origin: str, environ: dict[str, str]) -> Pointing:
    # With an API key Gemini CLI reads the @google/genai SDK's base; signed in with Google, the
    # Code Assist endpoint (the proxy started by wrap sends those calls where they were going)
    return Pointing({"GOOGLE_GEMINI_BASE_URL": origin, "CODE_ASSIST_ENDPOINT": origin})


def _opencode(origin: str, environ: dict[str, str]) -> Pointing:
    """OPENCODE_CONFIG_CONTENT, opencode's inline config (merged over its files), with the
    openai and anthropic providers' baseURL; a value the user already set is kept and extended."""
    try:
        content = json.loads(environ.get("OPENCODE_CONFIG_CONTENT") or "{}")
    except ValueError:
        content = {}
    content = content if isinstance(content, dict) else {}
    providers = content.setdefault("provider", {})
    for name in ("openai", "anthropic"):  # both AI SDK providers' bases end in /v1
        entry = providers.setdefault(name, {})
        entry.setdefault("options", {})["baseURL"] = f"{origin}/v1"
    return Pointing({"OPENCODE_CONFIG_CONTENT": json.dumps(content)})


def _aider(origin: str, environ: dict[str, str]) -> Pointing:
    # aider's own OPENAI_API_BASE; LiteLLM (its client) appends /v1/messages to ANTHROPIC_API_BASE
    return Pointing({"OPENAI_API_BASE": f"{origin}/v1", "ANTHROPIC_API_BASE": origin})


def _goose(origin: str, environ: dict[str, str]) -> Pointing:
    # goose appends OPENAI_BASE_PATH (v1/chat/completions) and v1/messages to these hosts
    return Pointing({"OPENAI_HOST": origin, "ANTHROPIC_HOST": origin})


AGENTS: dict[str, Callable[[str, dict[str, str]], Pointing]] = {
    "claude": _claude, "codex": _codex, "gemini": _gemini, "opencode": _opencode, "aider": _aider, "goose": _goose,
}


def pointing(agent: str | None, origin: str, environ: dict[str, str]) -> Pointing:
    """How `agent` (None: any command) is pointed at the proxy at `origin` (http://host:port)."""
    return (AGENTS[agent] if agent else _generic)(origin, environ)


def proxy_origin(url: str) -> str:
    """A running proxy's URL as given (with or without /v1, a trailing slash) as its origin."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def exit_status(returncode: int) -> int:
    """The agent's status as a shell reports it: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Invocation:
    agent: str | None
    command: list[str]  # the program and the user's arguments
    options: argparse.Namespace


def parse(argv: list[str]) -> Invocation:
    """`wrap [OPTIONS] AGENT [-- ARGS]` or `wrap [OPTIONS] -- CMD [ARGS]`."""
    before, after = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(
        prog=PROG, description="Run a coding agent with its model traffic through the proxy.",
        usage=f"{PROG} [OPTIONS] {{{','.join(AGENTS)}}} [-- ARGS]  |  {PROG} [OPTIONS] -- CMD [ARGS]")
    p.add_argument("agent", nargs="?", choices=list(AGENTS), help="the agent to run (its arguments after --)")
    p.add_argument("--proxy", metavar="URL", help="use the proxy running at URL instead of starting one")
    p.add_argument("--config", metavar="FILE", help="the started proxy's YAML config (as for `compaction-proxy`)")
    p.add_argument("--upstream", metavar="URL", help="OpenAI-compatible upstream of the started proxy")
    p.add_argument("--anthropic-upstream", metavar="URL", help="Messages upstream of the started proxy")
    p.add_argument("--gemini-upstream", metavar="URL", help="Gemini API upstream of the started proxy")
    p.add_argument("--log", metavar="FILE", help="the started proxy's log (default: wrap.log in the cache directory)")
    p.set_defaults(host=None, port=None)  # cmdline.flag_overrides reads them; wrap's proxy is loopback on a free port
    opts = p.parse_args(before)
    if opts.agent is None and not after:
        p.error("name an agent, or give a command after --")
    command = [opts.agent, *after] if opts.agent else after
    return Invocation(opts.agent, command, opts)


def cache_dir(environ: dict[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "compaction-proxy"


async def run_child(argv: list[str], env: dict[str, str]) -> int:
    """Run the agent in the foreground and wait for it. Ctrl-C is the agent's (the terminal sends
    it to the whole process group; the proxy must outlive it); SIGTERM/SIGHUP are passed on."""
    loop = asyncio.get_running_loop()
    proc = await asyncio.create_subprocess_exec(*argv, env=env)
    loop.add_signal_handler(signal.SIGINT, lambda: None)
    for sig in FORWARDED_SIGNALS:
        loop.add_signal_handler(sig, _pass_on, proc, sig)
    try:
        return exit_status(await proc.wait())
    finally:
        for sig in (signal.SIGINT, *FORWARDED_SIGNALS):
            loop.remove_signal_handler(sig)


def _pass_on(proc: Any, sig: signal.Signals) -> None:
    if proc.returncode is None:
        proc.send_signal(sig)


def say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    inv = parse(argv)
    environ = dict(os.environ)
    if shutil.which(inv.command[0], path=environ.get("PATH")) is None:
        say(f"{inv.command[0]}: command not found")
        return 127
    if inv.options.proxy:
        return with_running_proxy(inv, environ)
    return with_own_proxy(inv, environ)


def child_argv_env(inv: Invocation, origin: str, environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    point = pointing(inv.agent, origin, environ)
    return [inv.command[0], *point.args, *inv.command[1:]], {**environ, **point.env}


def with_running_proxy(inv: Invocation, environ: dict[str, str]) -> int:
    import urllib.request

    origin = proxy_origin(inv.options.proxy)
    try:
        with urllib.request.urlopen(f"{origin}/healthz", timeout=5):
            pass
    except (OSError, ValueError) as e:
        say(f"no proxy answers at {origin}/healthz ({getattr(e, 'reason', None) or e})")
        return 2
    say(f"{inv.command[0]} -> proxy {origin} (already running; dashboard {origin}/dashboard)")
    argv, env = child_argv_env(inv, origin, environ)
    return asyncio.run(run_child(argv, env))


def own_defaults(cache: Path, environ: dict[str, str]) -> dict[str, Any]:
    """The started proxy's defaults, below any config: its store in the user's cache directory;
    Code Assist compacted and sent where the agent would have sent it (the user's own
    CODE_ASSIST_ENDPOINT, else Google's), since wrap points the agent's at the proxy."""
    from proxy.protocols.gemini.code_assist import CODE_ASSIST_URL

    return {"store": {"url": f"sqlite:///{cache / 'wrap.db'}"},
            "gemini": {"code_assist_base_url": environ.get("CODE_ASSIST_ENDPOINT") or CODE_ASSIST_URL}}


def with_own_proxy(inv: Invocation, environ: dict[str, str]) -> int:
    from proxy import heap
    from proxy.cmdline import SWITCH_INTERVAL_S, flag_overrides, install_uvloop
    from proxy.config import ConfigError, load_config
    from proxy.ops.logs import setup_logging

    cache = cache_dir(environ)
    defaults = own_defaults(cache, environ)
    # Loopback and a free port always: the agent is the one client, and two wraps run side by side.
    overrides = {**flag_overrides(inv.options), "server": {"host": "127.0.0.1", "port": 0, "workers": 1}}
    try:
        cfg = load_config(inv.options.config, environ=environ, overrides=overrides, defaults=defaults)
    except ConfigError as e:
        say(f"config error: {e}")
        return 2
    log_path = Path(inv.options.log) if inv.options.log else cache / "wrap.log"
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "a", encoding="utf-8")
    except OSError as e:
        say(f"cannot write {log_path}: {e.strerror or e}")
        return 2
    with log_file:
        setup_logging(cfg.server.log_level, cfg.server.log_format, stream=log_file)
        install_uvloop()
        heap.configure()  # as `compaction-proxy` serves (proxy/cli.py)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            return asyncio.run(_serve_during(inv, cfg, environ, log_path))
        except KeyboardInterrupt:  # Ctrl-C before the agent started: nothing of it to wait for
            return 130


async def _serve_during(inv: Invocation, cfg: Any, environ: dict[str, str], log_path: Path) -> int:
    """The proxy listens while the agent runs, then drains and stops."""
    from proxy.app import create_app
    from proxy.ops.logs import flush_logs
    from proxy.serve import listen, stop_serving

    app = create_app(cfg)
    try:
        runner, site = await listen(app, cfg)
    except OSError as e:
        say(f"cannot listen on 127.0.0.1: {e.strerror or e}")
        return 1
    try:
        origin = f"http://127.0.0.1:{runner.addresses[0][1]}"
        say(f"{inv.command[0]} -> proxy {origin} (dashboard {origin}/dashboard, log {log_path})")
        argv, env = child_argv_env(inv, origin, environ)
        return await run_child(argv, env)
    finally:
        await stop_serving(app, runner, site, cfg.server.shutdown_grace_s)
        await runner.cleanup()
        flush_logs()
