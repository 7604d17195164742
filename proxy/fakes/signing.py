"""Opaque tokens a fake hands out and checks when they come back, the way providers sign what
only they may read: OpenAI's reasoning `encrypted_content` and `compaction` items, Anthropic's
thinking `signature` and `redacted_thinking` data. A token is base64url(JSON payload) + "." +
base64url(HMAC-SHA256 over it); any change to it fails `verify`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any

import orjson


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


class Signer:
    def __init__(self, key: bytes | None = None) -> None:
        self.key = key or secrets.token_bytes(32)  # per fake instance: tokens of another fake fail

    def _mac(self, kind: str, data: bytes) -> bytes:
        return hmac.new(self.key, kind.encode() + b"\0" + data, hashlib.sha256).digest()

    def sign(self, kind: str, payload: Any) -> str:
        data = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
        return _b64(data) + "." + _b64(self._mac(kind, data))

    def verify(self, kind: str, token: Any) -> Any | None:
        """The payload of a token this signer made for `kind`, or None (tampered, foreign, garbage)."""
        if not isinstance(token, str) or token.count(".") != 1:
            return None
        body, mac = token.split(".")
        try:
            data, got = _unb64(body), _unb64(mac)
        except (ValueError, TypeError):
            return None
        if not hmac.compare_digest(got, self._mac(kind, data)):
            return None
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
