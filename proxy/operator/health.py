"""`compaction-proxy health`: ask a running proxy's /healthz, at the address its own config gives.

The container's HEALTHCHECK runs `compaction-proxy health --pid 1`: the serving process's command
line, working directory and environment (from /proc) are read and put together as `serve` put them
together (file < environment < flags), so a port set by `--port`, by the config file or by a
COMPACTION_PROXY_* variable is the one checked. Without `--pid` it takes flags and this process's
environment, as `compaction-proxy` itself would. Exit 0 when the proxy answers 200, else 1 with one
line (2: a config error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from proxy.config import Config, ConfigError, load_config

ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


def serve_argv(cmdline: list[str]) -> list[str]:
    """The proxy's own arguments in a process's command line (`python -m proxy ARGS`,
    `.../compaction-proxy ARGS`, `python .../compaction-proxy ARGS`)."""
    for i, arg in enumerate(cmdline):
        if arg == "-m" and i + 1 < len(cmdline) and cmdline[i + 1] == "proxy":
            return cmdline[i + 2:]
        if os.path.basename(arg) == "compaction-proxy":
            return cmdline[i + 1:]
    return []


def read_process(pid: int, proc: Path = Path("/proc")) -> tuple[list[str], dict[str, str], str]:
    """A process's arguments, environment and working directory."""
    base = proc / str(pid)
    cmdline = [a.decode(errors="replace") for a in (base / "cmdline").read_bytes().split(b"\0") if a]
    environ = dict(e.decode(errors="replace").split("=", 1) for e in (base / "environ").read_bytes().split(b"\0")
                   if b"=" in e)
    return cmdline, environ, os.readlink(base / "cwd")


def config_of(argv: list[str], environ: dict[str, str], cwd: str) -> Config:
    """The config `compaction-proxy ARGV` builds in `environ`, a relative file read from `cwd`."""
    from proxy.cmdline import flag_overrides, parse_args

    args = parse_args(argv)
    path = args.config or environ.get("COMPACTION_PROXY_CONFIG") or None
    if path is not None:
        path = os.path.join(cwd, path)  # (an absolute path stays as it is)
    return load_config(path, environ=environ, overrides=flag_overrides(args))


def healthz_url(cfg: Config) -> str:
    host = ANY_ADDRESS.get(cfg.server.host, cfg.server.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{cfg.server.port}/healthz"


def check(url: str, timeout_s: float) -> str | None:
    """None when the proxy answers 200 with status ok, else what went wrong."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body: Any = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except (OSError, ValueError) as e:
        return str(getattr(e, "reason", None) or e)
    return None if isinstance(body, dict) and body.get("status") == "ok" else f"unexpected answer {body!r:.200}"


def health_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="compaction-proxy health", description=__doc__.split("\n\n")[0],
                                epilog="Other arguments are those of `compaction-proxy` (--config, --host, --port).")
    p.add_argument("--pid", type=int, help="read the address from this serving process's own arguments and "
                                           "environment (a container's HEALTHCHECK: --pid 1)")
    p.add_argument("--timeout", type=float, default=4.0, help="seconds (default 4)")
    opts, rest = p.parse_known_args(argv)
    try:
        if opts.pid is not None:
            cmdline, environ, cwd = read_process(opts.pid)
            cfg = config_of(serve_argv(cmdline), environ, cwd)
        else:
            cfg = config_of(rest, dict(os.environ), os.getcwd())
    except ConfigError as e:
        print(f"compaction-proxy health: config error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"compaction-proxy health: cannot read process {opts.pid}: {e.strerror or e}", file=sys.stderr)
        return 1
    url = healthz_url(cfg)
    problem = check(url, opts.timeout)
    if problem is not None:
        print(f"compaction-proxy health: {url}: {problem}", file=sys.stderr)
        return 1
    return 0
