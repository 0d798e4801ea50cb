"""Advice never contradicts a measurement in front of it (#34 point 2, #31 point 3): a sweep's
recommendation and its "why" agree with the sweep table (asis wins, a lossless preset wins,
only a lossy one wins, differences within noise); a prediction is labelled as one; a data
straggler's wait is put down to its data phase. Pure logic, no runs."""

from __future__ import annotations

import json
import re

import pytest

from ddptop.analysis.advisor import advise, explain, recommend_from_sweep
from ddptop.analysis.sweep_advice import rate_interval
from ddptop.commands.sweep import step_times
from ddptop.commands.sweep_table import build_rows, render_markdown
from ddptop.commands.tune_report import tune_rows, verdict
from ddptop.commands.tune_search import Trial, preset_point
from ddptop.model.config import RunConfig, preset_config
from ddptop.model.report import advice_line

SCRIPT = ["python", "train.py"]


def run(preset: str, rate: float, ci: tuple[float, float] | None = None, script: bool = True,
        share: float = 0.3, **extra) -> dict:
    """A completed run's summary, as a sweep holds it (a user's script unless `script` is off)."""
    base = RunConfig(nproc=2, script=script)
    config = (preset_config(preset, base).script_dict() if script else preset_config(preset, base).to_dict())
    return {"run_id": f"r-{preset}", "preset": preset, "config": config, "command": SCRIPT if script else None,
            "world_size": 2, "backend": "nccl", "status": "completed", "steps_per_s": rate,
            "steps_per_s_ci": list(ci) if ci else None, "step_ms_p50": 1000.0 / rate,
            "comm_share": share, "exposed_comm_share": share / 2, "ranks": [{"rank": 0}], **extra}


def sweep(*summaries: dict) -> tuple[list[dict], object, object, str]:
    """Rows, recommendation, why (the advisor on the reference run, set against the table) and
    the sweep.md, as `ddptop sweep` makes them; the reference run talks over NVLink."""
    rows = build_rows(list(summaries))
    advice = recommend_from_sweep(rows)
    ref = next(s for s in summaries if s["preset"] in ("asis", "baseline"))
    why = explain(advise(ref, transports={"nvlink"}, hw_links={"nvlink"}), rows)
    return rows, advice, why, render_markdown(rows, advice, "sweep", why)


def speedups_said(text: str) -> dict[str, str]:
    """Every `<preset> 0.82x` the text states."""
    return dict(re.findall(r"([a-z0-9-]+) \(?(\d+\.\d\d)x", text))


def assert_agrees(rows: list[dict], advice, why, md: str) -> None:
    """What the recommendation and the why say about each preset is what the table says."""
    table = {r["preset"]: f"{r['speedup']:.2f}" for r in rows}
    for text in (advice.reason, why.reason if why else ""):
        for name, ratio in speedups_said(text).items():
            if name in table:
                assert table[name] == ratio, (name, ratio, table)
    assert advice.basis == "measured" and "**Recommendation (measured):**" in md
    faster = [r for r in rows if r["speedup"] and r["speedup"] >= 1.03]
    if advice.changes == {}:  # keep the reference: nothing in the table beats it beyond noise
        assert not faster or any(r.get("steps_per_s_ci") for r in rows), faster
    else:
        pick = next(r for r in rows if r["preset"] == advice.preset)
        assert pick["speedup"] >= 1.03
        lossless = [r for r in faster if r["preset"] in ("static", "overlap", "view")]
        if not advice.lossy:
            assert pick["steps_per_s"] == max(r["steps_per_s"] for r in lossless)
        else:
            assert "lossy" in advice.reason
    if why is not None and why.basis == "measured":
        assert "use 100 MB buckets" not in why.reason and "Expected" not in why.reason


def test_asis_wins_the_real_2xh100_nvlink_sweep_and_the_why_does_not_advise_overlap():
    # 2x H100 NV18, GPT: the advisor used to say "use 100 MB buckets ..." under a table that
    # had just measured the overlap preset at 0.82x
    rows, advice, why, md = sweep(run("asis", 32.72), run("static", 24.40), run("bf16", 25.79),
                                  run("overlap", 26.80))
    assert_agrees(rows, advice, why, md)
    assert advice.preset == "asis" and advice.reason.startswith("keep asis: nothing beat it beyond noise")
    assert "overlap 0.82x" in advice.reason and "bf16 0.79x (lossy)" in advice.reason
    assert "a minimum effect of 3%" in advice.reason  # no intervals here: says which noise rule
    assert why.basis == "measured" and "expected overlap to help" in why.reason
    assert "measured it at 0.82x asis: not borne out: it ran slower" in why.reason
    assert "**Why (measured; the advisor on the asis run):**" in md and "use 100 MB buckets" not in md


def test_a_lossless_preset_wins_and_a_lossy_one_within_noise_of_it_is_not_picked():
    rows, advice, why, md = sweep(run("asis", 10.0), run("overlap", 11.5), run("bf16", 11.7))
    assert_agrees(rows, advice, why, md)
    assert advice.preset == "overlap" and not advice.lossy
    assert advice.reason.startswith("overlap is the fastest lossless configuration: 11.50 steps/s, 1.15x asis")
    assert "bf16 (1.17x asis) compresses gradients and is not faster than overlap beyond noise" in advice.reason
    assert "measured it at 1.15x asis: borne out" in why.reason
    slower = recommend_from_sweep(build_rows([run("asis", 10.0), run("overlap", 12.0), run("bf16", 11.0)]))
    assert slower.preset == "overlap" and "bf16 (1.10x asis) compresses gradients and ran slower than overlap" \
        in slower.reason


def test_only_a_lossy_preset_wins_and_says_its_caveat_and_that_no_lossless_one_did():
    rows, advice, why, md = sweep(run("asis", 10.0), run("overlap", 10.1), run("static", 9.0), run("bf16", 13.0))
    assert_agrees(rows, advice, why, md)
    assert advice.preset == "bf16" and advice.lossy and "check that accuracy holds" in advice.reason
    assert "No lossless configuration beat asis beyond noise: keep asis if accuracy must not change" in advice.reason
    assert "measured it at 1.01x asis: not borne out: within noise" in why.reason


def test_differences_within_noise_keep_as_is():
    rows, advice, why, md = sweep(run("baseline", 10.0, script=False), run("overlap", 10.2, script=False),
                                  run("bf16", 10.25, script=False))
    assert_agrees(rows, advice, why, md)
    assert advice.preset == "baseline" and advice.changes == {} and "keep baseline" in advice.reason
    assert "no per-step intervals for these runs, so a minimum effect of 3%" in advice.reason


def test_intervals_decide_when_the_runs_have_them():
    # 8% faster, but the two runs' 95% intervals overlap: noise
    overlapping = [run("asis", 10.0, (9.0, 11.0)), run("overlap", 10.8, (10.5, 11.1))]
    rows, advice, why, md = sweep(*overlapping)
    assert_agrees(rows, advice, why, md)
    assert advice.preset == "asis" and "each run's 95% steps/s interval from its per-step times" in advice.reason
    assert "not borne out: within noise" in why.reason
    assert "9.00-11.00 |" in md  # the table shows the interval the verdict used
    apart = [run("asis", 10.0, (9.8, 10.2)), run("overlap", 10.8, (10.6, 11.0))]
    assert recommend_from_sweep(build_rows(apart)).preset == "overlap"


def test_a_prediction_is_labelled_as_one_wherever_it_is_shown():
    live = advise(run("asis", 10.0, share=0.3), transports={"nvlink"}, hw_links={"nvlink"})
    assert live.preset == "overlap" and live.predicted and live.basis == "predicted"
    assert live.confidence == "low"
    assert live.reason.startswith("Expected, not measured yet (low confidence): ranks talk over NVLink")
    assert "`ddptop sweep --presets asis,overlap` measures it" in live.reason
    assert "At most 1.18x faster" in live.reason  # 15% exposed: the most any DDP setting can remove
    d = json.loads(json.dumps(live.to_dict()))  # the headless summary.json and sweep.json
    assert d["basis"] == "predicted" and d["predicted"] is True and d["confidence"] == "low"
    assert d["label"] == "expected, not measured yet (low confidence)"
    assert d["headline"] == "use preset overlap [expected, not measured yet (low confidence)]"
    assert advice_line(d).startswith("advice: Expected, not measured yet (low confidence):")  # exit summary
    older = {"preset": "overlap", "reason": "ranks talk over NVLink ..."}  # a summary from before labels
    assert advice_line(older) == "advice (expected, not measured yet): ranks talk over NVLink ..."
    # a sweep that ran neither the predicted preset nor its parts keeps the label in its why
    shm = advise(run("asis", 10.0, share=0.5), transports={"shm"})
    why = explain(shm, build_rows([run("asis", 10.0), run("static", 10.1)]))
    assert why.predicted and why.reason.startswith("Not measured in this sweep: Expected, not measured yet")


def shm_why(*summaries: dict, what: str = "sweep") -> tuple[list[dict], object, object, str]:
    """As `sweep`, with the reference run on SHM while the GPUs have NVLink (NCCL_P2P_DISABLE=1):
    the advisor expects bf16-overlap at a 56% comm share."""
    rows = build_rows(list(summaries))
    advice = recommend_from_sweep(rows)
    diagnosis = advise(summaries[0], transports={"shm"}, hw_links={"nvlink"}, env={"NCCL_P2P_DISABLE": "1"})
    assert diagnosis.preset == "bf16-overlap" and diagnosis.predicted
    why = explain(diagnosis, rows, what)
    return rows, advice, why, render_markdown(rows, advice, "sweep", why)


def test_an_unmeasured_remedy_whose_measured_parts_did_not_help_is_not_advised():
    # 2x H200 NV18, GPT, NCCL_P2P_DISABLE=1 (docs/measurements/2026-11-26-h200x2-call1/sweep_gpt_p2p1.md):
    # the why said "compress gradients ... and use 100 MB buckets" under bf16 1.03x and overlap 0.90x
    rows, advice, why, md = shm_why(
        run("asis", 26.38, (26.05, 26.72), share=0.56), run("static", 21.46, (21.21, 21.72)),
        run("view", 20.70, (20.16, 21.28)), run("bf16", 27.12, (26.66, 27.60)),
        run("powersgd", 19.04, (14.34, 28.30)), run("overlap", 23.87, (23.46, 24.30)))
    assert_agrees(rows, advice, why, md)
    assert advice.preset == "asis" and why.basis == "measured" and why.preset is None and not why.changes
    assert why.reason.startswith("Not measured in this sweep: The GPUs have NVLink but NCCL sends over SHM")
    assert "NCCL_P2P_DISABLE=1 turns off P2P" in why.reason and why.severity == "warn"
    assert ("this sweep measured its parts: bf16 1.03x asis (within noise), overlap 0.90x asis (slower): they did "
            "not help here; bf16-overlap itself was not measured: `ddptop sweep --presets asis,bf16-overlap` "
            "measures it.") in why.reason
    assert not re.search(r"compress gradients|use 100 MB buckets|Expected|At most", why.reason)
    assert not re.search(r"\b(static|view|powersgd) \d", why.reason)  # no part of bf16-overlap
    assert "bf16: bf16-overlap without its 100 MB buckets" in why.evidence
    assert "overlap: bf16-overlap without its bf16 hook" in why.evidence
    assert "**Why (measured; the advisor on the asis run):** Not measured in this sweep: The GPUs" in md
    # one part helped, the other ran slower: not advised either, and the one that missed is named
    _, _, mixed, _ = shm_why(run("asis", 10.0, share=0.56), run("overlap", 11.5), run("bf16", 9.0))
    assert mixed.basis == "measured" and "overlap 1.15x asis (faster), bf16 0.90x asis (slower): bf16 did not " \
        "help here" in mixed.reason
    # a part helped and none ran slower: still the advisor's labelled prediction, with what they measured
    _, _, helped, md = shm_why(run("asis", 10.0, share=0.56), run("overlap", 11.5), run("bf16", 10.1))
    assert helped.predicted and helped.preset == "bf16-overlap" and helped.confidence == "medium"
    assert helped.reason.startswith("Not measured in this sweep: The GPUs have NVLink")
    assert "Expected, not measured yet (medium confidence)" in helped.reason
    assert helped.reason.endswith("This sweep measured its parts: overlap 1.15x asis (faster), bf16 1.01x asis "
                                  "(within noise).")
    assert "**Why (expected, not measured yet (medium confidence); the advisor on the asis run):**" in md


def test_a_tune_sets_the_remedy_against_its_trials_of_the_parts():
    summary = run("baseline", 10.0, script=False, share=0.56)
    trials = [trial(1, "baseline", 10.0), trial(2, "overlap", 9.0), trial(3, "bf16", 10.1)]
    rows = tune_rows(trials)
    diagnosis = advise(summary, transports={"shm"})
    assert diagnosis.preset == "bf16-overlap"
    why = explain(diagnosis, rows, "tune")
    assert why.basis == "measured" and ("this tune measured its parts: bf16 1.01x baseline (within noise), overlap "
                                        "0.90x baseline (slower): they did not help here; bf16-overlap itself was "
                                        "not measured: `ddptop sweep --presets baseline,bf16-overlap`") in why.reason
    # a trial of the remedy itself is its measurement, whatever the table calls it
    labelled = Trial(4, preset_point("bf16-overlap"), "neighbour of #2", summary={
        "status": "completed", "steps_per_s": 12.0, "ranks": []}, label="#4 custom")
    why = explain(diagnosis, tune_rows([*trials, labelled]), "tune")
    assert "measured it at 1.20x baseline: borne out" in why.reason and "its parts" not in why.reason


def test_the_remedy_s_own_run_decides_whatever_its_parts_measured():
    rows, advice, why, md = shm_why(run("asis", 10.0, share=0.56), run("bf16", 9.0), run("overlap", 9.5),
                                    run("bf16-overlap", 12.0))
    assert_agrees(rows, advice, why, md)
    assert why.basis == "measured" and "its parts" not in why.reason
    assert ("On the asis run the advisor's rules expected bf16-overlap to help (ranks talk over SHM (through host "
            "memory) and all-reduce is 56% of the step (28% exposed)); this sweep measured it at 1.20x asis: "
            "borne out.") in why.reason
    _, _, why, _ = shm_why(run("asis", 10.0, share=0.56), run("bf16", 11.0), run("bf16-overlap", 9.0))
    assert why.reason.endswith("this sweep measured it at 0.90x asis: not borne out: it ran slower.")
    _, _, why, _ = shm_why(run("asis", 10.0, share=0.56), run("overlap", 12.0), run("bf16-overlap", 10.1))
    assert why.reason.endswith("this sweep measured it at 1.01x asis: not borne out: within noise.")


def test_a_remedy_with_no_part_measured_stays_a_labelled_prediction():
    # static and view are no part of bf16-overlap (each differs from it in more than one part)
    rows, advice, why, md = shm_why(run("asis", 10.0, share=0.56), run("static", 8.0), run("view", 7.8))
    assert why.predicted and why.preset == "bf16-overlap" and why.lossy
    assert why.reason.startswith("Not measured in this sweep: The GPUs have NVLink")
    assert "Expected, not measured yet (medium confidence)" in why.reason and "its parts" not in why.reason
    assert "**Why (expected, not measured yet (medium confidence); the advisor on the asis run):**" in md
    # 2x H200, HF Trainer (docs/measurements/2026-11-26-h200x2-call2/sweep_hf_p2p1.md): the parts failed
    failed = {"status": "failed", "steps_per_s": None, "steps_per_s_ci": None, "error": "RuntimeError: boom"}
    rows = build_rows([run("asis", 11.09, share=0.56), {**run("view", 1.0), **failed},
                       {**run("bf16", 1.0), **failed}, {**run("overlap", 1.0), **failed}])
    why = explain(advise(run("asis", 11.09, share=0.56), transports={"shm"}), rows)
    assert why.predicted and why.reason.startswith("Not measured in this sweep: Expected, not measured yet")
    assert why.reason.endswith("Its parts bf16 and overlap did not complete in this sweep (failed).")


@pytest.mark.parametrize("phase, look", [("data", "its input pipeline"), ("forward", "its GPU"),
                                         ("host between forward and backward", "what its script runs between")])
def test_a_straggler_s_wait_is_its_phase_and_gets_no_communication_remedy(phase, look):
    late = {"rank": 1, "phase": phase, "excess_ms": 5.6, "text": f"rank 1 straggler: {phase} +5.6 ms/step"}
    s = run("asis", 17.9, share=0.6, straggler=late)  # 56 ms steps, 60% "all-reduce": mostly waiting
    advice = advise(s, transports={"shm"}, hw_links={"pcie-host"})
    assert advice.reason.startswith(f"rank 1 straggler: {phase} +5.6 ms/step: look at {look}")
    assert advice.preset is None and advice.changes == {} and not advice.lossy and advice.basis == "measured"
    assert not re.search(r"compress|bucket|hook|bf16|powersgd|overlap", advice.reason, re.I)
    assert f"of the other ranks' all-reduce time, ~5.6 ms/step (10% of the step) is waiting for rank 1's {phase}" \
        in advice.evidence
    assert advice_line(advice.to_dict()).startswith(f"advice (measured): rank 1 straggler: {phase} +5.6 ms/step")
    # under a sweep table the straggler reading is kept as it is
    assert explain(advice, build_rows([s, run("bf16", 20.0)])) is advice


def test_rate_interval_from_per_step_times():
    noisy = [50.0 + (i * 7919 % 13) / 3 for i in range(100)]  # 50-54 ms, no pattern a batch aligns with
    mean = sum(noisy) / len(noisy)
    lo, hi = rate_interval({0: noisy, 1: [40.0] * 100})
    assert lo < 1000.0 / mean < hi and hi - lo < 0.5  # rank 0 is the slower: its mean sets steps/s
    assert rate_interval({0: [50.0] * 19}) is None  # too few steps
    assert rate_interval({}) is None


def test_step_times_read_back_as_the_summary_counts_them(tmp_path):
    lines = [{"rank": r, "step": s, "step_ms": 10.0 + s} for s in range(4) for r in (0, 1)]
    lines[6]["profiled"] = True  # rank 0, step 3
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"rank": 1, "step": 9, "step'  # a cut last line
    (tmp_path / "steps.jsonl").write_text(text)
    assert step_times(tmp_path, warmup=2) == {0: [12.0], 1: [12.0, 13.0]}
    assert step_times(tmp_path / "missing", warmup=0) == {}


def trial(i: int, preset: str, rate: float, ci: tuple[float, float] | None = None) -> Trial:
    source = "baseline" if i == 1 else f"preset {preset}"
    summary = {"status": "completed", "steps_per_s": rate, "steps_per_s_ci": ci, "ranks": []}
    return Trial(i, preset_point(preset), source, summary=summary)


def test_tune_keeps_the_baseline_when_nothing_beats_it_and_marks_that_row():
    trials = [trial(1, "baseline", 10.0), trial(2, "overlap", 10.2), trial(3, "bf16-overlap", 9.0)]
    v = verdict(trials, 2)
    assert v["keep"] and v["recommended"]["trial"] == 1 and v["best"]["trial"] == 2
    assert v["text"].startswith("keep the baseline, #1") and "the fastest, #2" in v["text"]
    assert "a minimum effect of 3%" in v["text"]
    rows = tune_rows(trials, v["recommended"]["trial"])
    assert [r["best"] for r in rows] == [True, False, False]
    won = verdict([trial(1, "baseline", 10.0), trial(2, "overlap", 12.0)], 2)
    assert not won["keep"] and won["recommended"]["trial"] == 2 and won["text"].startswith("#2 (")


def test_the_wiring_tab_shows_the_data_straggler_and_the_prediction_label():
    from ddptop.tui.widgets.wiring_panel import advice_lines

    late = {"rank": 1, "phase": "data", "excess_ms": 5.6}
    shown = " ".join(t.plain for t in advice_lines(advise(run("asis", 17.9, share=0.6, straggler=late),
                                                          transports={"shm"}), width=80))
    assert "rank 1 straggler: data +5.6 ms/step: look at its input pipeline" in " ".join(shown.split())
    assert "compress" not in shown and "lossy" not in shown
    predicted = advise(run("asis", 10.0, share=0.3), transports={"nvlink"}, hw_links={"nvlink"})
    shown = " ".join(" ".join(t.plain for t in advice_lines(predicted, width=80)).split())
    assert "Expected, not measured yet (low confidence)" in shown
    assert shown.startswith("advice: use preset overlap [expected, not measured yet (low confidence)]")


def test_the_wiring_tab_heading_says_what_to_do_and_how_sure():
    from ddptop.tui.widgets.wiring_panel import heading_lines

    predicted = advise(run("asis", 10.0, share=0.56), transports={"shm"}, hw_links={"nvlink"},
                       env={"NCCL_P2P_DISABLE": "1"})
    lines = [t.plain for t in heading_lines(predicted, width=60)]
    assert lines == ["advice: use preset bf16-overlap [expected, not measured yet", "        (medium confidence)]", ""]
    assert heading_lines(predicted, width=120)[0].plain == f"advice: {predicted.headline}"
    assert heading_lines(None) == []  # before the first advice: no heading, the advice section says so
