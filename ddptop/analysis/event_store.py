"""A trace's events as the summaries read them, kept small: only the complete events some
analysis reads (GPU activities, their launch calls, CPU ops, communication annotations, step
markers), each as one tuple holding only the args read (correlation, device, stream, a
collective's args), with repeated names shared. Iterating gives each back as the dict it came
from less what nothing reads, so ddptop.analysis.trace_analysis and the analyses built on it
run unchanged on a trace streamed from disk, in a fraction of the memory. Pure."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

from ddptop.analysis.plausibility import GPU_CATS, STEP_NAMES
from ddptop.analysis.trace_analysis import (
    COLLECTIVE_ARGS,
    CPU_CATS,
    GPU_ANNOTATION_CATS,
    GPU_COMM_PREFIXES,
    KERNEL_CATS,
    LAUNCH_CATS,
    MEMORY_CATS,
    STEP,
)

KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")
GPU_ARGS = frozenset({"correlation", "device", "stream", *COLLECTIVE_ARGS})  # what a kernel's args are read for
CPU_ARGS = frozenset(COLLECTIVE_ARGS)  # a CPU op's args only say whether it is a collective
LAUNCH_ARGS = frozenset({"correlation"})


def _args(e: dict[str, Any], keep: frozenset[str]) -> dict[str, Any] | None:
    raw = e.get("args")
    if not isinstance(raw, dict):
        return None
    kept = {k: v for k, v in raw.items() if k in keep}
    return kept or None  # no args and args without what is read are read alike ({})


def _is_step(name: str) -> bool:
    return name.startswith(STEP_NAMES) or STEP.match(name) is not None


def slim_args(e: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """Whether any analysis reads this complete event, and the part of its args that is read."""
    cat = str(e.get("cat", "")).lower()
    name = str(e.get("name", ""))
    if cat in KERNEL_CATS or cat in MEMORY_CATS:
        return True, _args(e, GPU_ARGS)
    if cat in LAUNCH_CATS:
        args = _args(e, LAUNCH_ARGS)
        return args is not None and args.get("correlation") is not None or _is_step(name), args
    if cat in CPU_CATS:
        return True, _args(e, CPU_ARGS)
    if cat in GPU_ANNOTATION_CATS:
        return name.startswith(GPU_COMM_PREFIXES) or _is_step(name), None
    return _is_step(name), None


class EventStore(Sequence[dict[str, Any]]):
    """Complete events ('X') that passed ddptop.analysis.plausibility, in their order."""

    def __init__(self) -> None:
        self._items: list[tuple[Any, ...] | dict[str, Any]] = []
        self._shared: dict[Any, Any] = {}  # names, categories, pids: one object each

    def _share(self, value: Any) -> Any:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return self._shared.setdefault((type(value), value), value)
        return value

    def add(self, e: dict[str, Any]) -> bool:
        """Keep `e` (a complete event) if some analysis reads it; whether it was kept."""
        wanted, args = slim_args(e)
        if not wanted:
            return False
        if "name" not in e or "cat" not in e:  # rare: kept as a dict, so a missing key stays missing
            slim = {k: e[k] for k in KEYS if k in e}
            slim["args"] = args
            self._items.append(slim)
        else:
            share = self._share
            self._items.append(("X", share(e["cat"]), share(e["name"]), share(e.get("pid")), share(e.get("tid")),
                                e["ts"], e["dur"], args))
        return True

    def drop_ending_after(self, limit: float) -> int:
        """Leave out the GPU activities that end after `limit` (us); how many."""
        before = len(self._items)
        self._items = [x for x in self._items if not _ends_after(x, limit)]
        return before - len(self._items)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for x in self._items:
            yield x if isinstance(x, dict) else dict(zip(KEYS, x))

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):
            return [x if isinstance(x, dict) else dict(zip(KEYS, x)) for x in self._items[i]]
        x = self._items[i]
        return x if isinstance(x, dict) else dict(zip(KEYS, x))


def _ends_after(x: tuple[Any, ...] | dict[str, Any], limit: float) -> bool:
    cat, ts, dur = (x.get("cat", ""), x["ts"], x["dur"]) if isinstance(x, dict) else (x[1], x[5], x[6])
    return str(cat).lower() in GPU_CATS and ts + dur > limit
