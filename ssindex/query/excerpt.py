"""The lines around a result (``--context N``), read from the index, not the disk.

The chunks of one file are contiguous whole-line spans, so a result's neighbours in the
pinned version hold its context: the lines as indexed (secrets redacted, as the results
are), from the same version as the result, even when the file has changed since or the
index was pulled from object storage without its repository.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.util.arrays import distinct


class Excerpts:
    """Context lines of one pinned version's rows (path, start_line, end_line, text)."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows
        self._files: np.ndarray | None = None

    def around(self, row: int, lines: int) -> dict[str, list[str]]:
        """Up to ``lines`` lines before row ``row``'s chunk and after it: ``before`` ends
        on the line above its first, ``after`` starts below its last. Either stops early
        at the file's edge or at a line no chunk holds."""
        if self._files is None:
            self._files = distinct(self.rows.column("path"))[1]
        neighbours = np.flatnonzero(self._files == self._files[row]).tolist()
        starts, ends = self.rows.column("start_line"), self.rows.column("end_line")
        start, end = starts[row].as_py(), ends[row].as_py()
        known: dict[int, str] = {}
        for other in neighbours:
            first, last = starts[other].as_py(), ends[other].as_py()
            if other == row or first > end + lines or last < start - lines:
                continue
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
