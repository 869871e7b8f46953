"""The symbol table's definitions, found by name: which rows define ``Router``."""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa

from ssindex.query.conventions import DEFINITION_KINDS
from ssindex.util.arrays import distinct, flags, numeric_view, whole


class Definitions:
    """Rows that define a name, found by the name's last part (``last_part``: ``serve``
    of ``HTTPServer.serve``) in any case.

    Built in Arrow and searched by bisection rather than held in a dict: a server
    builds this table anew on every commit, and filling a dict with the ~50k names of
    a standard-library index took ~65 ms of each reopen, against ~20 ms here (the
    import of ``pyarrow.compute`` included, ~25 ms, which a cold search for words
    alone never pays). No Python value is handed to Arrow (``pa.array``, a scalar
    argument): that imports pandas, 0.15 s of a cold search."""

    def __init__(self, symbols: pa.ChunkedArray, kinds: pa.ChunkedArray) -> None:
        import pyarrow.compute as pc  # here: only queries that name a symbol need it

        symbols = whole(symbols)
        kind_names, kind_codes = distinct(kinds)
        defining = np.array([kind in DEFINITION_KINDS for kind in kind_names.to_pylist()],
                            bool)[kind_codes]
        lengths = pc.utf8_length(symbols)  # a null's length is read, then masked
        named = flags(pc.is_valid(symbols)) & (np.frombuffer(
            lengths.buffers()[1], np.int32)[lengths.offset : lengths.offset + len(lengths)] > 0)
        rows = np.flatnonzero(defining & named).astype(np.int64)
        taken = symbols.take(pa.Array.from_buffers(pa.int64(), len(rows),
                                                   [None, pa.py_buffer(rows)]))
        names = pc.extract_regex(pc.replace_substring(taken, "::", "."),
                                 r"(?P<name>[^.]*)$").field("name")
        folded = pc.ascii_lower(names)
        if not pc.all(pc.string_is_ascii(names)).as_py():  # Python's case mapping, as queries'
            folded = pa.array([name.lower() for name in names.to_pylist()], pa.string())
        order = pc.sort_indices(folded)  # stable: a name's rows stay in row order
        self._folded: list[str] = folded.take(order).to_pylist()
        self._rows = rows[numeric_view(order, np.uint64)]
        self._names = names.take(order)

    def get(self, name: str) -> list[tuple[int, str]]:
        """The rows defining ``name`` in any case, each with the name as defined there."""
        key = name.lower()
        first = bisect.bisect_left(self._folded, key)
        last = bisect.bisect_right(self._folded, key, first)
        return [(int(self._rows[i]), self._names[i].as_py()) for i in range(first, last)]
