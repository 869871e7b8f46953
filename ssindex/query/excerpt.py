"""The lines around a result (``--context N``), read from the index, not the disk.

The chunks of one file are contiguous whole-line spans, so a result's neighbours in the
pinned version hold its context: the lines as indexed (secrets redacted, as the results
are), from the same version as the result, even when the file has changed since or the
index was pulled from object storage without its repository.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.query.filters import RowFilter
from ssindex.util.arrays import numeric_view


class Excerpts:
    """Context lines of one pinned version's rows (path, start_line, end_line, text)."""

    def __init__(self, rows: pa.Table, row_filter: RowFilter) -> None:
        self.rows = rows
        self.row_filter = row_filter
        """Whose encoding of ``path`` numbers each row's file."""

    def around(self, row: int, lines: int) -> dict[str, list[str]]:
        """Up to ``lines`` lines before row ``row``'s chunk and after it: ``before`` ends
        on the line above its first, ``after`` starts below its last. Either stops early
        at the file's edge or at a line no chunk holds."""
        files = self.row_filter.encoding("path")[1]
        starts = numeric_view(self.rows.column("start_line"), np.int32)
        ends = numeric_view(self.rows.column("end_line"), np.int32)
        start, end = int(starts[row]), int(ends[row])
        near = (files == files[row]) & (starts <= end + lines) & (ends >= start - lines)
        near[row] = False
        known: dict[int, str] = {}
        for other in np.flatnonzero(near).tolist():
            first, last = int(starts[other]), int(ends[other])
            text = self.rows.column("text")[other].as_py().split("\n")[: last - first + 1]
            known.update(zip(range(first, last + 1), text, strict=False))
        before = []
        for number in range(start - 1, start - 1 - lines, -1):
            if number not in known:
                break
            before.append(known[number])
        after = []
        for number in range(end + 1, end + 1 + lines):
            if number not in known:
                break
            after.append(known[number])
        return {"before": before[::-1], "after": after}
