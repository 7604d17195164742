"""The folding table of proxy/escaping.py, built with NFKC's quick check first, is the table every
character's normalization gives."""

from __future__ import annotations

import unicodedata

from proxy import escaping


def test_the_fold_table_is_what_normalizing_every_character_gives() -> None:
    plain: dict[int, str | None] = {}
    for cp in range(0x80, 0x10000):
        if 0xD800 <= cp < 0xE000:
            continue
        n = unicodedata.normalize("NFKC", chr(cp))
        if n != chr(cp) and any(ord(x) < 0x80 for x in n):
            plain[cp] = n
    table, _ = escaping._fold_table.__wrapped__()
    assert {cp: r for cp, r in table.items() if r is not None} == {cp: r for cp, r in plain.items()
                                                                  if cp not in table or table[cp] is not None}
    assert len(plain) > 800
