"""How the config's sources become one mapping and its errors one line: the environment's
COMPACTION_PROXY_* variables as key paths, the layers merged, and a validation error phrased by the
key (or the variable) that set it. proxy/config.py validates the result."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

ENV_PREFIX = "COMPACTION_PROXY_"


class ConfigError(Exception):
    """A configuration problem, phrased as one line naming the key."""


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def env_paths_of(environ: dict[str, str]) -> dict[tuple[str, ...], str]:
    """Each COMPACTION_PROXY_* variable's key path, to the variable's name."""
    out: dict[tuple[str, ...], str] = {}
    for name in environ:
        if name.startswith(ENV_PREFIX) and name != ENV_PREFIX + "CONFIG":
            path = tuple(p.lower() for p in name[len(ENV_PREFIX):].split("__") if p)
            if path:
                out[path] = name
    return out


def env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    """COMPACTION_PROXY_COMPACTION__THRESHOLD_TOKENS=90000 -> {"compaction": {"threshold_tokens": "90000"}}.

    Values stay strings, which the typed model converts ("90000" -> 90000, "false" -> False) while
    string settings keep exactly what was written (an API key "12345", a focus "yes"). Two
    exceptions: an empty value means "unset" (null), and a YAML flow list (`[a, "b*"]`) is a list.
    """
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG":
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        if not path:
            continue
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: conflicts with another variable")
        if isinstance(node.get(path[-1]), dict):
            raise ConfigError(f"{name}: conflicts with another variable")
        node[path[-1]] = _env_value(raw)
    return out


def _env_value(raw: str) -> Any:
    if raw.strip() == "":
        return None
    if raw.lstrip().startswith("["):
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            return raw
        if isinstance(value, list):
            return value
    return raw


def format_error(exc: ValidationError, env_paths: dict[tuple[str, ...], str] | None = None) -> str:
    """The first error as one line naming its key, or the environment variable that set it (a
    misspelled variable is looked for by its name, not by the key it was read as)."""
    err = exc.errors()[0]
    loc = tuple(str(p) for p in err["loc"])
    key = ".".join(loc)
    msg = err["msg"]
    extra = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    var = next(((path, name) for path, name in (env_paths or {}).items() if path[:len(loc)] == loc), None)
    if var is not None and err["type"] == "extra_forbidden":
        return f"{var[1]}: unknown variable (there is no config key {'.'.join(var[0])}){extra}"
    if var is not None:
        return f"{var[1]} ({key}): {msg}{extra}"
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{key}: {msg}{extra}"


def sets_key(data: dict[str, Any], path: tuple[str, ...]) -> bool:
    """Whether `data` has a value at `path` (or at a part of it)."""
    node: Any = data
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
