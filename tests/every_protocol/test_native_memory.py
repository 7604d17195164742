"""What `auto` remembers of the agents' compaction handshakes (proxy/native.py) is bounded: the
model is the client's word, so a client naming a new model on every request must not grow it."""

from __future__ import annotations

from aiohttp import web

from proxy import native


async def test_auto_remembers_at_most_max_known_models_the_oldest_forgotten_first(monkeypatch):
    monkeypatch.setattr(native, "MAX_KNOWN", 3)
    known: dict[object, bool] = {}
    sent: list[str] = []

    async def ask(model: str) -> web.StreamResponse:
        async def forward() -> web.StreamResponse:
            sent.append(model)
            return web.Response(status=200, body=b"{}")

        async def answer() -> web.StreamResponse:
            return web.Response(status=200, body=b"answered here")

        return await native.handshake("auto", known, ("http://up", model), forward, answer, lambda s, b: False)

    for model in ("m0", "m1", "m2", "m3", "m4"):
        await ask(model)
    assert list(known) == [("http://up", "m2"), ("http://up", "m3"), ("http://up", "m4")]
    await ask("m4")  # remembered: the upstream served it, so it goes up without a new entry
    await ask("m0")  # forgotten: asked of the upstream again, remembered again
    assert sent == ["m0", "m1", "m2", "m3", "m4", "m4", "m0"] and len(known) == 3
