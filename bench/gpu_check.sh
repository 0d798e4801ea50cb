#!/usr/bin/env bash
# Everything a GPU check needs, in one call on the lent GPU machine (see docs/GPU.md).
#   bash bench/gpu_check.sh [presets|seed|topo] ...   (default: topo presets)
# Writes summaries and a tarball of the run directories to $OUT (or ./gpu-out).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
N=${N:-$(nvidia-smi -L | wc -l)}
STEPS=${STEPS:-30}; WARMUP=${WARMUP:-10}
PRESETS=${PRESETS:-single baseline static view bf16 fp16 powersgd overlap bf16-overlap amp}
RUNS=/tmp/ddptop-gpu-runs
PY=${PY:-python3}

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

commovh() {  # where the comm-timing overhead comes from (DDP builtin vs Python hook vs timed hooks)
  timeout ${COMMOVH_TIMEOUT:-240} torchrun --standalone --nproc_per_node="$N" bench/comm_overhead.py --steps ${COMMOVH_STEPS:-30} \
    --warmup 8 --rounds ${COMMOVH_ROUNDS:-2} 2>&1 | grep -vi warn | tee "$OUT/comm_overhead.txt" | tail -12
}

capovh() {  # steps/s outside a capture window vs the same run without one
  timeout ${CAPOVH_TIMEOUT:-300} $PY bench/capture_overhead.py --nproc "$N" --steps ${CAPOVH_STEPS:-70} --warmup 10 \
    --capture 35:3 --rounds ${CAPOVH_ROUNDS:-2} --runs-dir "$RUNS/capovh" 2>&1 | tee "$OUT/capture_overhead.txt"
}

nsysrun() {  # nsys mode with the binary the image has (not on PATH)
  timeout ${NSYS_TIMEOUT:-240} $PY -m ddptop --headless --json --interval 30 --nproc "$N" --preset baseline --steps 25 --warmup 5 \
    --capture 12:2 --profiler nsys --nsys-path "${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}" \
    --runs-dir "$RUNS/nsys" > /tmp/nsys.out 2>&1; echo "rc=$?"
  grep -E "^(run|capture)" /tmp/nsys.out; tail -1 /tmp/nsys.out | $PY -c "import json,sys; d=json.load(sys.stdin); print(json.dumps(d.get('nsys'))[:1500])"
  ls -la "$RUNS"/nsys/*/captures/ | head -20; tail -15 "$RUNS"/nsys/*/logs/*/attempt_0/0/stderr.log 2>/dev/null | tail -15
}

overhead() {  # ddptop's trainer under ddptop vs the plain reference recipe, same config, back to back
  S=${SEED:-.ref/seed_repro.py}
  for i in 1 2; do
    for cfg in "baseline|" "bf16-overlap|--static --view --hook bf16 --bucket 100" "overlap|--static --view --bucket 100"; do
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
  NCCL_P2P_DISABLE=${SCREEN_P2P:-1} timeout 240 $PY scripts/screenshots.py --out /tmp/screens --nproc "$N" ${SCREEN_ARGS:-} 2>&1 | tail -5
  ls /tmp/screens; tar czf "$OUT/screens.tgz" -C /tmp screens
}

facts
for step in ${@:-topo presets}; do $step; done
tar czf "$OUT/runs.tgz" --exclude='*.qdstrm' --exclude='*.nsys-rep' --exclude='*.trace.json' -C /tmp ddptop-gpu-runs 2>/dev/null
echo "== done $(date -u +%T)"
