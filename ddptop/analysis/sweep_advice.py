"""What a sweep or tune measured, as a recommendation the table in front of it bears out: the
fastest lossless configuration, the fastest lossy one with its caveat, or keep the reference
(asis, else baseline) when nothing beats it beyond noise; and the advisor's prediction for the
reference run set against what was measured (`explain`). Noise is each run's 95% steps/s
interval from its per-step times (`rate_interval`) where the rows carry one, and always a
minimum effect of NOISE (whole runs of one script vary by more than their per-step spread).

Pure: rows (dicts) in, an Advice out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ddptop.analysis.across_runs import ACROSS
from ddptop.analysis.advice import LOSSY_CAVEAT, NOISE, Advice, is_lossy
from ddptop.model.config import DDP_KNOBS, PRESETS, RunConfig
from ddptop.model.figures.stats import t975

BATCHES = 10  # consecutive batches of steps whose means are treated as independent
MIN_STEPS = 20  # fewer measured steps on a rank: no interval


def rate_interval(step_ms: Mapping[int, Sequence[float]]) -> tuple[float, float] | None:
    """The 95% interval of a run's steps/s from each rank's measured step times (ms): the
    slowest rank's, as the summary's steps/s is 1000 / its mean step. Batch means (10
    consecutive batches) so that neighbouring steps, which are correlated, do not make it
    too narrow. None when any rank has fewer than MIN_STEPS steps."""
    if not step_ms or any(len(v) < MIN_STEPS for v in step_ms.values()):
        return None
    times = max(step_ms.values(), key=lambda v: sum(v) / len(v))
    size = len(times) // BATCHES
    means = [sum(times[i * size:(i + 1) * size]) / size for i in range(BATCHES)]
    mean = sum(means) / BATCHES
    sd = math.sqrt(sum((m - mean) ** 2 for m in means) / (BATCHES - 1))
    half = t975(BATCHES - 1) * sd / math.sqrt(BATCHES)
    if mean - half <= 0:
        return None
    return 1000.0 / (mean + half), 1000.0 / (mean - half)


@dataclass(frozen=True)
class Measured:
    """One completed run of a sweep (or trial of a tune) as the recommendation sees it."""

    name: str  # as the table names it: a preset, asis, or a tune trial's label
    preset: str  # the preset it ran (a tune trial's nearest: "custom" when none)
    rate: float
    ci: tuple[float, float] | None
    lossy: bool
    changes: dict[str, Any]
    trial: int = 0  # a tune's trial number
    runs: int = 1  # runs folded into `rate` (their median) and `ci` (across them)


def _lossy(row: Mapping[str, Any]) -> bool:
    if "lossy" in row:
        return bool(row["lossy"])
    hook = str((row.get("in_effect") or {}).get("comm_hook") or "")  # a script's own hook
    if "compress" in hook or "powerSGD" in hook:
        return True
    return row.get("preset") in PRESETS and is_lossy(row["preset"])


def measured(rows: Sequence[Mapping[str, Any]]) -> list[Measured]:
    """The completed DDP runs among `rows` (`single`, the per-GPU ceiling, is no DDP setting)."""
    out = []
    for r in rows:
        if r.get("status") != "completed" or not r.get("steps_per_s") or r.get("preset") == "single":
            continue
        ci = r.get("steps_per_s_ci")
        preset = str(r.get("preset"))
        changes = r.get("point") or (PRESETS[preset].settings if preset in PRESETS else {})
        out.append(Measured(str(r.get("name") or preset), preset, float(r["steps_per_s"]),
                            (float(ci[0]), float(ci[1])) if ci else None, _lossy(r), dict(changes),
                            runs=int(r.get("runs") or 1)))
    return out


def reference(done: Sequence[Measured]) -> Measured | None:
    """What speedups are measured against: the script as it is (asis), else baseline, else
    the first run that completed."""
    for name in ("asis", "baseline"):
        ref = next((m for m in done if m.preset == name), None)
        if ref is not None:
            return ref
    return done[0] if done else None


def beats(a: Measured, b: Measured) -> bool:
    """Whether `a` is faster than `b` beyond noise: at least NOISE faster and, where both
    carry a 95% interval, the intervals apart."""
    if a.rate < b.rate * (1 + NOISE):
        return False
    return a.ci is None or b.ci is None or a.ci[0] > b.ci[1]


def noise_text(done: Sequence[Measured]) -> str:
    """How `beats` judged noise for these runs, in words."""
    have = sum(m.ci is not None for m in done)
    floor = f"a minimum effect of {NOISE:.0%}"
    across = sum(m.runs > 1 and m.ci is not None for m in done)
    if across == len(done):
        return (f"noise: each preset's 95% steps/s interval across its runs ({ACROSS}) must clear the other's, "
                f"and {floor}")
    if across:  # a preset left with one completed run has its per-step interval only
        return (f"noise: 95% steps/s intervals across runs ({ACROSS}) for {across} of {len(done)} presets, from "
                f"per-step times for {have - across} (one completed run), must clear each other, and {floor}")
    if have == len(done):
        return f"noise: each run's 95% steps/s interval from its per-step times must clear the other's, and {floor}"
    if have:
        return f"noise: 95% steps/s intervals from per-step times where read ({have} of {len(done)} runs), and {floor}"
    return f"noise: no per-step intervals for these runs, so {floor}"


@dataclass(frozen=True)
class Choice:
    """The verdict over measured runs: the reference, what to use (None: keep the
    reference), and the fastest lossless and lossy runs that beat the reference."""

    ref: Measured
    pick: Measured | None
    lossless: Measured | None
    lossy: Measured | None
    tied: tuple[Measured, ...] = ()  # as lossy as `pick`, and neither beats the other beyond noise


def choose(done: Sequence[Measured], ref: Measured) -> Choice:
    """The fastest lossless run that beats `ref` beyond noise, the fastest lossy one, and
    which to use: the lossy one only when it also beats the lossless one beyond noise; and the
    runs tied with it (as lossy as it, other than `ref`, neither beating the other), fastest
    first: the table cannot rank those, so the advice does not either."""
    wins = [m for m in done if m is not ref and beats(m, ref)]
    lossless = max((m for m in wins if not m.lossy), key=lambda m: m.rate, default=None)
    lossy = max((m for m in wins if m.lossy), key=lambda m: m.rate, default=None)
    pick = lossless
    if lossy is not None and (lossless is None or beats(lossy, lossless)):
        pick = lossy
    return Choice(ref, pick, lossless, lossy, tied_with(done, pick, ref) if pick is not None else ())


def tied_with(done: Sequence[Measured], m: Measured, ref: Measured) -> tuple[Measured, ...]:
    """The runs as lossy as `m`, other than it and `ref`, that neither beat it nor are beaten
    by it beyond noise, fastest first."""
    return tuple(sorted((o for o in done if o is not ref and o is not m and o.lossy == m.lossy
                         and not beats(m, o) and not beats(o, m)), key=lambda o: -o.rate))


def recommend_from_sweep(rows: Sequence[Mapping[str, Any]]) -> Advice:
    """The sweep's recommendation, from its rows alone (ddptop.commands.sweep_table.build_rows
    makes them: `preset`, `status`, `steps_per_s`, optionally `steps_per_s_ci`)."""
    done = measured(rows)
    ref = reference(done)
    if ref is None:
        return Advice(None, reason="no DDP run of the sweep completed with measurements: nothing to recommend.",
                      evidence=[f"{len(rows)} run(s)"], basis="measured")
    c = choose(done, ref)
    others = sorted((m for m in done if m is not ref), key=lambda m: -m.rate)
    table = "; ".join([f"{ref.name} {ref.rate:.2f} steps/s"] + [_vs(m, ref) for m in others])
    evidence = [f"{m.name}: {m.rate:.2f} steps/s" + (f" (95% CI {m.ci[0]:.2f}-{m.ci[1]:.2f})" if m.ci else "")
                for m in done] + [noise_text(done)]
    tail = f" Measured: {table}. {noise_text(done).capitalize()}."
    if c.pick is None:
        reason = f"keep {ref.name}: nothing beat it beyond noise." + _lossy_note(ref)
        return Advice(ref.preset, {}, reason + tail, evidence=evidence, lossy=ref.lossy, basis="measured",
                      reading=table)
    pick = c.pick
    kind = "lossless " if not pick.lossy else ""
    if c.tied:
        names = [pick.name, *(m.name for m in c.tied)]
        xs = ", ".join(f"{m.name} {m.rate / ref.rate:.2f}x" for m in (pick, *c.tied))
        reason = (f"{_and(names)} tie as the fastest {kind}configurations ({xs} {ref.name}): {'neither beats the other' if len(names) == 2 else 'none beats another'} "
                  f"beyond noise, so this table cannot rank them; {pick.name} is named for its "
                  f"higher median.")
    else:
        reason = (f"{pick.name} is the fastest {kind}configuration: "
                  f"{pick.rate:.2f} steps/s, {pick.rate / ref.rate:.2f}x {ref.name}.")
    reason += _lossy_note(pick)
    if pick.lossy and c.lossless is not None:
        ties = tied_with(done, c.lossless, ref)
        also = f", tied with {_and([f'{m.name} ({m.rate / ref.rate:.2f}x)' for m in ties])}" if ties else ""
        reason += f" Fastest lossless: {c.lossless.name} ({c.lossless.rate / ref.rate:.2f}x {ref.name}){also}."
    elif pick.lossy:
        reason += f" No lossless configuration beat {ref.name} beyond noise: keep {ref.name} if accuracy must not change."
    elif c.lossy is not None:
        reason += (f" {c.lossy.name} ({c.lossy.rate / ref.rate:.2f}x {ref.name}) compresses gradients and "
                   f"{not_faster(c.lossy, pick)}.")
    return Advice(pick.preset, dict(pick.changes), reason + tail, "info", evidence, pick.lossy, basis="measured",
                  reading=table)


def not_faster(a: Measured, b: Measured) -> str:
    """Why `a` is not picked over `b`, which it does not beat beyond noise."""
    return f"ran slower than {b.name}" if a.rate < b.rate else f"is not faster than {b.name} beyond noise"


def _vs(m: Measured, ref: Measured) -> str:
    return f"{m.name} {m.rate / ref.rate:.2f}x" + (" (lossy)" if m.lossy else "")


def _lossy_note(m: Measured) -> str:
    return f" It compresses gradients: {LOSSY_CAVEAT}." if m.lossy else ""


# The parts a preset is made of, by the DDP knob that sets them: a comm hook (with PowerSGD's
# parameters), the bucket size, static_graph, gradient_as_bucket_view, autocast, DDP itself.
PART = {"comm_hook": "hook", "powersgd_rank": "hook", "powersgd_start_iter": "hook", "bucket_cap_mb": "bucket",
        "static_graph": "static", "gradient_as_bucket_view": "view", "autocast": "autocast", "ddp": "ddp"}


def _knobs(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Every DDP knob of `settings` (a preset's, a tune point), RunConfig's default where it sets
    none; PowerSGD's parameters only with PowerSGD."""
    defaults = RunConfig()
    out = {k: settings.get(k, getattr(defaults, k)) for k in DDP_KNOBS}
    out["bucket_cap_mb"] = float(out["bucket_cap_mb"])
    if out["comm_hook"] != "powersgd":
        out["powersgd_rank"], out["powersgd_start_iter"] = defaults.powersgd_rank, defaults.powersgd_start_iter
    return out


def differ(a: Mapping[str, Any], b: Mapping[str, Any]) -> set[str]:
    """The parts (PART) in which settings `a` and `b` differ."""
    ka, kb = _knobs(a), _knobs(b)
    return {PART[k] for k in DDP_KNOBS if ka[k] != kb[k]}


def part_missing(settings: Mapping[str, Any], target: Mapping[str, Any]) -> str | None:
    """The one part of `target` that `settings` is short of, when `settings` is `target` less
    that part: it differs in that part only, and there has it off (no hook, no static_graph,
    no view, no autocast) or, for the bucket size, which has no off, another size. None
    otherwise: `settings` is `target` itself, has more than it, or differs in more."""
    diff = differ(settings, target)
    if len(diff) != 1:
        return None
    (part,) = diff
    knob = next(k for k, p in PART.items() if p == part)
    off = getattr(RunConfig(), knob)
    return part if part == "bucket" or (_knobs(settings)[knob] == off and part != "ddp") else None


def part_text(part: str, target: Mapping[str, Any]) -> str:
    """`target`'s part in words: "bf16 hook", "100 MB buckets"."""
    k = _knobs(target)
    return {"hook": f"{k['comm_hook']} hook", "bucket": f"{k['bucket_cap_mb']:g} MB buckets",
            "static": "static_graph", "view": "gradient_as_bucket_view",
            "autocast": f"{k['autocast']} autocast"}.get(part, part)


def _row_settings(row: Mapping[str, Any]) -> dict[str, Any] | None:
    preset = str(row.get("preset"))
    point = row.get("point")
    return dict(point) if point else (dict(PRESETS[preset].settings) if preset in PRESETS else None)


def parts(rows: Sequence[Mapping[str, Any]], target: str) -> tuple[list[tuple[Measured, str]], list[Mapping[str, Any]]]:
    """The runs of `target`'s parts among `rows`: the completed ones with the part each is short
    of (bf16, which is bf16-overlap less its 100 MB buckets; overlap, less its bf16 hook), and
    the rows of parts that did not complete. `single` and the reference are no part of a remedy."""
    settings = PRESETS[target].settings
    done = measured(rows)
    ref = reference(done)
    ran = [(m, p) for m in done if m is not ref and (p := part_missing(m.changes, settings))]
    failed = [r for r in rows if r.get("status") != "completed" and r.get("preset") != "single"
              and (s := _row_settings(r)) is not None and part_missing(s, settings)]
    return ran, failed


def _verdict(m: Measured, ref: Measured) -> str:
    return "faster" if beats(m, ref) else "slower" if beats(ref, m) else "within noise"


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def explain(diagnosis: Advice | None, rows: Sequence[Mapping[str, Any]], what: str = "sweep") -> Advice | None:
    """The advisor's reading of the reference run (`diagnosis`) set against the measured
    `rows`, so the "why" under a recommendation never contradicts the table: a prediction
    this `what` (sweep, tune) tried is replaced by its measurement; one it did not try but
    whose parts it did (`parts`) says what they measured, and stays a labelled prediction only
    when a part helped and none ran slower; one it did not try at all stays a labelled
    prediction; a measured reading (a straggler) and a warning (an unused NVLink) are kept."""
    done = measured(rows)
    ref = reference(done)
    if diagnosis is None or ref is None or not diagnosis.predicted:
        return diagnosis
    head = f"{diagnosis.warning} " if diagnosis.warning else ""
    read = f" ({diagnosis.reading})" if diagnosis.reading else ""
    target = next((m for m in done if m.preset == diagnosis.preset and m is not ref), None)
    if target is None and diagnosis.preset in PRESETS:  # a tune trial labelled otherwise
        settings = PRESETS[diagnosis.preset].settings
        target = next((m for m in done if m is not ref and not differ(m.changes, settings)), None)
    best = choose(done, ref).pick
    if diagnosis.preset is None or not diagnosis.changes:
        outcome = (f"this {what} measured {best.name} at {best.rate / ref.rate:.2f}x {ref.name}: the measurement stands"
                   if best is not None else f"this {what} agrees: nothing beat {ref.name} beyond noise")
        expected = "expected little to gain" if diagnosis.confidence else "had nothing to go on"
        reason = f"{head}On the {ref.name} run the advisor's rules {expected}{read}; {outcome}."
    elif target is not None:
        x = target.rate / ref.rate
        verdict = ("borne out" if beats(target, ref) else
                   "not borne out: it ran slower" if beats(ref, target) else "not borne out: within noise")
        reason = (f"{head}On the {ref.name} run the advisor's rules expected {target.name} to help{read}; this "
                  f"{what} measured it at {x:.2f}x {ref.name}: {verdict}.")
    else:
        return _by_parts(diagnosis, rows, ref, what, read)
    return Advice(None, {}, reason, "warn" if diagnosis.warning else "info", diagnosis.evidence,
                  basis="measured", reading=diagnosis.reading, warning=diagnosis.warning)


def _by_parts(diagnosis: Advice, rows: Sequence[Mapping[str, Any]], ref: Measured, what: str, read: str) -> Advice:
    """A prediction this `what` did not try, set against the runs of its parts: what they
    measured; advice still (a labelled prediction) only when one helped and none ran slower,
    else what the parts measured and how to measure the whole. No part run: the prediction,
    labelled, with any part runs that failed."""
    preset = str(diagnosis.preset)
    ran, failed = parts(rows, preset) if preset in PRESETS else ([], [])
    settings = PRESETS[preset].settings if preset in PRESETS else {}
    ran.sort(key=lambda mp: -mp[0].rate)
    said = ", ".join(f"{m.name} {m.rate / ref.rate:.2f}x {ref.name} ({_verdict(m, ref)})" for m, _ in ran)
    evidence = [*diagnosis.evidence, *(f"{m.name}: {preset} without its {part_text(p, settings)}" for m, p in ran)]
    predicted = Advice(diagnosis.preset, diagnosis.changes, f"Not measured in this {what}: {diagnosis.reason}",
                       diagnosis.severity, evidence, diagnosis.lossy, "predicted", diagnosis.confidence,
                       diagnosis.reading, diagnosis.warning)
    if not ran:
        if failed:
            names = [str(r.get("name") or r.get("preset")) for r in failed]
            status = {str(r.get("status")) for r in failed}
            its = "Its parts" if len(names) > 1 else "Its part"
            predicted = replace(predicted, reason=f"{predicted.reason} {its} {_and(names)} did not complete in "
                                                  f"this {what} ({_and(sorted(status))}).")
        return predicted
    helped = [m.name for m, _ in ran if beats(m, ref)]
    if helped and not any(beats(ref, m) for m, _ in ran):
        return replace(predicted, reason=f"{predicted.reason} This {what} measured its parts: {said}.")
    missed = [m.name for m, _ in ran if not beats(m, ref)]
    who = ("it" if len(ran) == 1 else "they") if len(missed) == len(ran) else _and(missed)
    measure = f"{ref.preset},{preset}" if ref.preset in PRESETS else preset
    head = f"Not measured in this {what}: {diagnosis.warning} " if diagnosis.warning else ""
    reason = (f"{head}On the {ref.name} run the advisor's rules expected {preset} to help{read}; this {what} "
              f"measured its parts: {said}: {who} did not help here; {preset} itself was not measured: "
              f"`ddptop sweep --presets {measure}` measures it.")
    return Advice(None, {}, reason, "warn" if diagnosis.warning else "info", evidence,
                  basis="measured", reading=diagnosis.reading, warning=diagnosis.warning)
