"""`compaction-proxy` / `python -m proxy`: parse flags, load config, serve until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING, Callable

from proxy import __version__
from proxy.cmdline import SWITCH_INTERVAL_S, flag_overrides, install_uvloop, parse_args

if TYPE_CHECKING:
    from proxy.config import Config

# The config (pydantic) and the app (aiohttp) are imported in `main`, not here: the worker process
# of proxy/farm.py is spawned, and a spawned child runs the console script's `from proxy.cli import
# main` again (not `python -m proxy`'s __main__), ~0.45 s of CPU for modules the worker never uses.

log = logging.getLogger("proxy")


COMMANDS = ("events", "inspect")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and (command := _command(argv[0])) is not None:
        return command(argv[1:])
    args = parse_args(argv)
    from proxy.config import ConfigError, load_config

    try:
        cfg: Config = load_config(args.config, overrides=flag_overrides(args))
    except ConfigError as e:
        print(f"compaction-proxy: config error: {e}", file=sys.stderr)
        return 2
    return _serve(cfg)


def _command(name: str) -> Callable[[list[str]], int] | None:
    """The main function of a subcommand (imported only when asked for), or None: serve."""
    if name == "demo":  # the proxy and a fake upstream, on loopback
        from proxy.demo import main as demo

        return demo
    if name == "wrap":  # run an agent through a proxy started for it
        from proxy.launch import main as wrap

        return wrap
    if name == "health":  # a running proxy's /healthz at its configured address (the HEALTHCHECK)
        from proxy.operator.health import health_main

        return health_main
    if name == "fake-upstream":  # a strict fake provider on loopback, to try a client with no key
        from proxy.fakes.command import main as fake_upstream

        return fake_upstream
    if name in COMMANDS:
        from proxy.operator import commands

        return getattr(commands, f"{name}_main")
    return None


def _serve(cfg: Config) -> int:
    """Serve until stopped: one process, or the configured workers."""
    from proxy.logsafe import shown_url
    from proxy.ops.logs import setup_logging

    setup_logging(cfg.server.log_level, cfg.server.log_format)
    install_uvloop()
    from proxy import heap

    heap.configure()  # fixed allocator thresholds (proxy/heap.py), inherited by forked workers
    from proxy.app import create_app
    from proxy.serve import raise_fd_limit, serve

    log.info(
        "compaction-proxy %s listening on http://%s:%d -> %s, Anthropic clients -> %s (store %s)",
        __version__, cfg.server.host, cfg.server.port, shown_url(cfg.upstream.base_url),
        shown_url(cfg.anthropic.base_url), shown_url(cfg.store.url),
    )
    raise_fd_limit(cfg)
    # Large requests are parsed, hashed and scanned in worker threads (proxy/offload.py); the event
    # loop gets the GIL back from them after this long, not the default 5 ms, so that every other
    # request keeps its latency meanwhile.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    workers = cfg.server.worker_count()
    try:
        if workers > 1:
            from proxy.workers import run_workers

            return run_workers(cfg, workers)
        # SIGTERM/SIGINT: stop listening at once, give requests in flight shutdown_grace_s to finish
        # (exiting as soon as none is left), cancel what still runs, then close the store.
        asyncio.run(serve(create_app(cfg), cfg))
    except OSError as e:  # the address is taken or not ours: one line, not a traceback
        print(f"compaction-proxy: cannot listen on {cfg.server.host}:{cfg.server.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0
