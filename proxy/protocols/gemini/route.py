"""The Gemini routes (design.md § Gemini API): `POST /{v1,v1beta,v1alpha}/models/{model}:{method}`.
generateContent and streamGenerateContent are compacted, countTokens counts what would be
forwarded now; every other method, and every other /v1beta or /v1alpha path, is passed through to
`gemini.base_url` as it came. A `models/...:method` path is Gemini whatever its version prefix
(google-genai sends /v1 by default). The credential comes as `x-goog-api-key` or the `key` query
parameter: both are forwarded as they came and scope the records alike; the proxy's own calls
carry it as the header (never in a URL the proxy writes). Errors the proxy makes here are in
Google's shape."""

from __future__ import annotations

from aiohttp import web

from proxy.body import BodyPace
from proxy.forward import passthrough
from proxy.protocols import pipeline
from proxy.protocols.base import Route, shaped
from proxy.protocols.gemini import code_assist
from proxy.protocols.gemini.errors import GOOGLE
from proxy.protocols.gemini.protocol import PROTOCOL, model_and_method
from proxy.state import STATE

# One route per version: aiohttp finds a route by its path's literal prefix first, so each
# `/<version>/models` prefix must be literal to win over that version's pass-through.
VERSIONS = ("v1", "v1beta", "v1alpha")
MODEL_PATHS = tuple(f"/{v}/models/{{target:[^/:]+:[A-Za-z]+}}" for v in VERSIONS)
COMPACTED = ("generateContent", "streamGenerateContent")


gemini_route = shaped(GOOGLE)


@gemini_route
async def handle_gemini_passthrough(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return await passthrough(request, state.session, state.cfg.gemini, state.max_body, BodyPace.of(state.cfg.server),
                             base_path="")


CODE_ASSIST_PATH = "/v1internal{tail:[:/].*}"
CODE_ASSIST_METHODS = tuple(f"/v1internal:{m}" for m in (*COMPACTED, "countTokens"))


@gemini_route
async def handle_code_assist(request: web.Request) -> web.StreamResponse:
    """Code Assist (Gemini CLI signed in with Google: `/v1internal:generateContent` and the rest,
    an OAuth bearer token). With `gemini.code_assist_base_url` set, its model calls are compacted
    as the Gemini API's and sent there; anything else, or every call when it is unset, is relayed
    as it came (to Google's endpoint when unset)."""
    state = request.app[STATE]
    section = state.cfg.gemini
    if section.code_assist_base_url is not None and request.method == "POST" and request.path in CODE_ASSIST_METHODS:
        return await pipeline.handle(request, code_assist.PROTOCOL, path=request.rel_url.raw_path,
                                     count_only=request.path.endswith("countTokens"))
    return await passthrough(request, state.session, code_assist.CODE_ASSIST.upstream(state.cfg), state.max_body,
                             BodyPace.of(state.cfg.server), base_path="")


@gemini_route
async def handle_model_call(request: web.Request) -> web.StreamResponse:
    """generateContent / streamGenerateContent compacted; countTokens counted as forwarded now;
    any other method passed through."""
    _, method = model_and_method(request.path)
    if method not in (*COMPACTED, "countTokens"):
        return await handle_gemini_passthrough.__wrapped__(request)  # type: ignore[attr-defined]
    return await pipeline.handle(request, PROTOCOL, path=request.rel_url.raw_path, count_only=method == "countTokens")


# The proxy holds no Gemini key, so a page cannot borrow one: the cross-site guard is not needed.
ROUTES = (*(Route("POST", path, handle_model_call, "gemini", guarded=False) for path in MODEL_PATHS),
          Route("*", "/v1beta/{tail:.*}", handle_gemini_passthrough, guarded=False),
          Route("*", "/v1alpha/{tail:.*}", handle_gemini_passthrough, guarded=False),
          Route("*", CODE_ASSIST_PATH, handle_code_assist, "code_assist", guarded=False))
