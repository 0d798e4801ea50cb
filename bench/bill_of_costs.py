"""The bill of costs (issue 42): what each part that ddptop turns on costs a kernel launch and a
collective, measured against the same process without it.

Each *variant* is a fresh `torchrun --nproc-per-node N` of this file's worker with one part on
(the part must be on from the process's start: an env variable NCCL reads at init, a library
nsys injects): plain, nsys's wrapper (what `--profiler auto` used to do), TORCH_NCCL_ENABLE_TIMING,
that plus the completion hook (as ddptop registers it), the flight recorder, NCCL_DEBUG=INFO to a
file, ddptop's NCCL profiler plugin loaded (its mask off and on, alternated inside the process),
torchrun's log capture as ddptop asks for it, everything ddptop's launcher sets at once, and the
worker run under ddptop itself (`ddptop -- python bill_of_costs.py worker`: every part plus the
rank-side layer, its sender thread and the monitor). Variants are interleaved over rounds, ranks
pinned to the same cores in every variant.

The worker times, on each rank: `--launches` tiny kernel launches (an in-place add on a
one-element tensor; one device sync at the end), and `--collectives` all-reduces of 4 KiB (sync at
the end), each 5 times; the median of the reps is the variant's figure in that round. Rank 0 also
reports torchrun's agent CPU seconds per wall second.

    python bench/bill_of_costs.py [--nproc 2] [--rounds 3] [--variants a,b,...] [--json-out F]

`--lockstep BASE,OTHER` runs the two variants at once instead, rank r of each pinned to the same
core and GPU, taking turns burst by burst (`--turns` bursts a job, through FIFOs): a slow spell
of a core (session 14: each core has its own) falls on both. Each of OTHER's bursts is set
against the mean of BASE's bursts either side of it; rounds alternate who goes first.

Prints one table: µs per launch and per all-reduce, each variant minus plain per round (mean and
t 95% interval over rounds). On CPU the same runs on gloo (no nsys, plugin or NCCL variants).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REPS = 5


# ---------------------------------------------------------------------------- worker (a rank)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[(2 + local) % len(cpus)]})  # the same core per rank in every variant
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if os.environ.get("BILL_HOOK") == "1":
        from ddptop.rank.comm import NcclTimes

        NcclTimes.attach(dist, dist.distributed_c10d._get_default_group())
    plugin = _plugin()
    x = torch.zeros(1, device=device)
    buf = torch.ones(1024, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):  # warm up: NCCL's channels, the allocator, the launch path
        dist.all_reduce(buf)
        x.add_(1)
    sync()
    if os.environ.get("BILL_TURN_DIR"):
        _lockstep(args, Path(os.environ["BILL_TURN_DIR"]), lambda: x.add_(1), lambda: dist.all_reduce(buf), sync)
        dist.destroy_process_group()
        return
    out: dict[str, list[float]] = {"launch_us": [], "allreduce_us": [], "allreduce_mask_on_us": []}
    agent = _agent_cpu()
    wall = time.perf_counter()
    for _ in range(REPS):
        out["launch_us"].append(_time(lambda: x.add_(1), args.launches, sync))
        for key, on in (("allreduce_us", 0), ("allreduce_mask_on_us", 1)):
            if key == "allreduce_mask_on_us" and plugin is None:
                continue
            if plugin is not None:
                plugin.ddptop_nccl_enable(on)
            dist.barrier()
            out[key].append(_time(lambda: dist.all_reduce(buf), args.collectives, sync))
    result = {k: statistics.median(v) for k, v in out.items() if v}
    result["rank"] = dist.get_rank()
    after = _agent_cpu()
    if result["rank"] == 0 and agent is not None and after is not None:
        result["agent_cpu_per_s"] = (after - agent) / (time.perf_counter() - wall)
    Path(args.out, f"rank{result['rank']}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _lockstep(args: argparse.Namespace, turns: Path, launch, allreduce, sync) -> None:
    """Take turns with the same rank of the other job (on the same core and GPU): wait for the
    turn, time one burst, hand the turn over. Job a's ranks go first once every rank of both
    jobs is warm."""
    import torch.distributed as dist

    job, rank, world = os.environ["BILL_JOB"], dist.get_rank(), dist.get_world_size()
    mine = os.open(turns / f"turn_{job}_{rank}", os.O_RDWR)
    theirs = os.open(turns / f"turn_{'b' if job == 'a' else 'a'}_{rank}", os.O_RDWR)
    (turns / f"ready_{job}_{rank}").touch()
    while len(list(turns.glob("ready_*"))) < 2 * world:
        time.sleep(0.01)
    out: dict[str, list[float]] = {"launch_us": [], "allreduce_us": []}
    for _ in range(args.turns):
        for key, fn, n in (("launch_us", launch, args.launches), ("allreduce_us", allreduce, args.collectives)):
            os.read(mine, 1)
            if key == "allreduce_us":  # the ranks came from their turns at different times: align them first
                allreduce()
                sync()
            out[key].append(_time(fn, n, sync))
            os.write(theirs, b"t")
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({"rank": rank, **out}))


def _time(fn, n: int, sync) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t) * 1e6 / n


def _plugin():
    path = os.environ.get("NCCL_PROFILER_PLUGIN", "")
    if not path.endswith("ddptop_nccl_profiler.so"):
        return None
    import ctypes

    lib = ctypes.CDLL(path)
    lib.ddptop_nccl_enable.argtypes = [ctypes.c_int]
    return lib


def _agent_cpu() -> float | None:
    """torchrun's agent (this rank's parent, above nsys where nsys wraps the rank): its CPU
    seconds so far (the timed window's share is the difference of two readings)."""
    try:
        import psutil

        agent = psutil.Process(os.getppid())
        if "nsys" in " ".join(agent.cmdline()):
            agent = agent.parent()
        cpu = agent.cpu_times()
        return cpu.user + cpu.system
    except Exception:  # noqa: BLE001
        return None


# ---------------------------------------------------------------------------- driver


def variants(cuda: bool, nsys: str | None, plugin: str | None, run_dir: Path) -> dict[str, dict]:
    """name -> {"env": extra env, "torchrun": extra torchrun args, "wrap": rank prefix, "ddptop": bool}"""
    logs = ["--log-dir", str(run_dir / "logs"), "--redirects=3", "--monitor-interval=0.5"]
    # plain_again: plain once more, the method's own A/A (ask for it: --variants plain,plain_again,...)
    v: dict[str, dict] = {"plain": {}, "plain_again": {}, "torchrun_logs": {"torchrun": logs}}
    if cuda:
        v["nccl_timing"] = {"env": {"TORCH_NCCL_ENABLE_TIMING": "1"}}
        v["completion_hook"] = {"env": {"TORCH_NCCL_ENABLE_TIMING": "1", "BILL_HOOK": "1"}}
        v["flight_recorder"] = {"env": {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}}
        v["nccl_debug_info"] = {"env": {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(run_dir / "nccl.%h.%p.log")}}
        if plugin:
            v["nccl_plugin"] = {"env": {"NCCL_PROFILER_PLUGIN": plugin}}
        if nsys:
            v["nsys_wrapper"] = {"wrap": [nsys, "profile", "--capture-range=cudaProfilerApi", "--trace=cuda,nvtx",
                                          "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
                                          "-o", str(run_dir / "nsys_rank%q{RANK}")]}
        everything = {"TORCH_NCCL_ENABLE_TIMING": "1", "BILL_HOOK": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                      "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(run_dir / "nccl.%h.%p.log"),
                      **({"NCCL_PROFILER_PLUGIN": plugin} if plugin else {})}
        v["launcher_env_all"] = {"env": everything, "torchrun": logs}
    v["under_ddptop"] = {"ddptop": True}
    return v


def _argv(spec: dict, args: argparse.Namespace, out: Path) -> list[str]:
    me = [*spec.get("wrap", []), sys.executable, str(Path(__file__).resolve()), "worker", "--out", str(out),
          "--launches", str(args.launches), "--collectives", str(args.collectives), "--turns", str(args.turns)]
    if spec.get("ddptop"):
        argv = [sys.executable, "-m", "ddptop", "--nproc", str(args.nproc), "--headless", "--interval", "3600",
                "--runs-dir", str(out / "runs"), "--", *me]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
                *spec.get("torchrun", []), "--no-python", *me]
    return argv


def _env(spec: dict, **more: str) -> dict[str, str]:
    return {**os.environ, **spec.get("env", {}), **more,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def run_variant(name: str, spec: dict, args: argparse.Namespace, out: Path) -> dict | None:
    out.mkdir(parents=True)
    proc = subprocess.run(_argv(spec, args, out), env=_env(spec), capture_output=True, text=True, timeout=args.timeout)
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    if proc.returncode != 0 or len(ranks) != args.nproc:
        print(f"  {name}: rc={proc.returncode} ranks={len(ranks)}\n{proc.stderr[-1500:]}", flush=True)
        return None
    merged = {k: statistics.fmean(r[k] for r in ranks) for k in ranks[0] if k not in ("rank", "agent_cpu_per_s")}
    merged["agent_cpu_per_s"] = next((r.get("agent_cpu_per_s") for r in ranks if r.get("agent_cpu_per_s") is not None), None)
    return merged


def t_interval(values: list[float]) -> tuple[float, float, float]:
    from ddptop.analysis.cost_pairs import t_interval as ti

    r = ti(values)
    return (values[0], values[0], values[0]) if r is None else (r.mean, r.lo, r.hi)


def report(rounds: list[dict[str, dict]], names: list[str]) -> str:
    keys = ("launch_us", "allreduce_us", "allreduce_mask_on_us", "agent_cpu_per_s")
    lines = ["| variant | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name in names:
        cells = []
        for key in keys:
            vals = [r[name][key] for r in rounds if r.get(name) and r[name].get(key) is not None]
            base = [r["plain"].get(key if key != "allreduce_mask_on_us" else "allreduce_us") for r in rounds
                    if r.get(name) and r[name].get(key) is not None and r.get("plain")]
            if not vals:
                cells.append("-")
                continue
            mean = statistics.fmean(vals)
            if name == "plain" or len(base) != len(vals) or any(b is None for b in base):
                cells.append(f"{mean:.3f}")
                continue
            d, lo, hi = t_interval([v - b for v, b in zip(vals, base)])
            cells.append(f"{mean:.3f} ({d:+.3f} [{lo:+.3f}, {hi:+.3f}])")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> int:
    import torch  # the driver only asks what the machine has

    from ddptop.run.nccl_plugin import build
    from ddptop.run.nsys import find_nsys

    cuda = torch.cuda.is_available()
    work = Path(tempfile.mkdtemp(prefix="bill-"))
    plugin = str(build(work)[0] or "") if cuda and shutil.which("cc") else ""
    nsys = find_nsys(None) if cuda else None
    specs = variants(cuda, nsys, plugin or None, work)
    if args.lockstep:
        return lockstep(args, specs, work)
    names = [n for n in specs if not args.variants or n in args.variants.split(",")]
    print(f"bill of costs: {len(names)} variants x {args.rounds} rounds, {args.nproc} ranks, cuda={cuda}, "
          f"nsys={nsys}, plugin={bool(plugin)}", flush=True)
    rounds: list[dict[str, dict]] = []
    for r in range(args.rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        got: dict[str, dict] = {}
        for name in order:
            res = run_variant(name, specs[name], args, work / f"r{r}" / name)
            if res is not None:
                got[name] = res
                print(f"  round {r} {name:<18} " + " ".join(f"{k}={v:.3f}" for k, v in res.items() if v is not None), flush=True)
        rounds.append(got)
    table = report(rounds, names)
    print(table, flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rounds": rounds, "names": names, "table": table}, indent=1))
    return 0


def lockstep(args: argparse.Namespace, specs: dict[str, dict], work: Path) -> int:
    """Two variants at once, rank r of each on the same core and GPU, taking turns burst by burst
    (`_lockstep`): a slow spell of the machine hits both. Each of the second variant's bursts is
    set against the mean of the first's bursts either side of it; the jobs swap who goes first
    each round."""
    base, other = args.lockstep.split(",")
    per_round: dict[str, list[float]] = {"launch_us": [], "allreduce_us": []}
    for r in range(args.rounds):
        jobs = {"a": base, "b": other} if r % 2 == 0 else {"a": other, "b": base}
        turns = work / f"lock{r}"
        turns.mkdir(parents=True)
        for job in "ab":
            for rank in range(args.nproc):
                os.mkfifo(turns / f"turn_{job}_{rank}", 0o600)
            (turns / job).mkdir()
        first = [os.open(turns / f"turn_a_{rank}", os.O_RDWR) for rank in range(args.nproc)]
        for fd in first:  # job a's first turn; held open so the byte stays in the pipe
            os.write(fd, b"t")
        procs = {job: subprocess.Popen(_argv(specs[name], args, turns / job), env=_env(specs[name], BILL_TURN_DIR=str(turns),
                                       BILL_JOB=job), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for job, name in jobs.items()}
        errs = {job: p.communicate(timeout=args.timeout)[1] for job, p in procs.items()}
        for fd in first:
            os.close(fd)
        got = {job: {int(f.stem[4:]): json.loads(f.read_text()) for f in (turns / job).glob("rank*.json")} for job in "ab"}
        if any(len(got[j]) != args.nproc for j in "ab"):
            print(f"  round {r}: ranks {[len(got[j]) for j in 'ab']}\n{errs['a'][:1500]}\n{errs['b'][:1500]}", flush=True)
            continue
        sign = 1.0 if jobs["b"] == other else -1.0
        for key in per_round:
            diffs = []
            for rank in range(args.nproc):
                a, b = got["a"][rank][key], got["b"][rank][key]
                diffs += [sign * (b[i] - (a[i] + a[i + 1]) / 2) for i in range(len(a) - 1)]
            iv = t_interval(diffs)
            base_us = statistics.fmean(got["a" if jobs["a"] == base else "b"][0][key])
            per_round[key].append(iv[0])
            print(f"  round {r} ({jobs['a']} first) {key}: {base} {base_us:.3f}, {other} {iv[0]:+.4f} "
                  f"[{iv[1]:+.4f}, {iv[2]:+.4f}] over {len(diffs)} turns", flush=True)
    for key, vals in per_round.items():
        if len(vals) >= 2:
            m, lo, hi = t_interval(vals)
            print(f"{other} - {base}, {key}: {m:+.4f} [{lo:+.4f}, {hi:+.4f}] over {len(vals)} rounds (t over round means)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="driver", choices=("driver", "worker"))
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", help="comma list (default: all the machine allows)")
    p.add_argument("--launches", type=int, default=20000)
    p.add_argument("--collectives", type=int, default=2000)
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--lockstep", metavar="BASE,OTHER", help="two variants at once, taking turns burst by burst")
    p.add_argument("--turns", type=int, default=300, help="bursts per job with --lockstep")
    p.add_argument("--out")
    p.add_argument("--json-out")
    args = p.parse_args()
    if args.mode == "worker":
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
