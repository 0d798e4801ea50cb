"""The Wiring, Captures and alert views with scripted state: NCCL transports parsed from
the real 4x H200 logs against the NVML topology of the same machine (NVML faked at its
boundary, as in test_gpu), the advisor's real advice, a scripted capture, a stall, a
straggler and PowerSGD's warm-up. The real-run capture test is in test_tui.py."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

from test_gpu import SNAPSHOT, fake_pynvml  # the fake NVML of the 4x H200 machine
from textual.widgets import TabbedContent

from ddptop.analysis.advisor import LOSSY_CAVEAT, advise_run
from ddptop.analysis.capture import Capture
from ddptop.analysis.nccl import parse_lines
from ddptop.hw import gpu
from ddptop.model.state import Stall
from ddptop.tui.app import DdpTopApp
from ddptop.tui.messages import CaptureEnded
from ddptop.tui.synthetic import synthetic_state, synthetic_workbench
from ddptop.tui.widgets.captures_panel import CapturesPanel
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.run_alerts import RunAlerts
from ddptop.tui.widgets.run_header import RunHeader
from ddptop.tui.widgets.wiring_panel import SLOWER_STYLE, WiringPanel, wiring_pairs

NCCL_LOGS = Path(__file__).parents[1] / "fixtures" / "nccl"


def flat(text: str) -> str:
    """Whitespace folded: prose in the views wraps to the terminal's width."""
    return " ".join(text.split())


def screen_text(app: DdpTopApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def h200_state(log: str | None, backend: str = "nccl"):  # noqa: ANN201
    """Four ranks on the 4x H200 box: NCCL report from `log`, topology from NVML."""
    state = synthetic_state(4, backend=backend)
    if log is not None:
        state.nccl = parse_lines((NCCL_LOGS / log).read_text().splitlines())
    if backend == "nccl":
        state.topology = gpu.Nvml(module=fake_pynvml(SNAPSHOT)).topology()
    state.advice = advise_run(state.summary(), state.nccl, state.topology, env={})
    return state


def app_for(state, tmp_path: Path) -> DdpTopApp:  # noqa: ANN001
    return DdpTopApp(synthetic_workbench(state, tmp_path), autostart=False, refresh_s=3600)


async def show(app: DdpTopApp, pilot, key: str | None = None) -> None:  # noqa: ANN001
    if key:
        await pilot.press(key)
    app.refresh_views()
    await pilot.pause()


def test_wiring_highlights_shm_where_the_gpus_have_nv18(tmp_path: Path) -> None:
    state = h200_state("h200x4_p2pdisable_shm_info.log")
    ranks, pairs, how = wiring_pairs(state)
    assert ranks == [0, 1, 2, 3] and how == "NCCL nvmlDev"
    ring = [(0, 1), (1, 2), (2, 3), (3, 0)]
    for pair in ring:
        assert (pairs[pair].transport, pairs[pair].hw, pairs[pair].verdict) == ("SHM", "NV18", "slower")
    assert pairs[(0, 2)].transport is None and pairs[(0, 2)].verdict == ""  # not a ring edge
    assert state.advice.severity == "warn"

    async def main() -> None:
        app = app_for(state, tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await show(app, pilot, "5")
            assert app.query_one(TabbedContent).active == "wiring"
            panel = app.query_one(WiringPanel)
            text = panel.text()
            assert "NCCL chose" in text and "hardware link (NVML)" in text
            assert "4 pair(s) slower than the hardware allows" in text
            assert "r0 → r1  SHM although the GPUs have NV18" in text
            assert "r0→GPU0  r1→GPU1  r2→GPU2  r3→GPU3" in text
            assert "NCCL 2.28.9" in text and "network: Socket" in text
            assert "env: NCCL_P2P_DISABLE=1" in text and "ranks: 4" in text
            # The matrices sit side by side at 120 columns; SHM cells carry the alarm style.
            row0 = next(t for t in panel.body.lines if t.plain.startswith("r0 "))
            assert row0.plain.count("SHM") == 1 and row0.plain.count("NV18") == 3
            shm_at = row0.plain.index("SHM")
            assert any(s.start <= shm_at < s.end and str(s.style) == SLOWER_STYLE for s in row0.spans)
            # The advisor's word, its reason and (compression being lossy) the caveat.
            advice = state.advice
            word = f"use preset {advice.preset}" if advice.preset else "keep the current settings"
            assert f"advice: {word}" in text
            # the scripted run has a straggler (advice for it first), and the unused NVLink is said
            assert "NVLink but NCCL sends over SHM" in advice.reason
            assert flat(advice.reason) in flat(text)
            assert all(flat(e) in flat(text) for e in advice.evidence)
            assert (LOSSY_CAVEAT in flat(text)) == advice.lossy
            assert "SHM" in screen_text(app) and "NV18" in screen_text(app)

    asyncio.run(main())


def test_wiring_with_nvlink_flags_nothing(tmp_path: Path) -> None:
    state = h200_state("h200x4_nvlink_info.log")
    _, pairs, _ = wiring_pairs(state)
    labelled = [p for p in pairs.values() if p.transport]
    assert labelled and all(p.transport.startswith("P2P") and p.hw == "NV18" for p in labelled)
    assert not any(p.verdict for p in pairs.values())

    async def main() -> None:
        app = app_for(state, tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await show(app, pilot, "5")
            text = app.query_one(WiringPanel).text()
            assert "slower than the hardware allows" in text  # the legend only
            assert "pair(s)" not in text
            assert "advice:" in text

    asyncio.run(main())


def test_wiring_without_nccl_says_gloo_and_still_advises(tmp_path: Path) -> None:
    state = h200_state(None, backend="gloo")
    assert state.advice is not None

    async def main() -> None:
        app = app_for(state, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await show(app, pilot, "5")
            text = app.query_one(WiringPanel).text()
            heading, blank, first = text.splitlines()[:3]
            assert heading == f"advice: {state.advice.headline}" and blank == ""  # what to do comes first
            assert first == "no NCCL on this run (gloo): transports unknown"
            assert "hardware links unknown" in text
            assert "NCCL chose" not in text
            assert "advice:" in text and flat(state.advice.reason) in flat(text)
            assert "no NCCL on this run (gloo)" in screen_text(app)

    asyncio.run(main())


def test_captures_tab_lists_files_and_summary_and_notifies_once(tmp_path: Path) -> None:
    state = synthetic_state(2)
    cap = Capture(1, 120, 3, "torch", str(tmp_path / "captures" / "1"))
    state.captures[1] = cap
    seen: list[object] = []

    async def main() -> None:
        app = app_for(state, tmp_path)
        async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
            await show(app, pilot, "6")
            text = app.query_one(CapturesPanel).text()
            assert "#1  steps 120-122  torch  scheduled" in text
            cap.status = "done"
            cap.files = {r: [f"{cap.out_dir}/rank{r}.json"] for r in (0, 1)}
            cap.summary = {"comm_ms_mean": 2.5, "ranks": {
                str(r): {"source": "cpu ops", "steps": [120, 121, 122], "step_ms": [10.0, 11.0, 12.0],
                         "comm_ms": 2.0 + r, "compute_ms": None, "overlap_ms": None,
                         "top": [{"name": "aten::addmm", "ms": 4.5}]} for r in (0, 1)}}
            await show(app, pilot)
            await show(app, pilot)  # a second look must not notify again
            text = app.query_one(CapturesPanel).text()
            assert "#1  steps 120-122  torch  done" in text
            assert f"r0 {cap.out_dir}/rank0.json" in text and f"r1 {cap.out_dir}/rank1.json" in text
            assert "r1  comm 3.0 ms  overlap n/a  steps 120-122 (3)" in text
            assert "top aten::addmm 4.5 ms" in text
            # No live run here: `c` says so instead of failing.
            await pilot.press("c")
            await pilot.pause(0.2)
            assert any("no live run to capture" in str(n.message) for n in app._notifications)

    asyncio.run(main())
    ended = [m for m in seen if isinstance(m, CaptureEnded)]
    assert [(m.capture_id, m.status) for m in ended] == [(1, "done")]


def test_stall_straggler_and_powersgd_warm_up_are_shown(tmp_path: Path) -> None:
    state = synthetic_state(4, slow_rank=1)
    state.config = state.config.with_changes(comm_hook="powersgd", powersgd_rank=4, powersgd_start_iter=5000)
    straggler = state.straggler()
    assert straggler is not None and straggler.rank == 1

    async def main() -> None:
        app = app_for(state, tmp_path)
        async with app.run_test(size=(160, 40)) as pilot:
            await show(app, pilot)
            alerts = app.query_one(RunAlerts)
            assert alerts.display and "STALLED" not in screen_text(app)
            assert straggler.describe() in screen_text(app)
            header = str(app.query_one(RunHeader).render())
            assert "hook powersgd r4" in header
            assert "PowerSGD warm-up: plain all-reduce until iteration 5000" in header
            rows = app.query_one(RankTable).row_texts()
            assert rows[1].rstrip().endswith("straggler")

            state.stall = Stall(since=time.time() - 42, bound_s=10.0, last_steps={0: 255, 1: 255, 2: 250, 3: 255},
                                suspects=[2], stacks={0: "/runs/x/stacks/rank0.txt",
                                                      2: "(no answer: process stopped)"})
            await show(app, pilot)
            text = screen_text(app)
            lines = text.splitlines()
            at = next(i for i, x in enumerate(lines) if "STALLED" in x)
            assert re.search(r"STALLED 4[23]s", lines[at]) and "suspects: rank 2" in lines[at]
            assert "last steps r0:256 r1:256 r2:251 r3:256" in lines[at + 1]
            assert "stacks in /runs/x/stacks" in lines[at + 1]
            assert "no answer from rank 2" in lines[at + 1]
            rows = app.query_one(RankTable).row_texts()
            assert rows[2].rstrip().endswith("suspect") and rows[1].rstrip().endswith("straggler")

            state.stall.cleared_at = time.time()  # progress again: the alarm goes
            await show(app, pilot)
            assert "STALLED" not in screen_text(app)

    asyncio.run(main())


def test_lines_view_builds_only_the_lines_in_view_and_catches_up_on_scroll():
    from rich.text import Text
    from textual.app import App

    from ddptop.tui.widgets.lines_view import LinesView

    class One(App[None]):
        CSS = "LinesView { height: 10; }"

        def compose(self):
            yield LinesView(cursor=True)

    async def go() -> None:
        async with One().run_test(size=(40, 20)) as pilot:
            view = pilot.app.query_one(LinesView)
            built: list[int] = []

            def build(gen: int):
                def line(i: int) -> Text:
                    built.append(i)
                    return Text(f"row {i} v{gen}")
                return line

            view.set_lines(view.lines_in_view(64, build(1)))  # first time: every line
            await pilot.pause()
            assert len(built) == 64
            built.clear()
            view.set_lines(view.lines_in_view(64, build(2)))
            assert built == list(range(10))  # only the rows in view
            assert view.lines[9].plain == "row 9 v2" and view.lines[10].plain == "row 10 v1"
            view.scroll_to(y=30, animate=False)
            await pilot.pause()
            built.clear()
            view.set_lines(view.lines_in_view(64, build(3)))
            assert built == list(range(30, 40)) and view.lines[30].plain == "row 30 v3"
            built.clear()
            view.set_lines(view.lines_in_view(65, build(4)))  # a new row: all again
            assert len(built) == 65

    asyncio.run(go())


def test_a_scripts_header_says_what_ddptop_knows_not_the_trainers_defaults() -> None:
    """A user's script's run holds RunConfig.script_view(), the trainer's knobs at their
    defaults: the header still says `model ?` until the ranks name it and no step total (the
    script's loop decides), as when the state held the script's dict (issue 48)."""
    from ddptop.model.config import RunConfig, preset_config
    from ddptop.model.snapshot import snapshot
    from ddptop.model.state import RunState
    from ddptop.tui.widgets.run_header import _setup, warm_up_text

    config = preset_config("powersgd", RunConfig(nproc=2, script=True))
    state = RunState("r", config.script_view(), world_size=2, command=["python", "train.py"])
    state.ranks[0].add({"step": 4, "step_ms": 10.0}, 0, 1.0)
    state.ranks[1].add({"step": 4, "step_ms": 10.0}, 0, 1.0)
    assert [t.plain for t in _setup(snapshot(state, 2.0))][:4] == ["world 2", "step 5", "backend auto", "model ?"]
    demo = RunState("d", preset_config("powersgd", RunConfig(nproc=2, steps=40)), world_size=2)
    assert [t.plain for t in _setup(snapshot(demo, 2.0))][1:5] == ["step 0/40", "backend auto", "model auto",
                                                                   "hook powersgd r1"]
    assert warm_up_text(state.config) == "PowerSGD warm-up: plain all-reduce until iteration 2"
