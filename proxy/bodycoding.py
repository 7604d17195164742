"""Compressed request bodies (`Content-Encoding: zstd | gzip | deflate | br`, design.md § Responses API).

Codex sends its Responses bodies zstd-compressed; other clients gzip theirs. A route that reads
the body decodes it here, then forwards the decoded bytes (without the Content-Encoding header; the
new Content-Length is the decoded size). The size limit is on the decoded size and is enforced
while decoding: a small body that inflates past it (a decompression bomb) is refused with 413
after at most `limit + 1` bytes of output, never held whole.

At most `MAX_CODINGS` codings are undone (no client stacks more; each layer may inflate up to
the limit, so the work is bounded by their number too). Decoding is linear in its output: the
zlib path feeds its input in slices, so no step copies the rest of the body.

Pure functions of bytes; the caller decodes a small body on the event loop within a budget of
output (`budget`: past it, `OverBudget`) and a larger one, or one that passed the budget, in a
worker thread: what a compressed body decodes to is never guessed from its compressed size.
"""

from __future__ import annotations

import io
import zlib
from typing import Any

import brotli
import zstandard

from proxy import errors

CODINGS = ("zstd", "gzip", "x-gzip", "deflate", "br", "identity")
MAX_CODINGS = 2  # Codex sends one (zstd); a body in three layers is an attack, not a client
_STEP = 64 * 1024  # output produced per decompressor call (what the limit check waits on at most)


class OverBudget(Exception):
    """A layer's output passed the `budget` the caller gave (not the limit): decode it elsewhere."""


def codings(header: str | None) -> list[str]:
    """The codings of a Content-Encoding value, in the order they were applied ("" -> none)."""
    if not header:
        return []
    return [c.strip().lower() for c in header.split(",") if c.strip() and c.strip().lower() != "identity"]


def check_codings(header: str | None) -> list[str]:
    """The codings, or a 415 naming the one the proxy cannot decode, or saying there are too many."""
    found = codings(header)
    if len(found) > MAX_CODINGS:
        raise errors.ProxyError(
            415,
            f"Too many Content-Encoding layers ({len(found)}); the proxy decodes at most {MAX_CODINGS}.",
            code="unsupported_content_encoding",
        )
    for c in found:
        if c not in CODINGS:
            raise errors.ProxyError(
                415,
                f"Unsupported Content-Encoding '{c}'; the proxy decodes {', '.join(CODINGS[:-1])}.",
                code="unsupported_content_encoding",
            )
    return found


def decode(raw: bytes, header: str | None, limit: int, budget: int | None = None) -> bytes:
    """`raw` decoded per its Content-Encoding header (the last applied coding first).

    413 once a layer's output passes `limit`; OverBudget once it passes `budget` (smaller than the
    limit: the caller's bound for work on the event loop); 400 for a body that is not what its
    header says."""
    data = raw
    bound = limit if budget is None or budget >= limit else budget
    for coding in reversed(check_codings(header)):
        try:
            data = _DECODERS[coding](data, bound)
        except errors.ProxyError as e:
            if bound < limit and e.status == 413:
                raise OverBudget() from None
            raise
        except (zlib.error, zstandard.ZstdError, brotli.error, EOFError, ValueError) as e:
            raise errors.bad_request(
                f"The request body is not valid {coding} data ({e.__class__.__name__}).", code="invalid_body_encoding"
            ) from None
    return data


def _too_large(limit: int) -> errors.ProxyError:
    return errors.ProxyError(
        413, f"The decoded request body exceeds the {limit} byte limit.", code="request_too_large"
    )


def _zstd(data: bytes, limit: int) -> bytes:
    # A frame may omit its content size (streaming compressors do), and zstandard's one-shot
    # decoders have no output bound: a bounded stream read first stops a bomb at the limit. Only
    # the frame-by-frame pass tells a cut body (the stream read ends it silently); its output is
    # known by then to fit.
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    if len(reader.read(limit + 1)) > limit:
        raise _too_large(limit)
    out = bytearray()
    rest = data
    while rest:
        d = zstandard.ZstdDecompressor().decompressobj()
        out += d.decompress(rest)
        if not d.eof:
            raise _truncated("zstd")
        rest = d.unused_data
    return bytes(out)


def _truncated(coding: str) -> ValueError:
    return ValueError(f"the {coding} data ends early")


def _zlib(data: bytes, limit: int, wbits: int, coding: str) -> bytes:
    """gzip (wbits 31, every member) or zlib/raw deflate, bounded: never more than `_STEP` bytes
    of output per call, so a bomb stops at the limit."""
    out = bytearray()
    view = memoryview(data)
    at = 0
    while True:
        at = _inflate(zlib.decompressobj(wbits), view, at, out, limit, coding)
        # A gzip body may be several members one after the other; trailing zeros are padding.
        if at == len(view) or (view[at] == 0 and not data[at:].strip(b"\x00")):
            return bytes(out)
        if wbits != 31:
            raise ValueError("data after the end of the stream")


def _inflate(d: Any, view: memoryview, at: int, out: bytearray, limit: int, coding: str) -> int:
    """One zlib stream from `view[at:]` onto `out`; the offset after it. The input goes in slices of
    _STEP, so the tail a step leaves unconsumed is at most a slice (handing zlib the whole rest
    copied all of it each step: quadratic, 26 s for 60 MB of level 0)."""
    tail: bytes | memoryview = b""
    while not d.eof:
        if not tail:
            if at >= len(view):
                raise _truncated(coding)
            tail, at = view[at:at + _STEP], min(at + _STEP, len(view))
        got = d.decompress(tail, _STEP)
        out += got
        if len(out) > limit:
            raise _too_large(limit)
        tail = d.unconsumed_tail
    return at - len(d.unused_data)


def _gzip(data: bytes, limit: int) -> bytes:
    return _zlib(data, limit, 31, "gzip")


def _deflate(data: bytes, limit: int) -> bytes:
    # HTTP's "deflate" is the zlib format (RFC 9110 8.4.1.2); some clients send raw deflate.
    try:
        return _zlib(data, limit, 15, "deflate")
    except zlib.error:
        return _zlib(data, limit, -15, "deflate")


def _br(data: bytes, limit: int) -> bytes:
    d = brotli.Decompressor()
    out = bytearray(d.process(data, output_buffer_limit=_STEP))
    while not d.is_finished():
        if len(out) > limit:
            raise _too_large(limit)
        if d.can_accept_more_data():
            raise _truncated("br")  # all input consumed, stream not finished
        out += d.process(b"", output_buffer_limit=_STEP)
    if len(out) > limit:
        raise _too_large(limit)
    return bytes(out)


_DECODERS = {"zstd": _zstd, "gzip": _gzip, "x-gzip": _gzip, "deflate": _deflate, "br": _br}
