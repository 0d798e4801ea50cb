"""GpuPanel: per-GPU NVML readings with a short utilisation history and the ranks
on each GPU; without NVML, says why and shows each rank's CPU% and RSS. Under the table,
GpuHistory charts the same over the samples kept, in the rows the table leaves.

The sample is duck-typed (`state.gpu.gpus`, each with index, name, util, ...),
read with getattr and defaults, so a sampler with fewer fields still renders."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ddptop.model.report import NA, fmt
from ddptop.model.state import RunState
from ddptop.tui.live import Snapshot
from ddptop.tui.render import fit_columns, fmt_bytes, fmt_rate_kbs, spark
from ddptop.tui.widgets.gpu_history import GpuHistory

NVML_COLUMNS = ("gpu", "name", "util", "memory", "power", "temp", "SM MHz", "PCIe tx/rx B/s",
                "NVLink", "ranks", "util history")
CPU_COLUMNS = ("rank", "pid", "host", "CPU %", "RSS", "CPU % history")
# under the CPU table (no NVML): what the tab shows instead, and where GPU figures come from
CPU_NOTE = ("each rank's process as psutil samples it every second (CPU % of one core, its "
            "resident memory, the last samples on the right); on a machine with NVML this tab "
            "shows each GPU: utilization, memory, power, temperature, clocks, PCIe and NVLink")
# What a narrow terminal leaves out first (the note above the table names them): the GPU's
# name (the note says it), clocks and links before power, utilisation and the ranks.
NVML_DROP = ("name", "SM MHz", "PCIe tx/rx B/s", "NVLink", "power", "util history")
HISTORY_W = 16


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    """The first attribute (or mapping key) of `names` that `obj` has and is not None."""
    for name in names:
        value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if value is not None:
            return value
    return default


def gpu_list(sample: Any) -> list[Any]:
    gpus = _get(sample, "gpus", default=[]) if sample is not None else []
    return list(gpus) if isinstance(gpus, (list, tuple)) else []


def power_w(gpu: Any) -> float | None:
    watts = _get(gpu, "power_w")
    if watts is None and _get(gpu, "power_mw") is not None:
        watts = _get(gpu, "power_mw") / 1000.0
    return watts


def nvlink_text(gpu: Any, rate: tuple[float, float] | None = None) -> str:
    """Active links, and tx/rx throughput when two samples give a rate."""
    active = _get(gpu, "nvlink_active")
    if active is None:
        states = _get(gpu, "nvlink_states")
        if not isinstance(states, (list, tuple)):
            return NA
        active = sum(1 for s in states if s == 1 or s is True)
    text = f"{active} links" if active else "none"
    if rate is not None and active:
        text += f" {fmt_rate_kbs(rate[0])}/{fmt_rate_kbs(rate[1])}"
    return text


def nvlink_rates(history: list[Any]) -> dict[Any, tuple[float, float]]:
    """GPU index -> (tx, rx) KiB/s from the cumulative counters of the last two samples."""
    if len(history) < 2:
        return {}
    a, b = history[-2], history[-1]
    dt = (_get(b, "t", default=0.0) or 0.0) - (_get(a, "t", default=0.0) or 0.0)
    if dt <= 0:
        return {}
    before = {_get(g, "index"): g for g in gpu_list(a)}
    rates = {}
    for g in gpu_list(b):
        old = before.get(_get(g, "index"))
        vals = [_get(x, key) for x in (old, g) if x is not None
                for key in ("nvlink_tx_kib", "nvlink_rx_kib")]
        if old is None or len(vals) != 4 or any(v is None for v in vals):
            continue
        rates[_get(g, "index")] = ((vals[2] - vals[0]) / dt, (vals[3] - vals[1]) / dt)
    return rates


def gpu_pids(gpu: Any) -> set[int]:
    pids = _get(gpu, "pids")
    if pids is None:
        pids = [_get(p, "pid") for p in _get(gpu, "processes", default=()) or ()]
    return {int(p) for p in pids if p is not None}


def ranks_on_gpu(gpu: Any, state: RunState) -> list[int]:
    """Ranks whose process runs on `gpu`: from the sample's pids (or ranks), else
    from the rank's device string (`cuda:N` local to its host)."""
    explicit = _get(gpu, "ranks")
    if isinstance(explicit, (list, tuple)):
        return sorted(int(r) for r in explicit)
    pids = gpu_pids(gpu)
    by_pid = [r for r, rs in state.ranks.items() if rs.hello and rs.hello.pid in pids]
    if by_pid:
        return sorted(by_pid)
    index = _get(gpu, "index")
    return sorted(r for r, rs in state.ranks.items()
                  if rs.hello and rs.hello.device in (f"cuda:{index}",))


def nccl_text(report: Any) -> Text | None:
    """One line on what NCCL chose (from the run's NCCL_DEBUG logs), or None."""
    if report is None or not _get(report, "nccl_lines", default=0):
        return None
    text = Text.assemble(("NCCL ", "bold"), str(_get(report, "version", default="?")))
    nranks = _get(report, "nranks")
    if nranks:
        text.append(f"  {nranks} ranks")
    network = _get(report, "network")
    if network:
        text.append_text(Text.assemble(("  network ", "dim"), str(network)))
    transports = _get(report, "transports", default={}) or {}
    labels = {(a, b): _get(t, "label", default="?") for (a, b), t in sorted(transports.items())}
    if labels:
        kinds = sorted(set(labels.values()))
        if len(kinds) == 1:
            text.append_text(Text.assemble(("  transport ", "dim"), f"{kinds[0]} (all pairs)"))
        else:
            pairs = ", ".join(f"{a}→{b} {lab}" for (a, b), lab in list(labels.items())[:6])
            text.append_text(Text.assemble(("  transports ", "dim"), pairs))
    try:
        algos = report.algorithms()
    except Exception:  # noqa: BLE001 - a foreign report shape must not break the panel
        algos = {}
    if algos:
        text.append_text(Text.assemble(("  algorithms ", "dim"), "; ".join(
            f"{op} {'/'.join(sorted(v))}" for op, v in sorted(algos.items()))))
    return text


class GpuPanel(Vertical):
    """Call `show(snapshot)` to refresh."""

    def compose(self) -> ComposeResult:
        yield Static("", id="gpu-note")
        yield Static("", id="nccl-note")
        yield DataTable(id="gpu-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="gpu-foot")
        yield GpuHistory("", id="gpu-history")

    def on_mount(self) -> None:
        self._mode: tuple[str, ...] = ()

    def _set_mode(self, columns: tuple[str, ...]) -> DataTable:
        table = self.query_one("#gpu-table", DataTable)
        if columns != self._mode:
            table.clear(columns=True)
            for name in columns:
                table.add_column(name, key=name)
            self._mode = columns
        return table

    def show(self, snap: Snapshot) -> None:
        state = snap.state
        gpus = gpu_list(state.gpu)
        nccl = nccl_text(state.nccl)
        nccl_note = self.query_one("#nccl-note", Static)
        nccl_note.display = nccl is not None
        if nccl is not None:
            _update(nccl_note, nccl)
        note = self.query_one("#gpu-note", Static)
        foot = self.query_one("#gpu-foot", Static)
        foot.display = not gpus
        if gpus:
            hidden = self._show_gpus(gpus, state)
            driver = _get(state.gpu, "driver", default="")
            names = sorted({str(_get(g, "name", default="?")) for g in gpus})
            text = Text.assemble(("NVML", "bold"), f"  {len(gpus)} GPU(s) {', '.join(names)}",
                                 ("  driver ", "dim"), str(driver or "?"))
            if hidden:  # a narrow terminal: say what the table leaves out, not just cut it
                text.append(f"  (too narrow for {', '.join(hidden)})", style="dim")
            _update(note, text)
        else:
            reason = state.gpu_unavailable.removeprefix("NVML not available: ")
            _update(note, Text.assemble(("no NVML: ", "bold #c79100"),
                                        (reason or "no GPU sample yet", "bold #c79100"),
                                        ("  (showing each rank's CPU and memory instead)", "dim")))
            self._show_procs(state)
            _update(foot, Text(CPU_NOTE, style="dim"))
        self.query_one(GpuHistory).show(state)

    def _util_history(self, state: RunState) -> dict[Any, list[float]]:
        history: dict[Any, list[float]] = {}
        for sample in list(state.gpu_history)[-HISTORY_W:]:
            for gpu in gpu_list(sample):
                util = _get(gpu, "util_pct", "util")
                if util is not None:
                    history.setdefault(_get(gpu, "index"), []).append(float(util))
        return history

    def _show_gpus(self, gpus: list[Any], state: RunState) -> list[str]:
        """Fill the NVML table with the columns that fit its width; returns those left out."""
        history = self._util_history(state)
        rates = nvlink_rates(list(state.gpu_history)[-2:])
        rows = [(str(_get(gpu, "index", default="?")), self._gpu_cells(gpu, state, history, rates))
                for gpu in gpus]
        widths = {name: max([cell_len(name)] + [cell_len(str(cells[i])) for _, cells in rows])
                  for i, name in enumerate(NVML_COLUMNS)}
        table = self.query_one("#gpu-table", DataTable)
        room = (table.size.width or 200) - 2  # 2: a vertical scrollbar, when the GPUs overflow
        columns = fit_columns(NVML_COLUMNS, widths, room, NVML_DROP)
        table = self._set_mode(tuple(columns))
        keep = [NVML_COLUMNS.index(c) for c in columns]
        self._fill(table, [(key, [cells[i] for i in keep]) for key, cells in rows])
        return [c for c in NVML_COLUMNS if c not in columns and c != "name"]  # the note names them

    @staticmethod
    def _gpu_cells(gpu: Any, state: RunState, history: dict[Any, list[float]],
                   rates: dict[Any, tuple[float, float]]) -> list[Any]:
        index = _get(gpu, "index", default="?")
        used, total = _get(gpu, "mem_used"), _get(gpu, "mem_total")
        memory = f"{fmt_bytes(used)}/{fmt_bytes(total)}" if total else fmt_bytes(used)
        limit = _get(gpu, "power_limit_w")
        if limit is None and _get(gpu, "power_limit_mw") is not None:
            limit = _get(gpu, "power_limit_mw") / 1000.0
        power = fmt(power_w(gpu), ".0f") + ("" if limit is None else f"/{limit:.0f}") + " W"
        return [
            str(index), str(_get(gpu, "name", default="?")),
            Text(fmt(_get(gpu, "util_pct", "util"), ".0f") + " %", justify="right"),
            memory, power,
            Text(fmt(_get(gpu, "temp_c"), ".0f") + " C", justify="right"),
            Text(fmt(_get(gpu, "sm_clock_mhz", "sm_clock"), ".0f"), justify="right"),
            f"{fmt_rate_kbs(_get(gpu, 'pcie_tx_kbs'))}/{fmt_rate_kbs(_get(gpu, 'pcie_rx_kbs'))}",
            nvlink_text(gpu, rates.get(index)),
            ",".join(map(str, ranks_on_gpu(gpu, state))) or "-",
            spark(history.get(index, []), HISTORY_W, 0.0, 100.0),
        ]

    def _show_procs(self, state: RunState) -> None:
        table = self._set_mode(CPU_COLUMNS)
        history = list(state.proc_history)[-HISTORY_W * 2:]
        rows = []
        for r in sorted(state.ranks):
            hello = state.ranks[r].hello
            pid = hello.pid if hello else None
            stats = state.proc_stats.get(pid) if pid is not None else None
            cpu, rss = (stats if stats else (None, None))
            rows.append((str(r), [
                str(r), str(pid or "-"), hello.host if hello else "-",
                Text(fmt(cpu, ".0f"), justify="right"),
                Text(fmt_bytes(rss) if rss is not None else NA, justify="right"),
                spark([s[pid][0] for s in history if pid in s], HISTORY_W * 2, 0.0) if pid is not None else "",
            ]))
        self._fill(table, rows)

    @staticmethod
    def _fill(table: DataTable, rows: list[tuple[str, list[Any]]]) -> None:
        keys = [k for k, _ in rows]
        if [rk.value for rk in table.rows] != keys:
            table.clear()
            for key, cells in rows:
                table.add_row(*cells, key=key)
            return
        for key, cells in rows:
            for col, value in zip(table.columns, cells):
                table.update_cell(key, col, value)


def _update(widget: Static, text: Text) -> None:
    """Repaint only on change (a Static update costs a layout pass)."""
    if getattr(widget, "_ddptop_shown", None) != text:
        widget._ddptop_shown = text  # type: ignore[attr-defined]
        widget.update(text)
