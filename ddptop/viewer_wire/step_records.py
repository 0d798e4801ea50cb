"""A rank's step records on the wire: as columns, integers as JSON lists and floats as
base64 of little-endian float64, checked on the way back. Pure."""

from __future__ import annotations

import array
import base64
import binascii
import itertools
import math
import sys
from collections.abc import Iterable
from typing import Any

from ddptop.viewer_wire.decode_checks import bad

MAX_RECORD_KEYS = 64

_NAN = math.nan
_SWAP = sys.byteorder == "big"  # floats travel little-endian


def records_to_wire(records: Iterable[dict[str, float]]) -> dict[str, Any]:
    """Step records as columns: a key's values are a JSON list when all are integers (null:
    absent), else base64 of little-endian float64 (NaN: absent). Writing and reading a float
    as JSON text costs ~1 us, and a 64-rank window holds 200k of them; the binary column is
    ten times cheaper both ways. Records are finite numbers (the rank protocol checks), so NaN
    is free to mean "absent"; an int in a column that also holds floats comes back as the
    equal float."""
    recs = list(records)
    layouts = set(map(tuple, recs))  # the records' keys, in order
    keys = list(dict.fromkeys(itertools.chain.from_iterable(layouts)))
    if len(layouts) == 1:  # every record has the same keys: columns at C speed
        columns: Iterable[Any] = zip(*map(dict.values, recs), strict=True)
    else:
        columns = (list(map(dict.get, recs, itertools.repeat(key))) for key in keys)
    cols: list[Any] = []
    for key, values in zip(keys, columns):
        kinds = set(map(type, values))
        if kinds <= {int, type(None)}:
            cols.append(list(values))
            continue
        if type(None) in kinds:
            values = list(map(dict.get, recs, itertools.repeat(key), itertools.repeat(_NAN)))
        if not kinds <= {int, float, type(None)}:
            values = [v if type(v) is int or type(v) is float else _NAN for v in values]
        column = array.array("d", values)
        if _SWAP:
            column.byteswap()
        cols.append(base64.b64encode(column.tobytes()).decode("ascii"))
    return {"n": len(recs), "keys": keys, "cols": cols}


def records_from_wire(x: Any, path: str, maxlen: int) -> list[dict[str, float]]:
    if type(x) is not dict or x.keys() != {"n", "keys", "cols"}:
        bad(path, "expected {n, keys, cols}")
    n, keys, cols = x["n"], x["keys"], x["cols"]
    if type(n) is not int or not 0 <= n <= maxlen:
        bad(path, f"record count {n!r} not in 0..{maxlen}")
    if (type(keys) is not list or type(cols) is not list or len(keys) != len(cols)
            or len(keys) > MAX_RECORD_KEYS or len(set(keys)) != len(keys)
            or not all(type(k) is str and 0 < len(k) <= 64 for k in keys)):
        bad(path, "bad record keys")
    columns: list[list[Any]] = []
    sparse = []  # keys some records lack
    for key, col in zip(keys, cols, strict=True):
        if type(col) is str:
            try:
                raw = base64.b64decode(col, validate=True)
            except (binascii.Error, ValueError):
                bad(path, f"column {key!r} is not base64")
            if len(raw) != 8 * n:
                bad(path, f"column {key!r} holds {len(raw)} bytes for {n} records")
            column = array.array("d")
            column.frombytes(raw)
            if _SWAP:
                column.byteswap()
            values: list[Any] = column.tolist()
            if math.inf in values or -math.inf in values:
                bad(path, f"column {key!r} holds an infinite value")
            if any(map(math.isnan, values)):
                values = [None if v != v else v for v in values]
        elif type(col) is list and len(col) == n and set(map(type, col)) <= {int, type(None)}:
            values = col
        else:
            bad(path, f"column {key!r} is neither integers nor base64 floats")
        if None in values:
            sparse.append(key)
        columns.append(values)
    records = [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)] if keys else [
        {} for _ in range(n)]
    for key in sparse:
        for rec in records:
            if rec[key] is None:
                del rec[key]
    return records
