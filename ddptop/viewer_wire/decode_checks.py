"""What every decoder of a viewer snapshot shares: the one error it raises, and the checks
of plain scalar values (JSON keeps 3 and 3.0, true and 1 apart: so do these). Pure."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any


class ViewerProtocolError(ValueError):
    """A line, frame or snapshot that does not follow the viewer protocol; `reason` is short.
    (Defined here, the lowest of the viewer_wire modules; viewer_protocol exports it.)"""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def bad(path: str, what: str) -> typing.NoReturn:
    raise ViewerProtocolError(f"bad snapshot: {path}: {what}")


Dec = Callable[[Any, str], Any]  # (plain value, field path for the error) -> object


def _dec_int(x: Any, path: str) -> int:
    if type(x) is not int:
        bad(path, f"expected an integer, got {type(x).__name__}")
    return x


def _dec_float(x: Any, path: str) -> float:
    if type(x) is not float and type(x) is not int:  # JSON keeps 3 and 3.0 apart: so do we
        bad(path, f"expected a number, got {type(x).__name__}")
    return x


def _dec_str(x: Any, path: str) -> str:
    if type(x) is not str:
        bad(path, f"expected a string, got {type(x).__name__}")
    return x


def _dec_bool(x: Any, path: str) -> bool:
    if type(x) is not bool:
        bad(path, f"expected true/false, got {type(x).__name__}")
    return x


def _dec_none(x: Any, path: str) -> None:
    if x is not None:
        bad(path, "expected null")


def _dec_json(x: Any, path: str) -> Any:
    return x  # free-form plain data (config, facts, summaries): json.loads made nothing else


SCALARS: dict[Any, Dec] = {int: _dec_int, float: _dec_float, str: _dec_str, bool: _dec_bool,
                           type(None): _dec_none, Any: _dec_json}


_TYPES: dict[Any, frozenset[type]] = {int: frozenset({int}), float: frozenset({int, float}),
                                      str: frozenset({str}), bool: frozenset({bool}),
                                      type(None): frozenset({type(None)})}


def scalar_types(tp: Any) -> frozenset[type] | None:
    """The Python types a scalar (or scalar | None) annotation admits; None for others."""
    if tp in _TYPES:
        return _TYPES[tp]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        parts = [scalar_types(a) for a in typing.get_args(tp)]
        return frozenset().union(*parts) if all(parts) else None  # type: ignore[arg-type]
    return None


def int_keys(keys: list[str], path: str) -> list[int]:
    """JSON object keys written from ints ("3", "-1") back to ints; anything else is refused."""
    try:
        ints = list(map(int, keys))
    except ValueError:
        ints = []
    if list(map(str, ints)) != keys:
        bad(path, "keys are not all integers")
    return ints
