"""The chat fake's other answers, as pure functions of the request: `GET /v1/models[/{id}]`,
`POST /v1/embeddings` (deterministic vectors) and the echo of any other `/v1/...` request that
pass-through tests compare byte for byte."""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Any, Callable

import orjson

from proxy.fakes.chat.validate import parse_error
from proxy.fakes.common import FakeError, RecordedRequest, utf8_or_none


def model_obj(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 1700000000, "owned_by": "system"}


def model_answer(path: str, models: list[str]) -> dict[str, Any] | FakeError:
    """`GET /v1/models` (the list) or `GET /v1/models/{id}` (one, or OpenAI's 404)."""
    if path == "/v1/models":
        return {"object": "list", "data": [model_obj(m) for m in models]}
    model = path[len("/v1/models/"):]
    if model not in models:
        return FakeError.openai(404, f"The model '{model}' does not exist", param="model", code="model_not_found")
    return model_obj(model)


def _inputs(inp: Any) -> list[Any] | None:
    """The inputs of an embeddings request: one string or token list, or a list of them."""
    if isinstance(inp, str) or (isinstance(inp, list) and inp and all(isinstance(x, int) for x in inp)):
        return [inp]
    if isinstance(inp, list) and inp:
        return inp
    return None


def embeddings_answer(body: Any, default_dims: int, count: Callable[[str], int]) -> dict[str, Any] | FakeError:
    """OpenAI's answer to `POST /v1/embeddings`, or its 400."""
    if not isinstance(body, dict):
        return parse_error()
    if not isinstance(body.get("model"), str):
        return FakeError.openai(400, "you must provide a model parameter")
    inputs = _inputs(body.get("input"))
    if inputs is None:
        return FakeError.openai(400, "'input' is a required property", param="input")
    dims = body.get("dimensions") or default_dims
    b64 = body.get("encoding_format") == "base64"
    data, tokens = [], 0
    for i, x in enumerate(inputs):
        text = x if isinstance(x, str) else orjson.dumps(x).decode()
        tokens += count(text) if isinstance(x, str) else len(x)
        vec = _embed(text, dims)
        emb: Any = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode() if b64 else vec
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return {"object": "list", "data": data, "model": body["model"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def echo(method: str, path: str, raw_path: str, query: str, rec: RecordedRequest) -> dict[str, Any]:
    """What arrived, for a path the fake does not model: pass-through tests compare it exactly."""
    return {
        "method": method,
        "path": path,
        "raw_path": raw_path,
        "query": query,
        "headers": rec.headers,
        "body_text": utf8_or_none(rec.body),
        "body_b64": base64.b64encode(rec.body).decode(),
    }


def _embed(text: str, dims: int) -> list[float]:
    """A deterministic unit vector from the text's hash (float32-exact values)."""
    raw = b""
    counter = 0
    while len(raw) < 2 * dims:
        raw += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    vals = [(int.from_bytes(raw[2 * k : 2 * k + 2], "big") - 32768) / 32768 for k in range(dims)]
    norm = sum(v * v for v in vals) ** 0.5 or 1.0
    return [struct.unpack("<f", struct.pack("<f", v / norm))[0] for v in vals]
