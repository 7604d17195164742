"""What a request's forwarded body is made of, taken from the previous request of its conversation
for the objects it forwarded too at the same places (issue 39: a request carrying the previous
one's record forwards its envelopes again, but for a head made afresh, the summary and the
annotated system envelope, and its new turn; only those are looked at).
"""

from __future__ import annotations

from itertools import compress, count
from operator import is_not
from typing import Any, Callable, Sequence

from proxy import jsonbody
from proxy.adapter import _COPY_OF

RENDERED = "rendered"  # a request's forwarded items and their written bytes, in its __dict__


def changed(now: Sequence[Any], before: Sequence[Any]) -> list[int]:
    """The places of `now` whose item is not `before`'s there (the same object), in order: every
    place past `before`'s end."""
    n = min(len(now), len(before))
    return [*compress(count(), map(is_not, now[:n], before[:n])), *range(n, len(now))]  # (C-level compares)


def value_written(envelope: Any) -> bytes:
    """An envelope's value as JSON: how chat's and Responses' adapters write an envelope the
    client did not send."""
    return jsonbody.dumps(envelope.value)


def written_parts(request: Any, items: Sequence[Any], at: Callable[[Any], int | None],
                  write: Callable[[Any], bytes], apart: Callable[[Any], bool] | None = None) -> list[bytes | None]:
    """The bytes each forwarded item goes upstream as: None for one `apart` says is not in the array,
    the client's own (`request.written` at `at(item)`) for one it sent, else `write(item)`; the
    previous request's for the items it forwarded too at the same places."""
    written = request.written

    def one(x: Any) -> bytes | None:
        return None if apart is not None and apart(x) else written[j] if (j := at(x)) is not None else write(x)
    return per_item(request, RENDERED, items, one)


def per_item(request: Any, name: str, items: Sequence[Any], fn: Callable[[Any], Any]) -> list[Any]:
    """`fn` of each forwarded item: the previous request's result for the items it forwarded too
    at the same places (kept under `name`), `fn` of the others."""
    owner = request.__dict__.get(_COPY_OF, request)  # (a copy declaring the recall tool: kept where the next reads)
    done = owner.__dict__[name] = read_on(owner.before(name, ((), ())), items, fn)
    return done[1]


def read_on(before: tuple[Sequence[Any], Sequence[Any]], items: Sequence[Any],
            fn: Callable[[Any], Any]) -> tuple[Sequence[Any], list[Any]]:
    """(items, `fn` of each): `before`'s results (its items, and `fn` of each) for the items at
    the same places there, `fn` of the others."""
    seen, theirs = before
    done = list(theirs[:len(items)])
    done += [None] * (len(items) - len(done))
    for i in changed(items, seen):
        done[i] = fn(items[i])
    return items, done
