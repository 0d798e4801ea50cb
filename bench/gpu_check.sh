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

facts
for step in ${@:-topo presets}; do $step; done
tar czf "$OUT/runs.tgz" -C /tmp ddptop-gpu-runs 2>/dev/null
echo "== done $(date -u +%T)"
