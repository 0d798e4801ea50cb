"""Per-bucket all-reduce timing two ways, for accuracy and cost: PyTorch's flight recorder
with TORCH_NCCL_ENABLE_TIMING against ddptop's timed comm hook. One torchrun job trains the
same model under DDP in four variants, back to back and interleaved (--rounds, the order
rotated each round), timed like the reference recipe (../shared/bench/seed_repro.py, carried as .ref/): synchronize +
perf_counter around the measured steps only, batches made on the GPU beforehand.

  builtin  no hook, recorder never read: the reference throughput
  hook     ddptop's CommTimer (ddptop.rank.comm) on every step: a CUDA event at each bucket's
           hand-over, one in fut.then at completion, ReduceOp.AVG inside NCCL; a step's comm
           ms = union of its buckets' [hand-over, completion] spans (ddptop's comm_ms)
  timing   as builtin, on a process group made with TORCH_NCCL_ENABLE_TIMING=1, recorder
           never read during the steps: what the variable alone costs
  fr       the same DDP as timing; every --fr-every steps the flight recorder is dumped
           (torch._C._distributed_c10d._dump_nccl_trace) and unpickled, and this group's
           all-reduce entries are kept by collective_seq_id; a step's comm ms = sum of its
           all-reduces' duration_ms (they run one after another on the group's NCCL stream)

Where TORCH_NCCL_ENABLE_TIMING lives: each ProcessGroupNCCL reads it in its constructor, so
the script sets it only while it makes the timing/fr group (dist.new_group) and leaves the
default group (builtin, hook) as launched. Launched with TORCH_NCCL_ENABLE_TIMING=1, every
group times (builtin then runs what timing runs: the cross-check of timing's cost).
What duration_ms is: the watchdog thread (polling every 100 ms) sees a work's end event done
and computes start.elapsed_time(end); both events are recorded on the group's NCCL stream
around the NCCL call, the start after that stream waited for the gradient's stream. Groups
made without timing record no start event and their entries get no duration_ms. A dump
copies the whole ring (every group's entries): a read costs in proportion to --fr-buffer.

One GPU: an in-place SUM all-reduce over one rank launches no NCCL kernel (NCCL 2.28), so
--allreduce auto gives builtin/timing/fr a plain untimed AVG all-reduce hook when the world
is 1 rank (as hook uses): every variant then runs the same NCCL kernel (oneRankReduce).
Accuracy: after all rounds (the profiler kept out of the timed steps), each variant runs
--prof-steps steps under torch.profiler; the method's comm time over those steps is set
against the NCCL kernels' time in the trace.

  torchrun --standalone --nproc_per_node 1 bench/investigations/fr_timing.py --model vit_l_32 \\
      --steps 30 --warmup 5 --rounds 3 [--fr-every 10 --fr-buffer 2000]
  python bench/investigations/fr_timing.py --selftest      # the bookkeeping, on CPU (gloo's recorder)
Rank 0 prints one JSON line per (round, variant), a table, and a RESULT JSON line.

Question: time each bucket's all-reduce from the flight recorder (TORCH_NCCL_ENABLE_TIMING) or
from ddptop's comm hook: which is accurate, which is cheap?
Answer (2026-11-23, 1x H100, ViT-L/32): reading the recorder is the cost (~4.5% of a step at one
read per 10 steps, holding the GIL) and it gives no GPU start/end; the comm hook was kept.
`bash bench/gpu_check.sh frtiming` runs it.
Quoted in: docs/BENCHMARKS.md, "2026-11-23, H100: NCCL's own timing vs ddptop's comm hook".
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ddptop.rank.clock import CudaClock  # noqa: E402
from ddptop.rank.comm import CommTimer  # noqa: E402
from ddptop.rank.steps import union_length  # noqa: E402

VARIANTS = ("builtin", "hook", "timing", "fr")
GPT_VOCAB, GPT_CTX = 8192, 512


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="vit_l_32", help="a torchvision ViT (vit_l_32, vit_b_32...) or gpt")
    p.add_argument("--batch", type=int, default=None, help="per rank (default 32 for a ViT, 8 for gpt)")
    p.add_argument("--steps", type=int, default=30, help="measured steps per variant and round")
    p.add_argument("--warmup", type=int, default=5, help="steps before each measured segment")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fr-every", type=int, default=10, help="fr: read the flight recorder every K steps")
    p.add_argument("--fr-buffer", type=int, default=2000, help="flight recorder entries (all groups share it)")
    p.add_argument("--bucket", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--allreduce", choices=("auto", "builtin", "avg"), default="auto",
                   help="builtin/timing/fr: DDP's own, or a plain AVG hook; auto = avg on a 1-rank world")
    p.add_argument("--prof-steps", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--selftest", action="store_true", help="check the bookkeeping on CPU and exit")
    return p.parse_args(argv)


# --- bookkeeping (no GPU) ------------------------------------------------------------------
def take(seen: dict, entries: list, group_name: str) -> int:
    """Keep one group's recorder entries in `seen` as {collective_seq_id: (profiling_name,
    duration_ms or None)}; returns how many of its all-reduces in this dump have no duration
    yet (not completed, or completed but not yet retired by the watchdog)."""
    pending = 0
    for e in entries:
        if e.get("process_group", ("",))[0] != group_name or e.get("is_p2p"):
            continue
        seq, dur = e["collective_seq_id"], e.get("duration_ms")
        if dur is not None or seq not in seen:
            seen[seq] = (e["profiling_name"], dur)
        pending += dur is None and "all_reduce" in e["profiling_name"]
    return pending


def per_step_sums(bounds: list, seen: dict) -> list:
    """Step i holds the collectives with bounds[i] < seq <= bounds[i+1] (the group's sequence
    number before each step): the sum of their all-reduces' duration_ms, for every step whose
    entries are all still in the ring and timed."""
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        got = [seen.get(s) for s in range(lo + 1, hi + 1)]
        if not got or None in got:
            continue
        durs = [d for name, d in got if "all_reduce" in name]
        if durs and None not in durs:
            out.append(sum(durs))
    return out


def kernel_comm(events: list) -> tuple:
    """NCCL kernels in a chrome trace: (ms covered, count). 'Reduce' alone would also match
    torch's reduce_kernel (the loss), so: nccl*, *AllReduce*, oneRankReduce (a 1-rank world)."""
    spans = []
    for e in events:
        if e.get("ph") != "X" or str(e.get("cat", "")).lower() != "kernel":
            continue
        name = str(e.get("name", "")).lower()
        if "nccl" in name or "allreduce" in name or "onerankreduce" in name or "Collective name" in (e.get("args") or {}):
            spans.append((e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3))
    return union_length(spans), len(spans)


def median(xs):
    return statistics.median(xs) if xs else None


# --- the three ways of (not) timing --------------------------------------------------------
class Plain:
    def begin(self): pass
    def end(self, i): pass
    def reset(self): pass
    def comm_ms(self): return []


class HookTiming(Plain):
    """ddptop's CommTimer, stamping every step."""
    def __init__(self, ddp, dev):
        self.steps = []
        timer = CommTimer(dist, CudaClock(torch, dev).stamp, lambda entry: self.steps[-1].append(entry),
                          average_in_nccl=True)
        ddp.register_comm_hook(None, timer.hook)

    def begin(self): self.steps.append([])
    def reset(self): self.steps = []

    def comm_ms(self):  # after a synchronize: every event has run
        return [union_length([(s[0][0].elapsed_time(a), s[0][0].elapsed_time(b)) for a, b, _ in s])
                for s in self.steps if s]


def dump_trace(fn) -> bytes:
    try:
        return fn(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    except TypeError:  # an older binding without keywords
        return fn()


class FlightTiming(Plain):
    """The flight recorder: the group's sequence number before each step, and a dump every
    `every` steps (0: only once the segment is over, outside the timed steps)."""
    def __init__(self, group, every, dump=None):
        self.group, self.name, self.every = group, group.group_name, every
        self.dump = dump or torch._C._distributed_c10d._dump_nccl_trace
        self.reset()

    def reset(self):
        self.bounds, self.seen, self.stats = [], {}, []

    def begin(self): self.bounds.append(self.group._get_sequence_number_for_group())

    def end(self, i):
        if self.every and (i + 1) % self.every == 0:
            self.read(timed=True)

    def read(self, timed=False) -> int:
        t0 = time.perf_counter()
        raw = dump_trace(self.dump)
        t1 = time.perf_counter()
        entries = pickle.loads(raw).get("entries", [])
        t2 = time.perf_counter()
        pending = take(self.seen, entries, self.name)
        if timed:
            ms = lambda a, b: (b - a) * 1e3  # noqa: E731
            self.stats.append(dict(dump_ms=ms(t0, t1), unpickle_ms=ms(t1, t2), filter_ms=ms(t2, time.perf_counter()),
                                   bytes=len(raw), entries=len(entries), pending=pending))
        return pending

    def comm_ms(self, timeout=3.0):  # after a synchronize: wait for the watchdog to retire them
        bounds = [*self.bounds, self.group._get_sequence_number_for_group()]
        deadline = time.monotonic() + timeout
        while self.read() and time.monotonic() < deadline:
            time.sleep(0.05)
        return per_step_sums(bounds, self.seen)


# --- models, data, steps -------------------------------------------------------------------
class GPT(nn.Module):
    def __init__(self, d=768, layers=12, heads=12):
        super().__init__()
        self.tok, self.pos = nn.Embedding(GPT_VOCAB, d), nn.Parameter(torch.zeros(GPT_CTX, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, GPT_VOCAB, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(GPT_CTX), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.blocks(self.tok(idx) + self.pos[:t], mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def make_model(name):
    if name == "gpt":
        return GPT()
    import torchvision.models as tvm
    return getattr(tvm, name)(weights=None)


def make_batches(a, dev, rank, n=4):
    gen = torch.Generator(device=dev).manual_seed(rank)
    if a.model == "gpt":
        idx = [torch.randint(0, GPT_VOCAB, (a.batch, GPT_CTX + 1), device=dev, generator=gen) for _ in range(n)]
        return [(t[:, :-1], t[:, 1:]) for t in idx]
    return [(torch.randn(a.batch, 3, 224, 224, device=dev, generator=gen),
             torch.randint(0, 1000, (a.batch,), device=dev, generator=gen)) for _ in range(n)]


def avg_hook(group, bucket):  # unannotated: DDP checks hook annotations
    fut = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def run_steps(v, batches, n, start=0):
    for i in range(start, start + n):
        x, y = batches[i % len(batches)]
        v["instr"].begin()
        loss = F.cross_entropy(v["ddp"](x).flatten(0, -2), y.flatten())
        v["opt"].zero_grad(set_to_none=True)
        loss.backward()
        v["opt"].step()
        v["instr"].end(i)


def segment(v, batches, warmup, steps):
    run_steps(v, batches, warmup)
    torch.cuda.synchronize()
    v["instr"].reset()
    t0 = time.perf_counter()
    run_steps(v, batches, steps)
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - t0)


def profile_window(v, batches, steps, rank):
    from torch.profiler import ProfilerActivity, profile
    run_steps(v, batches, 2)
    torch.cuda.synchronize()
    v["instr"].reset()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_steps(v, batches, steps)
        torch.cuda.synchronize()
    method = v["instr"].comm_ms()
    if rank != 0:
        return method, None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return method, kernel_comm(json.load(f).get("traceEvents", []))


# --- the job -------------------------------------------------------------------------------
def main(a):
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        sys.exit("fr_timing.py needs CUDA GPUs and NCCL (duration_ms comes from NCCL's CUDA events); "
                 "none here. `python bench/investigations/fr_timing.py --selftest` checks the bookkeeping on CPU.")
    old_name = tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 10)  # renamed in 2.10 (alias kept)
    os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE" if old_name else "TORCH_FR_BUFFER_SIZE"] = str(a.fr_buffer)
    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1").items():
        os.environ.setdefault(k, v)  # plain `python` on one GPU
    rank, local, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    a.batch = a.batch or (8 if a.model == "gpt" else 32)
    names = [n for n in VARIANTS if n in a.variants.split(",")]
    plain_avg = a.allreduce == "avg" or (a.allreduce == "auto" and world == 1)
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    launched = os.environ.get("TORCH_NCCL_ENABLE_TIMING")
    dist.init_process_group("nccl")
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"  # read by the ProcessGroupNCCL constructor
    g_on = dist.new_group(backend="nccl")
    os.environ.pop("TORCH_NCCL_ENABLE_TIMING") if launched is None else os.environ.update(TORCH_NCCL_ENABLE_TIMING=launched)
    backend = g_on._get_backend(dev)
    if hasattr(backend, "_enable_collectives_timing"):
        backend._enable_collectives_timing()  # the same switch, in case the variable's name moved

    torch.manual_seed(0)
    base = make_model(a.model)

    def wrap(group, avg):
        m = DDP(copy.deepcopy(base).to(dev), device_ids=[local], process_group=group, bucket_cap_mb=a.bucket)
        if avg:
            m.register_comm_hook(group, avg_hook)
        return dict(ddp=m, opt=torch.optim.SGD(m.parameters(), lr=1e-3))

    variants = {}
    if "builtin" in names:
        variants["builtin"] = dict(wrap(None, plain_avg), instr=Plain())
    if "hook" in names:
        variants["hook"] = w = wrap(None, False)
        w["instr"] = HookTiming(w["ddp"], dev)
    if "timing" in names or "fr" in names:
        on = wrap(g_on, plain_avg)
        variants["timing"] = dict(on, instr=FlightTiming(g_on, 0))
        variants["fr"] = dict(on, instr=FlightTiming(g_on, a.fr_every))
    batches = make_batches(a, dev, rank)
    say = (lambda *x: print(*x, flush=True)) if rank == 0 else (lambda *x: None)
    say(f"# {a.model} batch {a.batch} x{world} ranks, torch {torch.__version__}, nccl {torch.cuda.nccl.version()}, "
        f"{torch.cuda.get_device_name(dev)}; allreduce for builtin/timing/fr: {'AVG hook' if plain_avg else 'DDP builtin'}; "
        f"TORCH_NCCL_ENABLE_TIMING at launch: {launched}; fr buffer {a.fr_buffer}, read every {a.fr_every} steps")

    res = {n: dict(sps=[], comm=[]) for n in names}
    for r in range(a.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            sps = segment(variants[n], batches, a.warmup, a.steps)
            comm = variants[n]["instr"].comm_ms()
            res[n]["sps"].append(sps)
            res[n]["comm"] += comm
            say(json.dumps(dict(round=r, variant=n, steps_per_s=round(sps, 3), comm_ms_p50=median(comm),
                                comm_steps=len(comm))))
    fr_stats = variants["fr"]["instr"].stats if "fr" in names else []  # the last segment's reads
    for n in names:  # accuracy, after every timed step
        method, kern = profile_window(variants[n], batches, a.prof_steps, rank)
        res[n]["window"] = sum(method) / a.prof_steps if len(method) == a.prof_steps else None
        res[n]["kernels"] = kern and (kern[0] / a.prof_steps, kern[1] / a.prof_steps)
    if rank == 0:
        report(a, names, res, fr_stats, g_on, world)
    dist.destroy_process_group()


def report(a, names, res, fr_stats, g_on, world):
    ref = median(res["builtin"]["sps"]) if "builtin" in res else None
    f = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    print(f"\n{'variant':<8} {'steps/s':>8} {'vs builtin':>10} {'comm ms/step':>13} {'steps':>6}"
          f" | {'window: method':>14} {'nccl kernels':>12} {'method/kern':>11} {'kernels/step':>12}")
    out = {}
    for n in names:
        r = res[n]
        sps, comm = median(r["sps"]), median(r["comm"])
        kern = r["kernels"][0] if r["kernels"] else None
        ratio = r["window"] / kern if r["window"] is not None and kern else None
        print(f"{n:<8} {f(sps):>8} {f(sps / ref if ref else None, 4):>10} {f(comm):>13} {len(r['comm']):>6}"
              f" | {f(r['window']):>14} {f(kern):>12} {f(ratio):>11} {f(r['kernels'] and r['kernels'][1], 1):>12}")
        out[n] = dict(steps_per_s=sps, rounds=[round(x, 3) for x in r["sps"]], vs_builtin=sps / ref if ref else None,
                      comm_ms_p50=comm, comm_steps=len(r["comm"]), window_method_ms=r["window"],
                      window_kernel_ms=kern, method_over_kernels=ratio)
    print("(comm ms/step: hook = union of [hand-over, completion] spans; timing/fr = sum of duration_ms;"
          " window = the same over the profiled steps; nccl kernels = union of NCCL kernels in the trace)")
    fr = {}
    if fr_stats:
        fr = {k: dict(p50=median([s[k] for s in fr_stats]), max=max(s[k] for s in fr_stats))
              for k in ("dump_ms", "unpickle_ms", "filter_ms", "bytes", "entries", "pending")}
        print(f"flight recorder reads in the last fr segment ({len(fr_stats)}), p50 (max): _dump_nccl_trace "
              f"{fr['dump_ms']['p50']:.2f} ({fr['dump_ms']['max']:.2f}) ms + pickle.loads {fr['unpickle_ms']['p50']:.2f} "
              f"({fr['unpickle_ms']['max']:.2f}) ms + filtering {fr['filter_ms']['p50']:.2f} ms; {fr['entries']['p50']:.0f} "
              f"entries, {fr['bytes']['p50'] / 1e3:.0f} kB; this group's all-reduces without duration_ms yet: "
              f"{fr['pending']['p50']:.0f} ({fr['pending']['max']:.0f})")
    fr["idle_dumps"] = idle_dumps()
    for k, d in fr["idle_dumps"].items():
        print(f"idle {k} dump: {d['error']}" if "error" in d else
              f"idle {k} dump (nothing in flight), median of 5: dump {d['dump_ms']:.2f} ms + load "
              f"{d['load_ms']:.2f} ms, {d['entries']} entries, duration_ms present: {d['has_duration']}")
    entries = pickle.loads(dump_trace(torch._C._distributed_c10d._dump_nccl_trace)).get("entries", [])
    for label, name in (("timing group", g_on.group_name), ("default group", dist.group.WORLD.group_name)):
        ar = [e for e in entries if e["process_group"][0] == name and "all_reduce" in e["profiling_name"]]
        print(f"{label} ({name}): {sum('duration_ms' in e for e in ar)}/{len(ar)} all-reduce entries carry duration_ms")
    print("RESULT " + json.dumps(dict(model=a.model, batch=a.batch, world=world, steps=a.steps, warmup=a.warmup,
                                      rounds=a.rounds, fr_every=a.fr_every, fr_buffer=a.fr_buffer,
                                      torch=torch.__version__, variants=out, fr_read=fr)), flush=True)


def idle_dumps(n=5):
    """The pickle and JSON dumps timed once nothing is in flight (after the last step)."""
    c10d, out = torch._C._distributed_c10d, {}
    ways = (("pickle", lambda: dump_trace(c10d._dump_nccl_trace), pickle.loads),
            ("json", lambda: c10d._dump_nccl_trace_json(includeCollectives=True, onlyActive=False), json.loads))
    for label, dump, load in ways:
        times = []
        try:
            for _ in range(n):
                t0 = time.perf_counter()
                raw = dump()
                t1 = time.perf_counter()
                entries = load(raw).get("entries", [])
                times.append((t1 - t0, time.perf_counter() - t1))
        except (AttributeError, TypeError, RuntimeError, ValueError) as e:
            out[label] = dict(error=repr(e)[:200])
            continue
        out[label] = dict(dump_ms=1e3 * median([t[0] for t in times]), load_ms=1e3 * median([t[1] for t in times]),
                          entries=len(entries), has_duration=any("duration_ms" in e for e in entries))
    return out


def selftest():
    """The bookkeeping on synthetic entries and trace events, then on gloo's real recorder
    (which records the same fields; it times nothing, so no duration_ms there)."""
    ent = lambda s, d=1.0, g="7", n="nccl:all_reduce": dict(  # noqa: E731
        process_group=(g, ""), collective_seq_id=s, profiling_name=n, **({} if d is None else {"duration_ms": d}))
    seen = {}
    assert take(seen, [ent(1), ent(2), ent(3, None), ent(4), ent(1, g="0")], "7") == 1
    assert take(seen, [ent(3, 2.0), ent(5, None), ent(6)], "7") == 1
    assert per_step_sums([0, 2, 4, 6], seen) == [2.0, 3.0], per_step_sums([0, 2, 4, 6], seen)
    assert per_step_sums([0, 2, 9], seen) == [2.0]  # 7..9 not in the ring: skipped
    ev = [dict(ph="X", cat="kernel", name="ncclDevKernel_AllReduce_Sum_f32_RING_LL", ts=1000.0, dur=500.0),
          dict(ph="X", cat="kernel", name="void oneRankReduce<FuncPreMulSum<float> >", ts=1400.0, dur=200.0),
          dict(ph="X", cat="kernel", name="void at::native::reduce_kernel<512, 1>", ts=3000.0, dur=100.0),
          dict(ph="X", cat="cpu_op", name="nccl:all_reduce", ts=0.0, dur=9000.0)]
    ms, n = kernel_comm(ev)
    assert abs(ms - 0.6) < 1e-9 and n == 2, (ms, n)
    fn = getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)
    if fn is None:
        print("selftest: synthetic parts OK; this torch has no _dump_fr_trace (gloo recorder) to check against")
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    g = dist.new_group()
    fr, t = FlightTiming(g, 0, dump=fn), torch.ones(4)
    for per_step in (2, 3, 1):
        fr.begin()
        for _ in range(per_step):
            dist.all_reduce(t, group=g)
    dist.all_reduce(t)  # the default group: not this group's
    bounds = [*fr.bounds, g._get_sequence_number_for_group()]
    fr.read()
    counts = [sum(1 for s in range(lo + 1, hi + 1) if "all_reduce" in fr.seen[s][0]) for lo, hi in zip(bounds, bounds[1:])]
    assert counts == [2, 3, 1], (bounds, fr.seen)
    dist.destroy_process_group()
    print(f"selftest OK (gloo recorder: steps map to seq ranges {bounds}, entries {sorted(fr.seen)})")


if __name__ == "__main__":
    args = parse_args()
    selftest() if args.selftest else main(args)
