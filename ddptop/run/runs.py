"""Past and present runs side by side: rows from summary.json / config.json in the
runs directory, the comparison table with speedup vs a reference run, and its
Markdown export. Pure except `load_runs` and `export_markdown`; no UI, no torch.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptop.model.config import RunConfig
from ddptop.model.report import fmt, fmt_step_rate, markdown_grid
from ddptop.model.text import printable
from ddptop.run.untrusted import read_json_object

MAX_EARLIER = 200  # earlier runs listed from disk (newest kept)
# Most telling first: a narrow terminal scrolls the long settings column off, not the speedup.
HEADERS = ("run", "preset", "steps/s", "speedup", "p50 ms", "samples/s", "status", "ranks",
           "model", "settings")


@dataclass(frozen=True)
class RunRow:
    run_id: str
    preset: str
    settings: str  # RunConfig.describe()
    world_size: int | None
    backend: str | None
    model: str | None
    steps_per_s: float | None
    samples_per_s: float | None
    step_ms_p50: float | None
    status: str
    this_session: bool = False
    run_dir: str = ""

    @property
    def key(self) -> str:
        """What tells two rows apart: a copied run dir holds the same run id twice."""
        return self.run_dir or self.run_id


@dataclass(frozen=True)
class RunsTable:
    rows: list[RunRow]
    reference_id: str | None
    speedups: dict[str, float | None]
    notes: dict[str, str]  # run_id -> why there is no speedup

    def cells(self, row: RunRow, short: bool = False) -> list[str]:
        """One row as display strings, in HEADERS order. `short` drops the preset
        from the run id (it has its own column) for narrow screens. Every cell is text from
        files anyone who can write the runs dir may have written: control characters escaped
        (the views show it as plain text, never markup)."""
        speed = self.speedups.get(row.run_id)
        if row.run_id == self.reference_id:
            speedup = "1.00x (ref)"
        elif speed is not None:
            speedup = f"{speed:.2f}x"
        else:
            speedup = self.notes.get(row.run_id, "-")
        run_id = row.run_id.replace(f"-{row.preset}-", "-") if short else row.run_id
        cells = {
            "run": run_id + ("" if row.this_session else " *"),
            "preset": row.preset,
            "steps/s": fmt_step_rate(row.steps_per_s, "-"),
            "speedup": speedup,
            "p50 ms": fmt(row.step_ms_p50, ".1f", "-"),
            "samples/s": fmt(row.samples_per_s, ".1f", "-"),
            "status": row.status,
            "ranks": "-" if row.world_size is None else str(row.world_size),
            "model": row.model or "-",
            "settings": row.settings,
        }
        return [printable(cells[h]) for h in HEADERS]


def describe_config(config: dict[str, Any] | None) -> str:
    """RunConfig.describe() for a stored config dict; tolerant of old/foreign fields."""
    if not isinstance(config, dict):
        return "?"
    known = {f.name for f in dataclasses.fields(RunConfig)}
    try:
        return RunConfig(**{k: v for k, v in config.items() if k in known}).describe()
    except Exception:  # noqa: BLE001 - a field of any type a file's writer chose: not a config we know
        return "?"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any, limit: int = 200) -> str | None:
    """A string field as read (cut to `limit`), None for anything else (a JSON object, a
    number, an empty string): a file's field is data, of whatever type its writer chose."""
    if not isinstance(value, str) or not value:
        return None
    return value if len(value) <= limit else value[: limit - 1] + "…"


def row_from_summary(summary: dict[str, Any], run_dir: Path | str = "",
                     this_session: bool = False) -> RunRow:
    config: dict[str, Any] = summary["config"] if isinstance(summary.get("config"), dict) else {}
    world = summary.get("world_size")
    return RunRow(
        run_id=_text(summary.get("run_id")) or Path(run_dir).name,
        preset=_text(summary.get("preset")) or _text(config.get("preset")) or "?",
        settings=describe_config(config),
        world_size=world if isinstance(world, int) and not isinstance(world, bool) else None,
        backend=_text(summary.get("backend")),
        model=_text(summary.get("model")),
        steps_per_s=_num(summary.get("steps_per_s")),
        samples_per_s=_num(summary.get("samples_per_s")),
        step_ms_p50=_num(summary.get("step_ms_p50")),
        status=_text(summary.get("status")) or "?",
        this_session=this_session,
        run_dir=str(run_dir),
    )


def row_from_config(config: dict[str, Any], run_dir: Path) -> RunRow:
    """A run with no summary.json: still running elsewhere, or killed hard."""
    launch: dict[str, Any] = config["_launch"] if isinstance(config.get("_launch"), dict) else {}
    nproc = config.get("nproc")
    ddp = config.get("ddp", True)
    return RunRow(
        run_id=_text(launch.get("run_id")) or run_dir.name,
        preset=_text(config.get("preset")) or "?",
        settings=describe_config(config),
        world_size=(nproc if ddp else 1) if isinstance(nproc, int) and not isinstance(nproc, bool) else None,
        backend=None, model=None, steps_per_s=None, samples_per_s=None, step_ms_p50=None,
        status="no summary", run_dir=str(run_dir),
    )


def load_runs(runs_dir: Path, limit: int = MAX_EARLIER) -> list[RunRow]:
    """Every run recorded under `runs_dir` (newest `limit`), oldest first. Whatever is in the
    dir is data (untrusted: regular files only, bounded, any field of any type)."""
    try:
        dirs = sorted((p for p in Path(runs_dir).iterdir() if p.is_dir()), key=lambda p: p.name)
    except OSError:
        return []
    rows = []
    for run_dir in dirs[-limit:]:
        summary = read_json_object(run_dir / "summary.json")
        if summary is not None:
            rows.append(row_from_summary(summary, run_dir))
            continue
        config = read_json_object(run_dir / "config.json")
        if config is not None:
            rows.append(row_from_config(config, run_dir))
    return rows


def merge_rows(mine: list[RunRow], on_disk: list[RunRow]) -> list[RunRow]:
    """This session's rows win over their own files on disk (the same run dir); oldest first
    (run ids start with a timestamp)."""
    seen = {os.path.abspath(r.run_dir) for r in mine if r.run_dir}
    merged = [r for r in on_disk if os.path.abspath(r.run_dir) not in seen] + list(mine)
    return sorted(merged, key=lambda r: (r.run_id, r.key))


def pick_reference(rows: list[RunRow], chosen: str | None = None) -> RunRow | None:
    """The chosen run if listed, else the first 'baseline' preset run of this
    session, else the first of this session, else the first listed at all."""
    by_id = {r.run_id: r for r in rows}
    if chosen in by_id:
        return by_id[chosen]
    for pool in ([r for r in rows if r.this_session], rows):
        for row in pool:
            if row.preset == "baseline":
                return row
        if pool:
            return pool[0]
    return None


def _comparable(a: RunRow, b: RunRow) -> str:
    """'' if a's throughput can be compared with b's, else why not (short)."""
    for name in ("model", "backend"):
        x, y = getattr(a, name), getattr(b, name)
        if x and y and x != y:
            return f"other {name}"
    return ""


def build_table(rows: list[RunRow], chosen: str | None = None) -> RunsTable:
    ref = pick_reference(rows, chosen)
    speedups: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for row in rows:
        speedups[row.run_id] = None
        if ref is None or ref.steps_per_s is None or row.steps_per_s is None:
            continue
        why = _comparable(row, ref)
        if why:
            notes[row.run_id] = why
            continue
        speedups[row.run_id] = row.steps_per_s / ref.steps_per_s if ref.steps_per_s > 0 else None
    return RunsTable(rows=rows, reference_id=ref.run_id if ref else None, speedups=speedups,
                     notes=notes)


def markdown(table: RunsTable) -> str:
    text_cols = ("run", "preset", "settings", "model", "status")
    grid = markdown_grid(HEADERS, [table.cells(row) for row in table.rows],
                         [h not in text_cols for h in HEADERS])
    ref = table.reference_id or "none"
    return grid + f"\n\nSpeedup: steps/s relative to run {ref}. `*`: a run from an earlier ddptop session.\n"


def export_markdown(table: RunsTable, runs_dir: Path, now: float | None = None) -> Path:
    """Write the table to `<runs_dir>/runs-<timestamp>.md`; returns the path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    path = Path(runs_dir) / f"runs-{stamp}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(table))
    return path
