#!/usr/bin/env bash
# Everything a GPU check needs, in one call on the lent GPU machine (see docs/GPU.md).
#   bash bench/gpu_check.sh [presets|seed|topo] ...   (default: topo presets)
# Writes summaries and a tarball of the run directories to $OUT (or ./gpu-out).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
N=${N:-$(nvidia-smi -L 2>/dev/null | wc -l)}
STEPS=${STEPS:-30}; WARMUP=${WARMUP:-10}
PRESETS=${PRESETS:-single baseline static view bf16 fp16 powersgd overlap bf16-overlap amp}
RUNS=/tmp/ddptop-gpu-runs
PY=${PY:-python3}
# runtime dependencies the GPU image lacks, carried as wheels (WHEELS=dir; ddptop needs ijson)
if ls ${WHEELS:-.whl}/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ${WHEELS:-.whl}/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

facts() {
  echo "== $(date -u +%FT%TZ) $(nvidia-smi -L | head -1) x$N"
  $PY -c 'import torch,torchvision;print("torch",torch.__version__,"torchvision",torchvision.__version__,"nccl",torch.cuda.nccl.version())'
}

topo() {
  echo "== nvidia-smi topo -m"; nvidia-smi topo -m | tee "$OUT/nvidia_smi_topo.txt"
  echo "== ddptop topo"; $PY -m ddptop topo | tee "$OUT/ddptop_topo.txt"
}

presets() {  # every preset, NVLink then NCCL_P2P_DISABLE=1 (the article's SHM box)
  for P2P in ${P2PS:-0 1}; do
    for p in $PRESETS; do
      [ "$p" = single ] && [ "$P2P" = 1 ] && continue
      NCCL_P2P_DISABLE=$P2P timeout 120 $PY -m ddptop --headless --json --interval 30 --nproc "$N" \
        --preset "$p" --steps "$STEPS" --warmup "$WARMUP" --runs-dir "$RUNS/p2p$P2P" > /tmp/run.out 2>&1
      rc=$?
      tail -1 /tmp/run.out | $PY -c "
import json,sys
d=json.loads(sys.stdin.read()); d['p2p_disable']=$P2P; d['rc']=$rc
print(json.dumps(d))" >> "$OUT/summaries.jsonl" 2>/dev/null || { echo "run $p p2p=$P2P rc=$rc"; tail -20 /tmp/run.out; }
      tail -1 "$OUT/summaries.jsonl" | $PY -c "
import json,sys
d=json.loads(sys.stdin.read()); t=d.get('nccl') or {}
print(f\"p2p_disable=$P2P {d['preset']:<13} {d['status']:<9} {d['steps_per_s']} steps/s  p50 {d['step_ms_p50']} ms  comm {d.get('comm_share')}  exposed {d.get('exposed_comm_share')}  {set((t.get('transports') or {}).values())}\")"
    done
  done
}

seed() {  # the plain reference recipe vs ddptop's trainer, same config, back to back
  S=${SEED:-.ref/seed_repro.py}
  for args in "" "--static --view --hook bf16 --bucket 100"; do
    torchrun --standalone --nproc_per_node="$N" "$S" --steps "$STEPS" --warmup "$WARMUP" $args 2>&1 | grep RESULT | tee -a "$OUT/seed.txt"
  done
}

live() {  # transports, advice, and a torch.profiler window compared with ddptop's own comm timer, NVLink and SHM
  for P2P in ${P2PS:-0 1}; do
    NCCL_P2P_DISABLE=$P2P timeout 150 $PY -m ddptop --headless --json --interval 30 --nproc "$N" --preset ${LIVE_PRESET:-baseline} \
      --steps 30 --warmup 10 --capture 20:3 --profiler torch --runs-dir "$RUNS/live$P2P" > /tmp/live.out 2>&1
    echo "rc=$? p2p_disable=$P2P"; grep -E "^(gradient|advice|capture)" /tmp/live.out | head -6
    tail -1 /tmp/live.out > "$OUT/live_p2p$P2P.json"
    $PY - "$OUT/live_p2p$P2P.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1])); cap = d["captures"][0]; s = cap.get("summary") or {}
print("transports", (d.get("nccl") or {}).get("transports"), "advice:", (d.get("advice") or {}).get("preset"),
      "comm_share", d.get("comm_share"), "steps/s", d.get("steps_per_s"))
for rank, r in sorted(s.get("ranks", {}).items()):
    print(f"rank {rank} steps {r.get('steps')}: ddptop timer {r.get('timer_comm_ms')} ms, profiler NCCL kernels {r.get('comm_ms')} ms,"
          f" timer/trace {r.get('timer_vs_trace')}, step ms {r.get('step_ms')}, overlap {r.get('overlap_ms')},"
          f" top {r['top'][0]['name'][:50] if r.get('top') else None}")
PYEOF
  done
}

capovh() {  # steps/s outside a capture window vs the same run without one
  timeout ${CAPOVH_TIMEOUT:-300} $PY bench/investigations/capture_overhead.py --nproc "$N" --steps ${CAPOVH_STEPS:-70} --warmup 10 \
    --capture 35:3 --rounds ${CAPOVH_ROUNDS:-2} --runs-dir "$RUNS/capovh" 2>&1 | tee "$OUT/capture_overhead.txt"
}

nsysrun() {  # nsys mode with the binary the image has (not on PATH); the importer's libraries carried in .carry/nsyslibs
  export DDPTOP_NSYS_LIBS=${DDPTOP_NSYS_LIBS:-$PWD/.carry/nsyslibs}
  timeout ${NSYS_TIMEOUT:-240} $PY -m ddptop --headless --json --interval 30 --nproc "$N" --preset baseline --steps 25 --warmup 5 \
    --capture 12:2 --profiler nsys --nsys-path "${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}" \
    --runs-dir "$RUNS/nsys" > /tmp/nsys.out 2>&1; echo "rc=$?"
  grep -E "^(run|capture)" /tmp/nsys.out; tail -1 /tmp/nsys.out | $PY -c "import json,sys; d=json.load(sys.stdin); print(json.dumps(d.get('nsys'))[:1500])"
  ls -la "$RUNS"/nsys/*/captures/ | head -20; tail -15 "$RUNS"/nsys/*/logs/*/attempt_0/0/stderr.log 2>/dev/null | tail -15
}

nsyscheck() {  # issue 18: what one 3-step nsys window costs (seconds cudaProfilerStart/Stop held the rank) per flag set,
  # ViT-L on 1 GPU, then the importer (carried libdw: .carry/nsyslibs) and nsys stats; ~6 min. NSYS_SETS='a|b' picks flag sets.
  export DDPTOP_NSYS_LIBS=${DDPTOP_NSYS_LIBS:-$PWD/.carry/nsyslibs}
  local ns=${NSYS:-$(ls -d /opt/nvidia/nsight-systems/*/bin/nsys /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | sort -V | tail -1)}
  echo "== nsys $ns ($("$ns" --version 2>&1 | head -1)); libs in $DDPTOP_NSYS_LIBS: $(ls "$DDPTOP_NSYS_LIBS" 2>/dev/null | tr '\n' ' ')"
  ls "$(dirname "$ns")"/../linux-desktop-glibc_*-x64/QdstrmImporter "$(dirname "$ns")"/../host-linux-x64/QdstrmImporter 2>/dev/null
  "$ns" profile --help 2>&1 | grep -oE -- "--(cuda-trace-scope|capture-range-end|sample|cpuctxsw|cuda-event-trace|cuda-flush-interval)[=a-z<>|-]*" | sort -u | tr '\n' ' '; echo
  "$ns" stats --help-reports 2>&1 | grep -E "^ *[a-z_]+(\[|  *--)" | awk '{print $1}' | tr '\n' ' '; echo
  local sets=${NSYS_SETS:-"--trace=cuda,nvtx --sample=none --cpuctxsw=none --capture-range-end=repeat|--trace=cuda,nvtx --sample=none --cpuctxsw=none --capture-range-end=stop|--trace=cuda,nvtx,osrt --capture-range-end=repeat"}
  local i=0 flags t0 rc
  IFS='|' read -ra flagsets <<< "$sets"
  for flags in "${flagsets[@]}"; do
    i=$((i+1)); t0=$(date +%s)
    DDPTOP_NSYS_FLAGS="$flags" timeout ${NSYSCHECK_TIMEOUT:-160} $PY -m ddptop --nproc 1 --headless --json --interval 30 \
      --preset baseline --steps 25 --warmup 5 --capture 20:3 --profiler nsys --nsys-path "$ns" --runs-dir "$RUNS/nsyscheck$i" \
      > /tmp/nsyscheck$i.out 2>&1; rc=$?
    echo "== flag set $i: $flags -> rc=$rc, whole run $(( $(date +%s) - t0 )) s"
    grep -E "^(run |capture|stalls|note)" /tmp/nsyscheck$i.out | head -6
    $PY -c "import glob, json; [print('argv:', ' '.join(json.load(open(p))['_launch']['argv'])[-500:]) for p in glob.glob('$RUNS/nsyscheck$i/*/config.json')]" 2>&1 | head -2
    ls -la "$RUNS"/nsyscheck$i/*/captures/ "$RUNS"/nsyscheck$i/*/captures/1/ 2>/dev/null | grep -v "^total"
    echo "window times (the rank's own): $(cat "$RUNS"/nsyscheck$i/*/captures/1/*.nsys-window 2>/dev/null)"
    tail -1 /tmp/nsyscheck$i.out | $PY -c "
import json, sys
try:
    d = json.loads(sys.stdin.read())
except ValueError:
    print('no summary line'); raise SystemExit
n = d.get('nsys') or {}
print('steps/s', d.get('steps_per_s'), '| importer', n.get('importer'), '| note', n.get('note'))
for e in n.get('errors') or []: print('error:', e)
for cap in d.get('captures') or []:
    s = cap.get('summary') or {}
    print('capture', cap['id'], cap['steps'], cap['status'], cap.get('error') or '', 'held max', s.get('nsys_held_s_max'), 's')
    for r, v in (s.get('ranks') or {}).items():
        print(' rank', r, 'times', v.get('times'), '|', v.get('note'))
        k = v.get('cuda_gpu_kern_sum') or {}
        for t in (k.get('comm_kernels') or [])[:2]: print('   comm kernel', t['name'][:90], t.get('count'), t.get('ms'), 'ms')
        print('   nvtx steps', (v.get('nvtx_sum') or {}).get('step_ms'), 'csv', v.get('csv'))
" 2>&1 | head -30
    tail -4 "$RUNS"/nsyscheck$i/*/captures/*.stats.txt 2>/dev/null | cut -c1-300
    [ $rc = 0 ] || tail -15 /tmp/nsyscheck$i.out
    rm -f "$RUNS"/nsyscheck$i/*/captures/*.sqlite
  done
}

overhead() {  # ddptop's trainer under ddptop vs the plain reference recipe, same config, back to back
  S=${SEED:-.ref/seed_repro.py}
  for i in $(seq ${OVH_ROUNDS:-2}); do
    for cfg in "baseline|" "overlap|--static --view --bucket 100" "bf16-overlap|--static --view --hook bf16 --bucket 100"; do
      [ -n "${OVH_PRESETS:-}" ] && [[ " $OVH_PRESETS " != *" ${cfg%%|*} "* ]] && continue
      p=${cfg%%|*}; a=${cfg#*|}
      r=$(torchrun --standalone --nproc_per_node="$N" "$S" --steps 40 --warmup 10 $a 2>&1 | grep RESULT | sed 's/RESULT //')
      d=$($PY -m ddptop --headless --json --nproc "$N" --preset "$p" --steps 40 --warmup 10 --set data=device --runs-dir "$RUNS/ovh" 2>&1 | tail -1)
      $PY -c "import json,sys; r=json.loads(sys.argv[1]); d=json.loads(sys.argv[2]); print(f'overhead $p run $i: seed {r[\"steps_per_s\"]:.3f} ddptop {d[\"steps_per_s\"]:.3f} ratio {d[\"steps_per_s\"]/r[\"steps_per_s\"]:.3f}')" "$r" "$d" | tee -a "$OUT/overhead.txt"
    done
  done
}

overhead_off() {  # isolate the comm-timing hook: ddptop with comm_timing=false vs the reference
  S=${SEED:-.ref/seed_repro.py}
  r=$(torchrun --standalone --nproc_per_node="$N" "$S" --steps 40 --warmup 10 2>&1 | grep RESULT | sed 's/RESULT //')
  d=$($PY -m ddptop --headless --json --nproc "$N" --preset baseline --steps 40 --warmup 10 --set data=device --set comm_timing=false --runs-dir "$RUNS/ovh" 2>&1 | tail -1)
  $PY -c "import json,sys; r=json.loads(sys.argv[1]); d=json.loads(sys.argv[2]); print(f'overhead baseline comm_timing=false: seed {r[\"steps_per_s\"]:.3f} ddptop {d[\"steps_per_s\"]:.3f} ratio {d[\"steps_per_s\"]/r[\"steps_per_s\"]:.3f}')" "$r" "$d" | tee -a "$OUT/overhead.txt"
}

tuneshm() {  # issue 7: tune on the article's SHM box
  NCCL_P2P_DISABLE=1 timeout ${TUNE_TIMEOUT:-330} $PY -m ddptop tune --nproc "$N" --steps 25 --warmup 8 --budget ${BUDGET:-240} --runs-dir "$RUNS/tune" > "$OUT/tune.txt" 2>&1
  echo "tune rc=$?"; tail -40 "$OUT/tune.txt"
}

screens() {  # TUI screenshots from a real GPU run (textual carried as wheels in .whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
  NCCL_P2P_DISABLE=${SCREEN_P2P:-1} timeout ${SCREEN_TIMEOUT:-240} $PY scripts/screenshots.py --out /tmp/screens --nproc "$N" ${SCREEN_ARGS:-} 2>&1 | tail -5
  ls /tmp/screens; tar czf "$OUT/screens.tgz" -C /tmp screens
}

sweep() {  # `ddptop sweep` itself, with the article's box (NCCL_P2P_DISABLE=1) and NVLink
  for P2P in ${SWEEP_P2PS:-1 0}; do
    [ "$P2P" = 1 ] && P=${SWEEP_SHM:-single,baseline,view,bf16,powersgd,overlap,bf16-overlap} || P=${SWEEP_NVL:-single,baseline,overlap,bf16-overlap}
    local tag=${SWEEP_TAG:-demo}_p2p$P2P
    # SWEEP_CMD: a script to sweep instead of the demo (`sweep -- CMD`); SWEEP_REPEAT: runs of each
    # preset, interleaved, so the table's intervals are across runs (issue 47; the timeout scales with it)
    local repeat=${SWEEP_REPEAT:-3}
    NCCL_P2P_DISABLE=$P2P timeout ${SWEEP_TIMEOUT:-$((240 * repeat))} $PY -m ddptop sweep --nproc "$N" --presets "$P" \
      --repeat "$repeat" --steps ${STEPS} --warmup ${WARMUP} --runs-dir "$RUNS/sweep_$tag" ${SWEEP_CMD:+-- $SWEEP_CMD} \
      > "$OUT/sweep_$tag.md" 2>&1
    echo "sweep $tag rc=$?"; tail -40 "$OUT/sweep_$tag.md"
    cp "$RUNS"/sweep_$tag/sweep-*/sweep.json "$OUT/sweep_$tag.json" 2>/dev/null
  done
}

multinode() {  # two ddptop "nodes" of one GPU each, told apart by NCCL_HOSTID, so NCCL goes over NET
  PORT=29650; export DDPTOP_TOKEN=gpucheck
  CUDA_VISIBLE_DEVICES=0 timeout 120 $PY -m ddptop --headless --json --runs-dir "$RUNS/mn0" --nnodes 2 --node-rank 0 \
    --rdzv-endpoint 127.0.0.1:$PORT --nproc 1 --steps 30 --set nccl_env.NCCL_HOSTID=nodeA > /tmp/mn0.out 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 120 $PY -m ddptop --headless --runs-dir "$RUNS/mn1" --nnodes 2 --node-rank 1 \
    --rdzv-endpoint 127.0.0.1:$PORT --nproc 1 --steps 30 --set nccl_env.NCCL_HOSTID=nodeB > /tmp/mn1.out 2>&1
  echo "node1 rc=$?"; wait; tail -1 /tmp/mn0.out > "$OUT/multinode.json"
  $PY -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['status'], s['world_size'], s.get('nnodes'), s['steps_per_s'], (s.get('nccl') or {}).get('transports'), [(r['rank'], r.get('node'), r['host'], r['steps']) for r in s['ranks']], (s.get('advice') or {}).get('reason'))" "$OUT/multinode.json" || tail -20 /tmp/mn0.out /tmp/mn1.out
  $PY -m ddptop nccl "$RUNS"/mn0/*/nccl/*.log | head -20
}

userscripts() {  # users' own scripts, unchanged, under ddptop: phases, comm, a profiler window vs ddptop's timer
  # (USER_STEPS=150 USER_CAPTURE=100:3: the window after the default began timing one step in K)
  for spec in ${USER_SCRIPTS:-"tests/scripts/plain_ddp.py --batch-size 256" "tests/scripts/accum_ddp.py" \
      "tests/scripts/lightning_ddp.py" "tests/scripts/two_optimizers.py" "tests/scripts/single_process.py" \
      "bench/gpt_train.py --compile" "bench/gpt_train.py"}; do
    timeout ${USER_TIMEOUT:-240} $PY -m ddptop --headless --json --interval 60 --nproc "$N" --warmup 10 --capture ${USER_CAPTURE:-25:3} --profiler torch \
      --runs-dir "$RUNS/user" -- $PY $spec --steps ${USER_STEPS:-40} > /tmp/user.out 2>&1
    rc=$?; tail -1 /tmp/user.out > /tmp/user.json
    $PY - "$rc" "$spec" /tmp/user.json "$OUT/userscripts.jsonl" <<'PYEOF' || { echo "== $2 rc=$rc"; tail -30 /tmp/user.out; }
import json, sys
rc, spec, path, out = sys.argv[1:]
d = json.load(open(path)); d["spec"], d["rc"] = spec, int(rc)
open(out, "a").write(json.dumps(d) + "\n")
cap = (d.get("captures") or [{}])[0]; s = cap.get("summary") or {}
print(f"== {spec}: rc={rc} {d['status']} backend {d['backend']} model {d['model']} params {d['params']} batch {d['batch_size']} "
      f"{d['steps_per_s']} steps/s notes {d.get('notes')}")
for r in d["ranks"]:
    t = (s.get("ranks") or {}).get(str(r["rank"]), {})
    print(f"  rank {r['rank']} {r['status']} steps {r['steps']} timed {r.get('timed_steps')} K {(r.get('info') or {}).get('phase_every')} step p50 {r['step_ms_p50']} phases {r['phases_ms']} "
          f"comm p50 {r.get('comm_ms_p50')} exposed p50 {r.get('exposed_comm_ms_p50')} timed {r.get('comm_timed_steps')} | "
          f"capture {cap.get('status')}: timer {t.get('timer_comm_ms')} ms vs trace {t.get('comm_ms')} ms = {t.get('timer_vs_trace')}")
PYEOF
  done
}

frtiming() {  # TORCH_NCCL_ENABLE_TIMING + flight recorder vs ddptop's comm hook: accuracy and cost (one job)
  timeout ${FR_TIMEOUT:-300} torchrun --standalone --nproc_per_node="$N" bench/investigations/fr_timing.py --model vit_l_32 \
    --steps ${FR_STEPS:-100} --warmup 10 --rounds ${FR_ROUNDS:-3} --prof-steps 10 ${FR_ARGS:-} 2>&1 | grep -v -i warn \
    | tee -a "$OUT/fr_timing.txt" | tail -25
}

ovhpairs() {  # the same script plain under torchrun vs under ddptop, alternating (bench/investigations/overhead_pairs.py)
  for w in ${OVH_WORKLOADS:-vit gpt seed}; do
    timeout ${OVHP_TIMEOUT:-560} $PY bench/investigations/overhead_pairs.py --workload $w --nproc "$N" --pairs ${OVH_PAIRS:-3} --steps ${OVH_STEPS:-100} \
      --warmup 10 ${OVH_ARGS:-} ${OVH_VARIANTS:-} --json-out "$OUT/ovh_$w.json" 2>&1 | tee -a "$OUT/overhead_pairs.txt" | tail -12
  done
}

ovhsplit() {  # where the instrument's cost goes: host us/step of a launch-bound loop, then ViT-L pairs with variants
  [ "${HC_ROUNDS:-3}" -gt 0 ] && $PY bench/investigations/instrument_host_cost.py --device cuda --rounds ${HC_ROUNDS:-3} --steps 300 \
    --variants plain,instrument,nocomm,timed 2>&1 | tee -a "$OUT/host_cost.txt" | tail -7
  for w in ${OVH_WORKLOADS:-vit}; do
    timeout ${OVHP_TIMEOUT:-420} $PY bench/investigations/overhead_pairs.py --workload $w --nproc "$N" --pairs ${OVH_PAIRS:-2} \
      --steps ${OVH_STEPS:-200} --warmup 10 ${OVH_ARGS:-} ${OVH_VARIANTS---variant nofr:TORCH_NCCL_TRACE_BUFFER_SIZE=0} \
      --json-out "$OUT/ovhsplit_$w.json" 2>&1 | tee -a "$OUT/overhead_split.txt" | tail -12
  done
}

tracecheck() {  # issue 18: a torch.profiler window on the ViT-L trainer (1 GPU: oneRankReduce) vs ddptop's comm timer,
  # the capture summary's window/idle/compute/comm/memory, and `ddptop trace` on the capture; the traces land in $OUT
  local n=${TRACE_N:-1}
  timeout ${TRACE_TIMEOUT:-240} $PY -m ddptop --headless --json --interval 30 --nproc "$n" --preset ${TRACE_PRESET:-baseline} \
    --steps 30 --warmup 10 --capture 20:3 --profiler torch --runs-dir "$RUNS/trace" > /tmp/trace.out 2>&1
  echo "rc=$? nproc=$n"; grep -E "^capture" /tmp/trace.out
  tail -1 /tmp/trace.out | $PY -c "
import json, sys
d = json.loads(sys.stdin.read()); cap = d['captures'][0]; s = cap.get('summary') or {}
print('capture', cap['status'], cap.get('error') or '', 'files', cap['files'])
print('timer_vs_trace_mean', s.get('timer_vs_trace_mean'), '| open:', s.get('open_with'))
for rank, r in sorted(s.get('ranks', {}).items()):
    print(f\"rank {rank}: timer {r.get('timer_comm_ms')} ms / trace comm {r.get('comm_ms')} ms = {r.get('timer_vs_trace')}\"
          f\" (comm by {r.get('comm_by')}); window {r.get('window_ms')} busy {r.get('busy_ms')} idle {r.get('idle_ms')}\"
          f\" ({r.get('idle_pct')}%) compute {r.get('compute_ms')} memory {r.get('memory_ms')} overlap {r.get('overlap_ms')}\")
" 2>&1 | head -20
  local steps; steps=$(ls "$RUNS"/trace/*/steps.jsonl 2>/dev/null | tail -1)
  [ -n "$steps" ] && { echo "records $(wc -l < "$steps"), with comm_ms $(grep -c '"comm_ms"' "$steps")"; tail -2 "$steps" | cut -c1-400; }
  tail -1 /tmp/trace.out | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); print('comm_timing:', [r.get('info', {}).get('comm_timing') for r in d['ranks']])" 2>&1 | tail -1
  local dir; dir=$(ls -d "$RUNS"/trace/*/captures/1 2>/dev/null | tail -1)
  [ -n "$dir" ] && { ls -la "$dir"; $PY -m ddptop trace "$dir" | tee "$OUT/trace.txt" | head -30; cp "$dir"/*.json.gz "$OUT"/ 2>/dev/null; }
}

timeline() {  # issue 21: bucket spans (CUDA events on timed steps) and allocator memory from a GPU run, drawn as the TUI does
  for p in ${TL_PRESETS:-bf16 baseline}; do
    timeout 150 $PY -m ddptop --headless --json --interval 30 --nproc "$N" --preset "$p" --steps ${TL_STEPS:-60} --warmup 10 \
      --runs-dir "$RUNS/tl_$p" > /tmp/tl.out 2>&1; echo "== timeline preset $p rc=$?"; grep -E "^(run|gradient)" /tmp/tl.out | head -3
    $PY - "$(ls "$RUNS"/tl_$p/*/steps.jsonl | tail -1)" <<'PYEOF'
import json, sys
from ddptop.model.timeline import step_timeline
from ddptop.tui.widgets.step_timeline import timeline_lines
recs = [json.loads(line) for line in open(sys.argv[1])]
spans = [r for r in recs if "comm_spans" in r]
mem = [r for r in recs if "mem_allocated_mb" in r]
print(f"records {len(recs)}: with comm_spans {len(spans)}, with comm_ms {sum('comm_ms' in r for r in recs)}, "
      f"with allocator memory {len(mem)} (steps {[r['step'] for r in mem if r['rank'] == 0]})")
for r in mem[-2:]:
    print({k: r.get(k) for k in ("rank", "step", "mem_allocated_mb", "mem_reserved_mb", "mem_peak_mb", "rss_mb")})
last = spans[-1] if spans else recs[-1]
print({k: last.get(k) for k in ("rank", "step", "step_ms", "backward_ms", "comm_ms", "exposed_comm_ms", "buckets")},
      "spans", len(last.get("comm_spans", [])), last.get("comm_spans", [])[:4])
for line in timeline_lines(step_timeline(last, [tuple(s) for s in last.get("comm_spans", [])]), 110):
    print(line.plain)
PYEOF
  done
  $PY -c "
import time, torch
from ddptop.rank.memory import memory_sample
x = torch.zeros(1 << 20, device='cuda'); memory_sample(torch, True); t = time.perf_counter()
for _ in range(5000): memory_sample(torch, True)
print(f'memory_sample on {torch.cuda.get_device_name()}: {(time.perf_counter() - t) / 5000 * 1e6:.1f} us a call (every 10th step)')"
}

ab() {  # issue 27: the rank-side layer's cost inside one run per workload, engaged vs bypassed blocks (bench/overhead_ab.py)
  timeout ${AB_TIMEOUT:-560} $PY bench/overhead_ab.py --workloads ${AB_WORKLOADS:-demo,gpt} --nproc "$N" \
    --block-s ${AB_BLOCK_S:-0.001} --blocks ${AB_BLOCKS:-2000} --arms ${AB_ARMS:-on,off,aa,busy} --self-check "${AB_CHECK:-}" --timeout ${AB_RUN_TIMEOUT:-400} ${AB_PARTS:+--parts} \
    --json-out "$OUT/ab_${AB_TAG:-1}.json" 2>&1 | tee -a "$OUT/ab.txt" | grep -v "^\s*$" | tail -40
}

ncclcost() {  # issue 27: NCCL's own timing (TORCH_NCCL_ENABLE_TIMING + ddptop's completion hook), extra us per collective
  local specs
  IFS='|' read -ra specs <<< "${NCCLCOST_SPECS:-262144 0|262144 20|6553600 20}"  # '|' between specs
  for spec in "${specs[@]}"; do
    set -- $spec
    timeout 200 torchrun --standalone --nproc_per_node="$N" bench/investigations/nccl_timing_cost.py --numel $1 --python-us $2 \
      --rounds ${NCCLCOST_ROUNDS:-40} --ops ${NCCLCOST_OPS:-300} 2>&1 | grep -E "^rank|NCCL_TIMING_COST|Error" | tee -a "$OUT/ncclcost.txt"
  done
}

commcheck() {  # issue 27: comm_ms by default vs the NCCL kernels of a torch.profiler trace of the same steps, per rank
  local specs
  IFS='|' read -ra specs <<< "${COMM_SPECS:---preset baseline|--preset bf16|--preset powersgd|-- $PY bench/gpt_train.py --steps 60}"
  for spec in "${specs[@]}"; do
    touch /tmp/comm.mark
    timeout ${COMM_TIMEOUT:-200} $PY -m ddptop --headless --json --interval 60 --nproc "$N" --warmup 10 --steps 40 \
      --capture 25:3 --profiler torch --runs-dir "$RUNS/comm" $spec > /tmp/comm.out 2>&1
    rc=$?; tail -1 /tmp/comm.out > /tmp/comm.json
    find "$RUNS/comm" -name '*.trace.json*' -newer /tmp/comm.mark -print0 | tar czf "$OUT/comm_traces_$(date +%s).tgz" --null -T - 2>/dev/null
    # who waits for whom from the kernels' start times, by a script apart from ddptop (issue 28)
    echo "== offsets: $spec" >> "$OUT/offsets.txt"
    $PY bench/nccl_offsets.py $(find "$RUNS/comm" -name 'rank*.trace.json*' -newer /tmp/comm.mark) --ddptop /tmp/comm.json \
      2>&1 | tee -a "$OUT/offsets.txt" | tail -2
    $PY - "$rc" "$spec" /tmp/comm.json "$OUT/commcheck.jsonl" <<'PYEOF' || { echo "== $spec rc=$rc"; tail -30 /tmp/comm.out; }
import json, sys
rc, spec, path, out = sys.argv[1:]
d = json.load(open(path)); d["spec"], d["rc"] = spec, int(rc)
open(out, "a").write(json.dumps(d) + "\n")
cap = (d.get("captures") or [{}])[0]; s = cap.get("summary") or {}
print(f"== {spec}: rc={rc} {d['status']} model {d['model']} {d['steps_per_s']} steps/s comm_share {d.get('comm_share')} "
      f"exposed {d.get('exposed_comm_share')} capture {cap.get('status')} timer_vs_trace_mean {s.get('timer_vs_trace_mean')}")
for r in d["ranks"]:
    t = (s.get("ranks") or {}).get(str(r["rank"]), {})
    print(f"  rank {r['rank']} steps {r['steps']} p50 {r['step_ms_p50']} comm p50 {r.get('comm_ms_p50')} (timed {r.get('comm_timed_steps')})"
          f" hook p50 {r.get('hook_ms_p50')} exposed p50 {r.get('exposed_comm_ms_p50')} share {r.get('comm_share')} busbw {r.get('busbw_gbps')}"
          f" | trace: timer {t.get('timer_comm_ms')} vs NCCL kernels {t.get('comm_ms')} = {t.get('timer_vs_trace')};"
          f" hook {t.get('timer_hook_ms')} extra {t.get('hook_extra_ms')} | {(r.get('info') or {}).get('comm_timing')}"
          f" | clock: {(r.get('info') or {}).get('comm_clock')}")
PYEOF
    grep -h "PROFILER\|Profiler" $(find "$RUNS/comm" -name 'nccl.*.log' -newer /tmp/comm.mark) 2>/dev/null | sed 's/^.*NCCL INFO //' | sort | uniq -c | head -5
  done
}

plaintrace() {  # issue 27/28: the GPT script under plain torchrun (no ddptop), a torch.profiler window per rank
  for variant in ${PLAIN_VARIANTS:-item noitem}; do
    extra=""; [ $variant = noitem ] && extra="--no-item-every-step"
    rm -rf /tmp/plain_$variant
    timeout 120 torchrun --standalone --nproc_per_node="$N" bench/gpt_train.py --steps 40 --warmup 10 \
      --profile 30:3 --profile-dir /tmp/plain_$variant $extra 2>&1 | grep -E "steps/s|Error" | tee -a "$OUT/plaintrace.txt"
    echo "== plain gpt_train ($variant): NCCL kernel start offsets" | tee -a "$OUT/plaintrace.txt"
    $PY bench/nccl_offsets.py /tmp/plain_$variant/rank*.trace.json.gz 2>&1 | tee -a "$OUT/plaintrace.txt" | tail -2
  done
  tar czf "$OUT/plain_traces.tgz" -C /tmp plain_item plain_noitem 2>/dev/null
}

clockcost() {  # issue 27: a GPU stamp's host cost and its parts, inside an NCCL job with NCCL's timing on
  TORCH_NCCL_ENABLE_TIMING=1 timeout 120 torchrun --standalone --nproc_per_node="$N" bench/investigations/clock_cost.py 2>&1 | grep -E "^rank|Error" | tee -a "$OUT/clock_cost.txt"
}

stampcost() {  # issue 27: a stamp's host cost inside the HF Trainer, under ddptop and plain: CUDA, or the GIL's handoff?
  STAMP_OUT=$OUT/stamp_cost_live.jsonl timeout 150 $PY -m ddptop --headless --json --interval 60 --nproc "$N" \
    --runs-dir "$RUNS/stamp" -- $PY bench/investigations/stamp_cost_live.py --steps 60 2>&1 | tail -1 | cut -c1-300
  STAMP_OUT=$OUT/stamp_cost_live.jsonl timeout 150 torchrun --standalone --nproc_per_node="$N" \
    bench/investigations/stamp_cost_live.py --steps 60 2>&1 | grep -E "hf_train|Error" | tail -3
  cat "$OUT/stamp_cost_live.jsonl"
}

straggler() {  # issue 27: symmetric GPT script, rank 1's loader +5 ms a step, rank 1's GPU shared with a side process's matmuls
  for case in ${STRAG_CASES:-sym slow side}; do
    extra=""; side=""
    script="$PY bench/gpt_train.py --steps 100000"
    [ $case = slow ] && extra="--slow-rank 1 --slow-data-ms 5"
    [ $case = nosync ] && extra="--no-item-every-step"
    # a DataLoader at the top of the step, its collate 5 ms slower on rank 1 (the data phase)
    [ $case = slowdl ] && script="$PY tests/scripts/accum_ddp.py --steps 100000 --accum 1" && extra="--slow-rank 1 --slow-ms 5"
    if [ $case = side ]; then
      $PY -c "import torch,time; a=torch.randn(4096,4096,device='cuda:1'); t=time.time()
while time.time()-t<${STRAG_SIDE_S:-90}: a=(a@a).clamp_(-1,1)" & side=$!
    fi
    timeout ${STRAG_TIMEOUT:-120} $PY -m ddptop --headless --json --interval 10 --nproc "$N" --warmup 10 --steps ${STRAG_STEPS:-150} \
      --runs-dir "$RUNS/strag_$case" -- $script $extra > /tmp/strag.out 2>&1; rc=$?
    [ -n "$side" ] && kill $side 2>/dev/null
    grep -E "straggler" /tmp/strag.out | sed 's/^/   /' | tail -4
    tail -1 /tmp/strag.out > "$OUT/straggler_$case.json"
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print('== straggler case $case rc=$rc', d['status'], d['steps_per_s'], 'steps/s | verdict:', json.dumps(d.get('straggler_check') or d.get('straggler'))[:600]); [print('  rank', r['rank'], r['step_ms_p50'], r['phases_ms'], r.get('exposed_comm_ms_p50')) for r in d['ranks']]" "$OUT/straggler_$case.json" || tail -20 /tmp/strag.out
  done
}

bill() {  # issue 42: the bill of costs, each part's us per launch / per all-reduce vs plain (bench/bill_of_costs.py)
  timeout ${BILL_TIMEOUT:-300} $PY bench/bill_of_costs.py --nproc "$N" --rounds ${BILL_ROUNDS:-3} \
    ${BILL_VARIANTS:+--variants $BILL_VARIANTS} --json-out "$OUT/bill.json" 2>&1 | tail -${BILL_TAIL:-60}
}

nsysps() {  # issue 42: nsys on PATH, a default run: no rank under nsys (ps); then --profiler nsys still captures
  NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | head -1)
  mkdir -p /tmp/nsysbin && ln -sf "$NSYS" /tmp/nsysbin/nsys
  PATH=/tmp/nsysbin:$PATH timeout 90 $PY -m ddptop --headless --json --interval 30 --nproc "$N" --preset baseline \
    --steps 40 --warmup 5 --capture 20:3 --runs-dir "$RUNS/nsysps" > /tmp/nsysps.out 2>&1 &
  sleep ${NSYSPS_AT:-25}; echo "== ps during a default run with nsys on PATH (rank processes and any nsys):"
  ps -eo pid,ppid,args | grep -E "nsys|trainer" | grep -v grep | cut -c1-160
  wait; tail -1 /tmp/nsysps.out | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); print('default run:', d['status'], 'profiler', [c.get('profiler') for c in d.get('captures') or []])" || tail -5 /tmp/nsysps.out
  PATH=/tmp/nsysbin:$PATH timeout 120 $PY -m ddptop --headless --json --interval 30 --nproc "$N" --preset baseline \
    --steps 40 --warmup 5 --capture 20:3 --profiler nsys --runs-dir "$RUNS/nsysasked" > /tmp/nsysasked.out 2>&1
  echo "== --profiler nsys rc=$?"; grep -E "^capture|nsys" /tmp/nsysasked.out | head -5; ls -la $RUNS/nsysasked/*/captures/* 2>/dev/null | head -8
}

cost() {  # issue 42: `ddptop cost` (ABBA whole runs vs plain torchrun) on a workload: gpt, vit, hf
  # COST_DDPTOP_ARGS: options of the ddptop arm (e.g. '--set nccl_timing=false'), COST_TAG names the output;
  # DDPTOP_HARDWARE_S=0 in the environment switches NVML sampling off (the ViT +0.77 ms question)
  # COST_LOCKSTEP=1: both arms at once, in turns (--lockstep); COST_PIN_MAIN=1: --pin-main; COST_CPUS: --cpus
  local extra=() tag=${COST_TAG:-${COST_WORKLOAD:-gpt}}
  [ -n "${COST_DDPTOP_ARGS:-}" ] && extra=(--ddptop-args "$COST_DDPTOP_ARGS")
  [ -n "${COST_LOCKSTEP:-}" ] && extra+=(--lockstep)
  [ -n "${COST_PIN_MAIN:-}" ] && extra+=(--pin-main)
  [ -n "${COST_CPUS:-}" ] && extra+=(--cpus "$COST_CPUS")
  case ${COST_WORKLOAD:-gpt} in
    gpt) cmd="$PY bench/gpt_train.py --n-layer 6 --n-head 6 --n-embd 384 --block 256 --batch-size 64 --vocab 65 --accum 2 --steps ${COST_STEPS:-160} --warmup 10";;
    hf) cmd="$PY bench/hf_train.py --steps ${COST_STEPS:-60}";;
    vit) cmd="";;
  esac
  if [ -n "$cmd" ]; then
    timeout ${COST_TIMEOUT:-560} $PY -m ddptop cost --nproc "$N" --pairs ${COST_PAIRS:-10} --runs-dir "$RUNS/cost_$tag" --json "${extra[@]}" -- $cmd > /tmp/cost_$tag.out 2>&1
  else
    timeout ${COST_TIMEOUT:-560} $PY -m ddptop cost --nproc "$N" --pairs ${COST_PAIRS:-10} --runs-dir "$RUNS/cost_$tag" --json "${extra[@]}" --preset baseline --steps ${COST_STEPS:-60} > /tmp/cost_$tag.out 2>&1
  fi
  echo "== cost $tag rc=$?"; grep -v '^{' /tmp/cost_$tag.out | tail -40 | tee "$OUT/cost_$tag.txt"
  tail -1 /tmp/cost_$tag.out > "$OUT/cost_$tag.json"
}

cap45() {  # issue 45: captures measure the job: the demo's --capture 20:6 (no straggler), then the GPT script with one
  # rank made slow (extra matmuls in its forward): the profiled-vs-unprofiled ratio, who-waits, `ddptop trace`
  for case in demo slowmm; do
    if [ $case = demo ]; then job=(--preset baseline --steps 40 --capture 20:6)
    else job=(--steps 70 --capture 40:6 -- $PY bench/gpt_train.py --steps 70 --warmup 10 --slow-rank ${CAP45_SLOW_RANK:-1} --slow-matmuls ${CAP45_MM:-30}); fi
    timeout ${CAP45_TIMEOUT:-150} $PY -m ddptop --headless --json --interval 30 --nproc "$N" --warmup 10 --profiler torch \
      --runs-dir "$RUNS/cap45_$case" "${job[@]}" > /tmp/cap45.out 2>&1
    echo "== cap45 $case rc=$?"; grep -E "^(capture|straggler|  )" /tmp/cap45.out | head -20
    tail -1 /tmp/cap45.out > "$OUT/cap45_$case.json"
    $PY - "$OUT/cap45_$case.json" <<'PYEOF' || tail -20 /tmp/cap45.out
import json, sys
d = json.load(open(sys.argv[1])); print("run verdict:", json.dumps(d.get("straggler_check") or d.get("straggler"))[:400])
for cap in d.get("captures") or []:
    s = cap.get("summary") or {}
    print("capture", cap.get("id"), cap.get("steps"), cap.get("status"), "warmup", cap.get("warmup"),
          "| perturbation", json.dumps(s.get("perturbation")), "| who-waits", json.dumps(s.get("cross_rank"))[:900])
PYEOF
    cdir=$(ls -d "$RUNS"/cap45_$case/*/captures/1 2>/dev/null | tail -1)  # the newest: a warm machine keeps earlier calls' runs
    [ -n "$cdir" ] && $PY -m ddptop trace "$cdir" 2>&1 | head -${CAP45_TRACE_LINES:-40}
  done
}

strag44() {  # issue 44: its table's five cases (symmetric first and last; rank 2's loader +6 / +40 ms; 8 / 30 extra
  # matmuls in rank 3's / rank 1's forward) with bench/gpt_train.py on $N GPUs: the rank, phase and cost ddptop names
  # beside the step-time loss against the symmetric runs (the script's own timing). STRAG44_SET=comm_timing_every=1 ...
  # STRAG44_PAUSE=120:240 (with STRAG44_STEPS=370): each case's loss read in its own run, slow steps against paused
  # ones (straggler_cost.py --pause), the symmetric runs first and last only
  timeout ${STRAG44_TIMEOUT:-580} $PY bench/straggler_cost.py --nproc "$N" --steps ${STRAG44_STEPS:-150} --warmup 10 \
    ${STRAG44_PAUSE:+--pause $STRAG44_PAUSE --no-interleave} \
    ${STRAG44_GPT_ARGS:+--gpt-args "$STRAG44_GPT_ARGS"} ${STRAG44_CASES:+--cases "$STRAG44_CASES"} \
    ${STRAG44_SET:+--set $STRAG44_SET} --timeout ${STRAG44_RUN_TIMEOUT:-150} --runs-dir "$RUNS/strag44" \
    --json-out "$OUT/straggler_cost.json" 2>&1 | tee -a "$OUT/straggler_cost.txt" | tail -${STRAG44_TAIL:-45}
}

hostlate() {  # issue 44: why one rank's host is late in symmetric runs: its threads' CPU, CPUs and clocks beside the
  # run (bench/investigations/host_late.py); HOSTLATE_ARGS: the script's arguments (default: strag44's GPT shape)
  timeout ${HOSTLATE_TIMEOUT:-400} $PY bench/investigations/host_late.py --nproc "$N" --runs ${HOSTLATE_RUNS:-4} \
    --json-out "$OUT/host_late.json" -- bench/gpt_train.py ${HOSTLATE_ARGS:---n-layer 6 --n-head 12 --n-embd 768 --block 256 \
    --batch-size 64 --vocab 65 --no-item-every-step --steps 150 --warmup 10} 2>&1 | tee "$OUT/host_late.txt" | tail -30
}

hostpace() {  # issue 44: can a rank's host pace be read while its host runs ahead (bench/investigations/host_pace.py):
  # one GPU's launch loop, then HOSTPACE_CASES' --slow-pause runs of strag44's GPT shape, each rank's launching threads' CPU
  CUDA_VISIBLE_DEVICES=0 timeout 60 $PY bench/investigations/host_pace.py --launches 20000 2>&1 | tee "$OUT/host_pace.txt"
  IFS=';' read -ra cases <<< "${HOSTPACE_CASES:-mm30=--slow-rank 1 --slow-matmuls 30;load6=--slow-rank 2 --slow-data-ms 6;sym=}"
  for c in "${cases[@]}"; do
    echo "== ${c%%=*}: ${c#*=}" | tee -a "$OUT/host_pace.txt"
    timeout 150 $PY bench/investigations/host_pace.py --nproc "$N" --runs-dir "$RUNS/hostpace/${c%%=*}" -- bench/gpt_train.py \
      --n-layer 6 --n-head 12 --n-embd 768 --block 256 --batch-size 64 --vocab 65 --no-item-every-step --cpus-per-rank 8 \
      ${c#*=} 2>&1 | tee -a "$OUT/host_pace.txt"
  done
}

spread() {  # issue 42: why a pinned launch loop's speed differs between fresh processes (bench/investigations/launch_spread.py)
  CUDA_VISIBLE_DEVICES=0 timeout ${SPREAD_TIMEOUT:-400} $PY bench/investigations/launch_spread.py --rounds ${SPREAD_ROUNDS:-6} \
    2>&1 | tee "$OUT/launch_spread.txt"
}

episodes() {  # issue 42: are a launch loop's slow spells machine-wide? a lock-step A/A's grain (bench/investigations/launch_episodes.py)
  timeout ${EPISODES_TIMEOUT:-200} $PY bench/investigations/launch_episodes.py --seconds ${EPISODES_SECONDS:-90} 2>&1 | tee "$OUT/launch_episodes.txt" | head -40
}

lockstep() {  # issue 42: the bill with two jobs taking turns burst by burst on the same cores and GPUs (bill_of_costs.py --lockstep)
  for pair in ${LOCKSTEP_PAIRS:-plain,plain_again plain,under_ddptop}; do
    timeout ${LOCKSTEP_TIMEOUT:-200} $PY bench/bill_of_costs.py --nproc "$N" --lockstep "$pair" --rounds ${LOCKSTEP_ROUNDS:-4} \
      --launches ${LOCKSTEP_LAUNCHES:-2000} --collectives ${LOCKSTEP_COLLECTIVES:-200} --turns ${LOCKSTEP_TURNS:-300} \
      2>&1 | tee "$OUT/lockstep_${pair/,/_vs_}.txt" | tail -12
  done
}

spy() {  # issue 42: py-spy on rank 0 of the char GPT under ddptop (bench/investigations/rank_spy.py): the main thread's
  # share in ddptop frames, by entry and leaf; SPY_CASES: tag=ddptop-args;... (default K = 1 and K = 4), SPY_NATIVE=1: --native
  local spy=${SPY_BIN:-$(ls /tmp/site/bin/py-spy 2>/dev/null || command -v py-spy)}
  IFS=';' read -ra cases <<< "${SPY_CASES:-pe1=;pe4=--set phase_every=4}"
  for case in "${cases[@]}"; do
    timeout ${SPY_TIMEOUT:-150} $PY bench/investigations/rank_spy.py --nproc "$N" --tag "${case%%=*}" --ddptop-args "${case#*=}" \
      --wait ${SPY_WAIT:-30} --duration ${SPY_DURATION:-15} --py-spy "$spy" --out "$OUT/spy" ${SPY_NATIVE:+--native} -- \
      $PY bench/gpt_train.py --n-layer 6 --n-head 6 --n-embd 384 --block 256 --batch-size 64 --vocab 65 --accum 2 \
      --steps ${SPY_STEPS:-3000} --warmup 10 | tee -a "$OUT/spy.jsonl"
  done
  rm -rf "$OUT"/spy/runs_*
}

inrun() {  # issue 42: the in-run A/B (`ddptop --cost N`: engaged vs bypassed step by step) on the char GPT: the
  # rank-side hooks' cost a timed step, the bill's hooks figure for this script (INRUN_STEPS steps)
  local n=${INRUN_STEPS:-2500}
  timeout ${INRUN_TIMEOUT:-240} $PY -m ddptop --headless --interval 3600 --nproc "$N" --cost "$n" --runs-dir "$RUNS/inrun" -- \
    $PY bench/gpt_train.py --n-layer 6 --n-head 6 --n-embd 384 --block 256 --batch-size 64 --vocab 65 --accum 2 \
    --steps $((n + 100)) --warmup 10 > "$OUT/inrun.txt" 2>&1
  echo "== inrun rc=$?"; grep -A4 "own cost" "$OUT/inrun.txt"; cp "$RUNS"/inrun/*/cost_ab_rank0.json "$OUT/" 2>/dev/null
}

untimed() {  # issue 42: what a step the hooks do not time costs the host under the default (one step in K timed):
  # the hooks alone and a launch-bound DDP loop, ABBA blocks inside one process (bench/investigations/untimed_step_cost.py)
  timeout ${UNTIMED_TIMEOUT:-150} taskset -c ${UNTIMED_CPU:-2} $PY bench/investigations/untimed_step_cost.py --device cuda \
    --layers ${UNTIMED_LAYERS:-20} --pairs ${UNTIMED_PAIRS:-20} --block ${UNTIMED_BLOCK:-200} 2>&1 | tee "$OUT/untimed.txt" | tail -6
}

stopk() {  # issue 42: Ctrl-C under the default (one step in K timed: K = 64 at ms steps) stops every rank at one
  # step, the agreed one allowing for the untimed steps since each rank's last record (STOPK_AFTER seconds in)
  for s in ${STOPK_SCRIPTS:-tests/scripts/plain_ddp.py tests/scripts/accum_ddp.py}; do
    $PY - "$s" "$N" "${STOPK_AFTER:-20}" "$RUNS/stopk" <<'PYEOF'
import json, signal, subprocess, sys, time
script, n, after, runs = sys.argv[1:]
p = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--json", "--nproc", n, "--runs-dir", runs, "--",
                      sys.executable, script, "--steps", "10000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
time.sleep(float(after))
p.send_signal(signal.SIGINT)
out, err = p.communicate(timeout=120)
d = json.loads(out.strip().splitlines()[-1])
print(f"== stopk {script}: rc={p.returncode} {d['status']} (rank, status, last timed step, steps run, K):",
      [(r["rank"], r["status"], r["last_step"], r["steps"], (r.get("info") or {}).get("phase_every")) for r in d["ranks"]])
PYEOF
  done
}

scaling() {  # issue 47: steps/s at N = 1, 2, 4 per preset, interleaved repeats, and the scaling efficiency
  # (bench/scaling.py); SCALING_P2P=1: the article's SHM box; SCALING_CMD: a script instead of the demo
  NCCL_P2P_DISABLE=${SCALING_P2P:-0} timeout ${SCALING_TIMEOUT:-560} $PY bench/scaling.py --nprocs ${SCALING_NPROCS:-1,2,$N} \
    --presets ${SCALING_PRESETS:-baseline,bf16-overlap} --steps ${STEPS} --warmup ${WARMUP} --repeat ${SCALING_REPEAT:-2} \
    --runs-dir "$RUNS/scaling" --json-out "$OUT/scaling_p2p${SCALING_P2P:-0}.json" ${SCALING_CMD:+-- $SCALING_CMD} \
    2>&1 | tee "$OUT/scaling_p2p${SCALING_P2P:-0}.txt" | tail -12
}

facts
for step in ${@:-topo presets}; do $step; done
[ -z "${SKIP_TAR:-}" ] && tar czf "$OUT/runs.tgz" --exclude='*.qdstrm' --exclude='*.nsys-rep' --exclude='*.trace.json' --exclude='*.trace.json.gz' -C /tmp ddptop-gpu-runs 2>/dev/null
echo "== done $(date -u +%T)"
