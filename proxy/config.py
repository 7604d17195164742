"""The one typed configuration model, and how it is assembled.

Precedence, lowest first: defaults < YAML file < environment (COMPACTION_PROXY_SECTION__KEY) < CLI
flags. Every key has a default, so no file is needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from proxy.config_sources import ENV_PREFIX, ConfigError, deep_merge, env_overrides, env_paths_of, format_error, sets_key
from proxy.store.redis_cluster import SCHEMES as CLUSTER_SCHEMES
from proxy.store.redis_cluster import parse_cluster_url
from proxy.windows import window_for


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def secret(value: SecretStr | None) -> str | None:
    """A configured key's text, or None when none is set."""
    return value.get_secret_value() if value is not None else None


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8787, ge=0, le=65535)
    max_body_mb: float = Field(64, gt=0)
    max_header_kb: int = Field(64, ge=1)
    shutdown_grace_s: float = Field(30, ge=0)
    # A request body must arrive within body_timeout_s, and a large one no slower than
    # body_min_kb_s on average after that (else 408): a rate floor, not a total, for big uploads.
    body_timeout_s: float = Field(60, gt=0)
    body_min_kb_s: float = Field(64, gt=0)
    header_timeout_s: float = Field(10, gt=0)  # from a request's first byte to its last header line
    keepalive_timeout_s: float = Field(15, gt=0)  # an idle connection (none sent yet, or between requests)
    max_connections: int = Field(4096, ge=1)  # open client connections; beyond, a 503 and close
    # Browser origins (`https://app.example`) whose requests may go out with the proxy's own key
    # (upstream.api_key, anthropic.api_key); a request from another origin is refused (a web page
    # borrowing the key). Requests without an Origin (CLI agents, SDKs) are not concerned.
    allowed_origins: list[str] = Field(default_factory=list)
    # Processes serving the port (SO_REUSEPORT), each a full proxy sharing the store; "auto": one per core.
    workers: int | Literal["auto"] = 1
    log_level: str = "info"
    log_format: Literal["text", "json"] = "text"  # json: one JSON object a line
    access_log: bool = True  # one line per request at INFO (never content or credentials)
    # Message content is never logged unless an operator turns this on.
    log_content: bool = False

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, v: Any) -> Any:
        if v == "auto":
            return v
        try:
            n = int(v)
        except (TypeError, ValueError):
            n = 0
        if isinstance(v, bool) or n < 1 or str(n) != str(v).strip():
            raise ValueError("must be a number of processes (1 or more) or 'auto'")
        return n

    def worker_count(self) -> int:
        return (os.cpu_count() or 1) if self.workers == "auto" else self.workers


class UpstreamConfig(_Section):
    base_url: str = "https://api.openai.com/v1"
    # Used only when the client sends no credential (Authorization, api-key or x-api-key).
    api_key: SecretStr | None = None
    timeout_s: float = Field(600, gt=0)  # whole request, non-streaming
    connect_timeout_s: float = Field(10, gt=0)
    stream_idle_timeout_s: float = Field(300, gt=0)  # longest silence inside a stream
    max_connections: int = Field(1000, ge=1)
    # Upstream sockets held for client WebSockets: a pool of their own (an idle socket never takes
    # a connection HTTP requests need); beyond it a handshake is refused with 503.
    max_websockets: int = Field(256, ge=1)

    @field_validator("base_url")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        try:
            host = urlsplit(v).hostname
        except ValueError:  # a malformed port or bracketed address
            host = None
        if not host:  # refused now, not as every request's failure later
            raise ValueError("has no host (http://HOST[:PORT][/PATH])")
        return v.rstrip("/")


class _RelayConfig(_Section):
    """What every upstream the proxy relays to has besides the OpenAI one: its timeouts."""

    timeout_s: float = Field(600, gt=0)  # whole request, non-streaming
    connect_timeout_s: float = Field(10, gt=0)
    stream_idle_timeout_s: float = Field(300, gt=0)  # longest silence inside a stream

    @field_validator("base_url", check_fields=False)
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        return UpstreamConfig._strip_slash(v)


class AnthropicConfig(_RelayConfig):
    """Where Anthropic Messages traffic goes: /v1/messages, /v1/messages/count_tokens and every
    other Anthropic request (one proxy serves OpenAI and Anthropic clients side by side). Any
    Messages-compatible server works (LiteLLM, vLLM, llama.cpp). The URL has no /v1: the client's
    path is appended whole, as the anthropic SDK does with its base URL."""

    base_url: str = "https://api.anthropic.com"
    # Sent as `x-api-key` only when the client sends no credential (x-api-key or Authorization).
    api_key: SecretStr | None = None
    # Anthropic's on-demand compaction (the `compaction` parameter, beta compact-2026-09-04): answered
    # here with a block the proxy signs (`proxy`), passed on (`upstream`), or passed on until the
    # upstream refuses it for a model, then answered here (`auto`).
    native_compaction: Literal["auto", "upstream", "proxy"] = "auto"


class GeminiConfig(_RelayConfig):
    """Where Google's Gemini API requests go (Gemini CLI with an API key, google-genai):
    `models/{model}:generateContent` and `:streamGenerateContent` compacted, `:countTokens`
    counted as forwarded, every other /v1beta and /v1alpha path relayed as it came. The client's
    own key (x-goog-api-key or ?key=) goes with them; the proxy has none to add. The URL has no
    version: the client's path is appended whole."""

    base_url: str = "https://generativelanguage.googleapis.com"
    # Code Assist (Gemini CLI signed in with Google: /v1internal:...): compacted and sent here when
    # set; unset, relayed as it came to Google's own endpoint (CODE_ASSIST_URL)
    code_assist_base_url: str | None = None

    @field_validator("code_assist_base_url")
    @classmethod
    def _strip_code_assist_slash(cls, v: str | None) -> str | None:
        return None if v is None else UpstreamConfig._strip_slash(v)

    @property
    def api_key(self) -> None:  # (the pass-through's configured key: none)
        return None


class ModelConfig(_Section):
    context_window: int | None = Field(None, ge=16)
    # Multiplies tiktoken's count for models whose tokenizer tiktoken lacks.
    token_ratio: float = Field(1.0, gt=0)
    encoding: str | None = None


class SummarizerConfig(_Section):
    """Where history summaries are made. Unset, each key follows the request: its upstream, its
    credentials, its model."""

    base_url: str | None = None  # another server (a cheaper model, a local one); default: upstream.base_url
    # Sent as `Authorization: Bearer ...` to the summarizer. Unset: the client's own credentials,
    # but only when the summarizer is the upstream itself; a separate base_url without a key gets
    # no credential (a client's key never goes to a server it did not choose).
    api_key: SecretStr | None = None
    model: str | None = None  # default: the request's model

    @field_validator("base_url")
    @classmethod
    def _strip_slash(cls, v: str | None) -> str | None:
        return None if v is None else UpstreamConfig._strip_slash(v)


class CompactionConfig(_Section):
    enabled: bool = True
    threshold_tokens: int | None = None
    threshold_percent: float | None = Field(None, ge=1, le=99)
    reserve_tokens: int | None = Field(None, ge=0)
    keep_recent_tokens: int = Field(20000, ge=0)
    summarizer: SummarizerConfig = Field(default_factory=SummarizerConfig)
    summarizer_model: str | None = None  # the older name of summarizer.model, still accepted
    summarizer_timeout_s: float = Field(180, gt=0)
    # A conversation whose summary just failed forwards uncompacted (failed-open) this long before
    # the summarizer is asked again.
    failure_cooldown_s: float = Field(60, ge=0)
    # Opt-in strictness: headings a summary must contain to be accepted. By default any summary is
    # accepted and the headings it lacks are added by code ("none recorded").
    required_headings: list[str] = Field(default_factory=list)
    focus: str | None = None
    # When the conversation's own model and upstream write the summary, ask for it in the
    # conversation's own request (its cached prefix + one message): the upstream bills that
    # history at its cached rate. Else, or when that call fails, the history goes as a transcript.
    cached_summary_call: bool = True
    # Learn each model's ratio between the upstream's usage.prompt_tokens and tiktoken's count
    # (smoothed, bounded to [0.5, 2], kept in the store) and count requests with it.
    learn_token_ratio: bool = True
    # Tier 1: over the threshold, first replace old tool outputs by stubs written by code; a
    # summary is made only when that is not enough.
    mask_tool_outputs: bool = True
    # The identifier block of a summary grows with the summarized span up to this share of the
    # target, plus the room the model's text and the files block left unused; identifiers that do
    # not fit are listed in the record for recall.
    identifiers_share: float = Field(0.15, ge=0, le=0.5)
    # A digest written by code (the summarizer failed and the request did not fit the window)
    # lives this long: then the summarizer is asked again.
    digest_ttl_s: float = Field(120, gt=0)
    # Start preparing the next summary off the request path at this share of the threshold; 0 = off.
    prepare_percent: float = Field(80, ge=0, le=100)
    prepare_workers: int = Field(2, ge=1)
    prepare_queue: int = Field(64, ge=1)
    # Prepare ahead only for a conversation whose latest request is at most this old when a worker
    # gets to it: a conversation that went quiet (ended, or its agent is stuck) costs no summary.
    prepare_idle_s: float = Field(120, gt=0)
    # Summarizer calls in flight at once, per process: request path and preparation together.
    max_concurrent_summaries: int = Field(8, ge=1)
    # Of those, at most this many for one credential scope: one tenant's slow summaries leave the
    # other slots to the others (at or above max_concurrent_summaries: no limit of its own).
    max_concurrent_summaries_per_scope: int = Field(4, ge=1)
    max_fold_calls: int = Field(16, ge=1)
    # The longest a request waits for a summary (or tool note) someone else is making; past it,
    # it is forwarded without (failed-open, or the raw output with a notice).
    max_wait_s: float = Field(10, gt=0)

    @model_validator(mode="after")
    def _summarizer_model_alias(self) -> "CompactionConfig":
        old, new = self.summarizer_model, self.summarizer.model
        if old is not None and new is not None and old != new:
            raise ValueError("summarizer_model is the older name of summarizer.model: set one of them")
        if old is not None:
            self.summarizer.model = old
        self.summarizer_model = self.summarizer.model
        return self


class ToolResultsConfig(_Section):
    enabled: bool = True
    threshold_tokens: int = Field(4000, ge=1)
    max_payload_tokens: int = Field(2_000_000, ge=1)
    skip_tools: list[str] = Field(default_factory=list)
    summarizer_model: str | None = None
    timeout_s: float = Field(120, gt=0)
    concurrency: int = Field(4, ge=1)
    concurrency_per_scope: int = Field(2, ge=1)  # of those, for one credential scope
    breaker_failures: int = Field(3, ge=1)
    breaker_cooldown_s: float = Field(300, ge=0)
    # Breakers are kept per credential scope, upstream and model; at most this many (the least
    # recently used go first).
    max_breakers: int = Field(10_000, ge=1)
    max_output_tokens: int = Field(2000, ge=64)


class RecallConfig(_Section):
    """The recall tool (design.md § Recall): the model looks up what compaction replaced."""

    enabled: bool = True
    # The function's name; when a client declares a tool of that name, a suffixed one is used.
    tool_name: str = Field("context_recall", pattern=r"^[A-Za-z0-9_-]{1,48}$")
    max_tokens: int = Field(4000, ge=200)  # one answer of the tool, at most (more: by page)
    max_rounds: int = Field(3, ge=1)  # lookups answered inside one client request; then the model is told no more


class StoreConfig(_Section):
    url: str = "sqlite:///compaction-proxy.db"
    scope_secret: SecretStr | None = None
    ttl_s: float = Field(7 * 24 * 3600, gt=0)
    max_records: int = Field(100_000, ge=1)
    # A lock's last resort: it frees itself this long after its holder's last beat.
    lock_ttl_s: float = Field(30, gt=0)
    # Holders rewrite their lock this often; a lock two beats (and a half) late is taken over.
    lock_heartbeat_s: float = Field(2, gt=0)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        if v.startswith(CLUSTER_SCHEMES):
            parse_cluster_url(v)  # seed nodes named at start, not at the first request
        elif not v.startswith(("sqlite:///", "memory://", "redis://", "rediss://")):
            raise ValueError("must be sqlite:///path, memory://, redis://host:port/db or "
                             "redis+cluster://host:port[,host:port...]")
        return v

    @model_validator(mode="after")
    def _lock_outlives_a_beat(self) -> "StoreConfig":
        # A live holder rewrites its lock once a beat; a lock that expires sooner than a beat late
        # frees itself under a holder that is still working, and another replica makes the same
        # summary again.
        if self.lock_ttl_s < 2 * self.lock_heartbeat_s:
            raise ValueError(f"lock_ttl_s ({self.lock_ttl_s:g} s) must be at least twice lock_heartbeat_s "
                             f"({self.lock_heartbeat_s:g} s), or a working holder's lock expires between its beats")
        return self


class AdminConfig(_Section):
    # /metrics, /dashboard and /admin/* answer only to loopback peers unless this is set; then only
    # to requests carrying it as a bearer token (from anywhere).
    token: SecretStr | None = None
    # Names (besides localhost and IP addresses) admin routes answer under, as the Host header
    # gives them (port ignored): a request under another name is refused (DNS rebinding).
    allowed_hosts: list[str] = Field(default_factory=list)
    sample_interval_s: float = Field(10, gt=0)  # the dashboard's time series: one point this often
    sample_points: int = Field(360, ge=2)  # points kept (an hour at the default interval)


class MetricsConfig(_Section):
    enabled: bool = True  # Prometheus metrics (/metrics and the dashboard's figures)


class JournalConfig(_Section):
    enabled: bool = True  # compaction events kept in the store (`compaction-proxy events`)
    max_events: int = Field(1000, ge=1)  # newest kept; they also expire with store.ttl_s


class PriceConfig(_Section):
    """US dollars per million tokens."""

    input: float = Field(ge=0)
    cached_input: float | None = Field(None, ge=0)  # None: same as input (no cache discount)
    output: float = Field(ge=0)


class BillingConfig(_Section):
    # Added to (and overriding) the built-in, dated table in proxy/ops/prices.py. Keys are model
    # names; a key also prices every model whose name starts with it (longest match wins).
    prices: dict[str, PriceConfig] = Field(default_factory=dict)
    max_conversations: int = Field(1000, ge=1)  # per-conversation figures kept in memory


class ResponsesConfig(_Section):
    """The Responses API (design.md § Responses API)."""

    # Serve /v1/responses/compact here (the proxy's own compaction items) even when the upstream
    # serves it; otherwise it is passed through, and served here only when the upstream answers
    # 404/405 (a local server, vLLM, llama.cpp).
    serve_compact: bool = False
    # How the summaries of a Responses conversation are asked for: as a Responses call, or as a
    # chat completion for an upstream that serves both and is better at chat.
    summarizer_api: Literal["responses", "chat"] = "responses"
    # Codex's remote compaction v2 (a `compaction_trigger` input item): answered here with the
    # proxy's own compaction item (`proxy`), passed on (`upstream`), or passed on until the
    # upstream refuses it for a model, then answered here (`auto`).
    native_compaction: Literal["auto", "upstream", "proxy"] = "auto"
    # A WebSocket turn has no headers of its own: its x-compaction-* report goes into the
    # `response.metadata` of the turn's `response.created` event (false: events relayed untouched).
    websocket_report: bool = True
    # A client WebSocket with no message either way for this long (and no turn under way) is closed
    # (1001, going away), and its upstream socket with it.
    websocket_idle_timeout_s: float = Field(600, gt=0)
    # A client socket's messages read ahead of the one being sent up, at most this many MiB
    # (decoded; one message is always let in): then the socket is not read until room is made.
    websocket_read_ahead_mb: float = Field(16, gt=0)


class TracingConfig(_Section):
    # The OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces). Unset: the standard
    # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT variables; none set: no tracing.
    endpoint: str | None = None
    content: bool = False  # put conversation content (the summaries made) into spans


class Config(_Section):
    # observe: every request goes upstream as the client sent it, byte for byte, while the stages
    # still run beside it and report what they would have done (proxy/watch.py)
    mode: Literal["active", "observe"] = "active"
    server: ServerConfig = Field(default_factory=ServerConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    anthropic: AnthropicConfig = Field(default_factory=AnthropicConfig)
    gemini: GeminiConfig = Field(default_factory=GeminiConfig)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    tool_results: ToolResultsConfig = Field(default_factory=ToolResultsConfig)
    recall: RecallConfig = Field(default_factory=RecallConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    journal: JournalConfig = Field(default_factory=JournalConfig)
    billing: BillingConfig = Field(default_factory=BillingConfig)
    responses: ResponsesConfig = Field(default_factory=ResponsesConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)

    def model_settings(self, model: str) -> ModelConfig:
        """Settings for a model name: exact entry, else `default`, else built-in defaults."""
        return self.models.get(model) or self.models.get("default") or _DEFAULT_MODEL

    def context_window(self, model: str, *, long_context: bool = False) -> int:
        """The model's window: from `models:` (its entry, else `default`), else the built-in table
        of well-known models (proxy/windows.py; `long_context`: the request opted into the model's
        longer window), else 128000 with one warning per model."""
        return window_for(model, self.model_settings(model).context_window, long_context=long_context)


_DEFAULT_MODEL = ModelConfig()


def load_config(
    path: str | os.PathLike[str] | None = None,
    environ: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
) -> Config:
    """Build the config from file, environment and explicit overrides (flags). `defaults`: a
    command's own defaults, below the file (`wrap` keeps its store in the user's cache directory).
    Raises ConfigError."""
    environ = dict(os.environ) if environ is None else environ
    data: dict[str, Any] = {}
    if path is None:
        path = environ.get(ENV_PREFIX + "CONFIG") or None
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"config file {path}: cannot read ({e.strerror or e})") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"config file {path}: invalid YAML{where}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping of sections")
        data = loaded
    data = deep_merge(defaults or {}, data)
    data = deep_merge(data, env_overrides(environ))
    env_paths = env_paths_of(environ)
    if overrides:
        data = deep_merge(data, overrides)
        env_paths = {p: n for p, n in env_paths.items() if not sets_key(overrides, p)}  # a flag won
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_error(e, env_paths)) from None
