"""What a Messages request carries to `anthropic.base_url` (it is sent by proxy/protocols/send.py, as every
route's is: the adapter knows Anthropic's overflow, SSE and usage; the route set the error
shape)."""

from __future__ import annotations

from typing import Any

from multidict import CIMultiDict

from proxy.forward import upstream_request_headers

CREDENTIAL_HEADERS = ("x-api-key", "authorization")  # either one feeds the scope HMAC


def upstream_headers(headers: Any, key: str | None) -> CIMultiDict[str]:
    """The client's headers (anthropic-version and anthropic-beta as sent), identity encoding so
    the answer can be checked, `key` (anthropic.api_key) as x-api-key when the client sent no key."""
    return upstream_request_headers(headers, key, identity_encoding=True, key_header="x-api-key")
