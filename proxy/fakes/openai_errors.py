"""OpenAI's error answers, as both OpenAI fakes (chat in proxy/fakes/chat/, Responses in
proxy/fakes/responses/) send them: the body and message OpenAI gives for a status, a missing key
and a prompt over the model's window."""

from __future__ import annotations

from proxy.fakes.common import FakeError


def status_error(status: int, retry_after: float | int | None = None) -> FakeError:
    """The error OpenAI sends for a status (what `fail_status` returns)."""
    headers = {"Retry-After": _fmt_num(retry_after)} if retry_after is not None else None
    if status == 401:
        return FakeError.openai(
            401,
            "Incorrect API key provided: sk-****. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            code="invalid_api_key",
            headers=headers,
        )
    if status == 429:
        return FakeError.openai(
            429,
            "Rate limit reached for requests. Please try again later.",
            type="requests",
            code="rate_limit_exceeded",
            headers=headers,
        )
    if status == 503:
        return FakeError.openai(503, "The engine is currently overloaded, please try again later.", headers=headers)
    if status >= 500:
        return FakeError.openai(
            status,
            "The server had an error while processing your request. Sorry about that!",
            headers=headers,
        )
    return FakeError.openai(status, f"Fake upstream error (HTTP {status}).", headers=headers)


def key_error(required: str | None, headers: dict[str, str]) -> FakeError | None:
    """OpenAI's 401 when a key is required and the request lacks it (no header at all, or another
    key); None when the request may pass."""
    if required is None or headers.get("authorization") == f"Bearer {required}":
        return None
    if "authorization" not in headers:
        return FakeError.openai(401, "You didn't provide an API key. You need to provide your API key in an "
                                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
    return status_error(401)


def context_length_error(window: int, prompt_tokens: int) -> FakeError:
    """OpenAI's 400 for a chat prompt over the model's context window."""
    return FakeError.openai(
        400,
        f"This model's maximum context length is {window} tokens. However, your messages resulted in "
        f"{prompt_tokens} tokens. Please reduce the length of the messages.",
        "invalid_request_error", "context_length_exceeded", "messages")


def _fmt_num(x: float | int) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
