"""Callgrind probes for one phase of a request, installed in a server process (`bench/phases.py`).

Python's frames all look alike to callgrind (one C function evaluates them all), so a phase is
measured by switching callgrind's collection on and off where it starts and ends, through the
client-request macros of `valgrind/callgrind.h` (a tiny helper library compiled by phases.py; a
no-op outside valgrind). The phases, on aiohttp's own methods so that the proxy and the bare
forwarder are measured at the same points:

- `first`: a POST's bytes arriving (`RequestHandler.data_received`) to the answer's first body
  write (`StreamResponse.write`): everything a stream's first event waits for in the process;
- `pre`: the same start to the upstream request's start (`ClientSession._request`): the request
  side;
- `answer`: the upstream's answer headers read (`ClientResponse.start`) to the first body write:
  the stream's start;
- `all`: everything after the warm-up.

Run as the server's main: `python bench/phase_probe.py LIB PHASE WARMUP proxy --config ...` or
`... LIB PHASE WARMUP bench/bare_forwarder.py --port ...`.
"""

from __future__ import annotations

import ctypes
import runpy
import sys
from typing import Any, Callable

PHASES = ("first", "pre", "answer", "all")


class Probe:
    """Collection on or off, from the events of a phase; `toggle` flips callgrind's state."""

    def __init__(self, toggle: Callable[[], Any], phase: str, warmup: int,
                 instrument: Callable[[], Any] | None = None) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
        self.toggle, self.phase, self.warmup = toggle, phase, warmup
        # callgrind's instrumentation switched on at the first request: the server starts
        # uninstrumented (importing the proxy instrumented takes many minutes on a loaded
        # machine), and the warm-up runs instrumented code, as the measured requests do
        self.instrument = instrument
        self.on = False
        self.posts = 0  # POSTs arrived (the warm-up ones included)

    def _set(self, on: bool) -> None:
        if on != self.on:
            self.toggle()
            self.on = on

    @property
    def measuring(self) -> bool:
        return self.posts > self.warmup

    def arrived(self, data: bytes) -> None:
        if data[:5] == b"POST ":
            self.posts += 1
            if self.posts == 1 and self.instrument is not None:
                self.instrument()
            if self.measuring and self.phase in ("first", "pre", "all"):
                self._set(True)

    def upstream_started(self) -> None:
        if self.phase == "pre":
            self._set(False)

    def upstream_answered(self) -> None:
        if self.measuring and self.phase == "answer":
            self._set(True)

    def first_write(self) -> None:
        if self.phase in ("first", "answer"):
            self._set(False)


def install(probe: Probe) -> Callable[[], None]:
    """The probe on aiohttp's methods; returns what takes it off again."""
    from aiohttp import client, client_reqrep, web_protocol, web_response

    originals = [(web_protocol.RequestHandler, "data_received"), (client.ClientSession, "_request"),
                 (client_reqrep.ClientResponse, "start"), (web_response.StreamResponse, "write")]
    saved = [(owner, name, owner.__dict__[name]) for owner, name in originals]
    data_received, request, start, write = (f for _, _, f in saved)
    written: set[int] = set()  # the responses whose first write went by (by id, while they live)

    def probed_data_received(self: Any, data: bytes) -> Any:
        probe.arrived(data)
        return data_received(self, data)

    def probed_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe.upstream_started()
        return request(self, *args, **kwargs)

    async def probed_start(self: Any, connection: Any) -> Any:
        resp = await start(self, connection)
        probe.upstream_answered()
        return resp

    async def probed_write(self: Any, data: Any) -> Any:
        result = await write(self, data)
        if id(self) not in written:
            written.add(id(self))
            probe.first_write()
        return result

    async def probed_write_eof(self: Any, data: bytes = b"") -> Any:
        result = await write_eof(self, data)
        if id(self) in written:
            written.discard(id(self))
        else:  # a whole answer (web.Response): its body goes out here
            probe.first_write()
        return result

    write_eof = web_response.StreamResponse.__dict__["write_eof"]
    web_protocol.RequestHandler.data_received = probed_data_received
    client.ClientSession._request = probed_request
    client_reqrep.ClientResponse.start = probed_start
    web_response.StreamResponse.write = probed_write
    web_response.StreamResponse.write_eof = probed_write_eof

    def uninstall() -> None:
        for owner, name, f in saved:
            setattr(owner, name, f)
        web_response.StreamResponse.write_eof = write_eof

    return uninstall


def main(argv: list[str]) -> None:
    lib, phase, warmup, target, *rest = argv
    helper = ctypes.CDLL(lib)
    install(Probe(helper.cg_toggle, phase, int(warmup), helper.cg_instrument))
    sys.argv = [target, *rest]
    if target == "proxy":
        from proxy.cli import main as proxy_main

        raise SystemExit(proxy_main(rest))
    runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
