#!/usr/bin/env bash
# One call on a lent GPU machine (issue 39): the phases named on the command line, in order, each bounded, all
# inside BUDGET seconds (default 540), everything written under $OUT/lease.tar.gz plus a short summary printed last.
# Prepare on the CPU machine first (a torch build and Ray 2.60 for the GPU machine under .gpu-carry/), then `tar -cJf .gpu-carry/data.tar.xz -C
# .gpu-carry data` (the samples travel compressed); carry .gpu-carry/raysite.tar.xz, .gpu-carry/data.tar.xz,
# .gpu-carry/variants (kernel variants built with HASFL_NVCC_EXTRA, optional) and hasfl_ray/_C.cpython-312-*.so.
#
#   benchmarks/gpu_lease.sh kernel ncu check            # the first call: the kernel, its profile, gpu_check.sh
#   benchmarks/gpu_lease.sh variants mixed packs cells  # a second call
#
# Phases: kernel (profile_kernel.py: oracle check, device time per kernel, % of copy), ncu (Nsight Compute on one
# launch at 50 EMNIST clients), variants (profile_kernel.py with each .gpu-carry/variants/*.so in turn), check
# (benchmarks/gpu_check.sh), mixed (mixed-width batching against graphed one at a time, protocol rounds), packs
# (a round of the FjORD and HeteroFL packs, bench_protocol.py --pack), cells (bench_cells_per_gpu.py K = 1,2,4,8),
# table3 (bench_protocol.py's EMNIST projection with every Table 3 algorithm), league (one league cell, FIARSE,
# bench_protocol.py --pack configs/league-cifar10.yaml), auto (bench_training.py --compare mixed at 2, 3, 5, 10 and 50
# clients, CNN and LSTM: the figures behind `auto`), raytl (benchmarks/ray_timeline.py: Ray's timeline of a GPU run),
# handover (bench_handover.py --device cuda: torch.ops against the extension's direct entries, per call), sparse (the
# sparse CUDA kernels' card tests, then bench aggregate --layout index,mask with the serial and the tabled kernel).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s); BUDGET=${BUDGET:-540}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
W=/tmp/lease; rm -rf "$W"; mkdir -p "$W"
OUT=${OUT:-$W/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0
[ -f .gpu-carry/raysite.tar.xz ] && tar -xJf .gpu-carry/raysite.tar.xz -C /tmp
[ -f .gpu-carry/data.tar.xz ] && tar -xJf .gpu-carry/data.tar.xz -C .gpu-carry
export PYTHONPATH=/tmp/raysite:$PWD
PY=python3; DATA=.gpu-carry/data
SO=hasfl_ray/_C$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
{ nvidia-smi -L; git rev-parse --short HEAD 2>/dev/null; date -u; $PY -c "import torch, ray; print(torch.__version__, ray.__version__)"; } 2>&1 | tee "$W/machine.txt"

phase() {  # phase NAME LIMIT COMMAND...: bounded by LIMIT and by what is left of the budget
  local name=$1 limit=$2; shift 2
  local room=$(( $(left) - 15 )); [ "$room" -lt "$limit" ] && limit=$room
  if [ "$limit" -lt 20 ]; then echo "[lease] $name: skipped, $(left) s left" | tee -a "$W/phases.txt"; return; fi
  local s=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "[lease] $name: exit $rc in $(( $(date +%s) - s )) s (limit $limit)" | tee -a "$W/phases.txt"
}

for p in "$@"; do
  case $p in
    kernel) phase kernel 90 $PY benchmarks/profile_kernel.py --json "$W/kernel.json" ;;
    handover) phase handover 60 $PY benchmarks/bench_handover.py --device cuda --layouts slice,index,mask ;;
    sparse)  # the sparse CUDA kernels: tabled == serial bit for bit and the oracle, then each one's time
      phase sparse_tests 90 $PY -m pytest -q -p no:cacheprovider tests/aggregation/test_sparse_cuda.py \
            tests/aggregation/test_fused_cuda.py
      for k in serial tabled; do
        phase "sparse_$k" 60 env HASFL_SPARSE_CUDA_KERNEL=$k $PY -c "from hasfl_ray.cli.entry import main; main()" bench aggregate \
              --layout index,mask --models emnist --clients 50,200 --repeats 5 --skip-slow --device cuda
      done ;;
    ncu) phase ncu 90 ncu --clock-control none -k regex:aggregate_chunks --launch-skip 3 --launch-count 1 \
           --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
           --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
           $PY benchmarks/profile_kernel.py --cases emnist:50 --repeats 2 --no-profiler ;;
    variants)
      cp "$SO" "$W/base.so"
      for v in .gpu-carry/variants/*.so; do
        [ -f "$v" ] || continue
        name=$(basename "$v" .so); cp "$v" "$SO"
        phase "variant_$name" 40 $PY benchmarks/profile_kernel.py --repeats 10 --check-max-clients 64 \
          --json "$W/variant_$name.json"
        phase "variant_${name}_tests" 40 $PY -m pytest -q -p no:cacheprovider tests/aggregation/test_fused_cuda.py
      done
      cp "$W/base.so" "$SO" ;;
    check) phase check 420 benchmarks/gpu_check.sh "$DATA" "$W/gc" ;;
    tests) phase tests 60 $PY -m pytest -q -p no:cacheprovider -n 4 tests/training/test_mixed.py \
             tests/training/test_batched.py tests/training/test_graphed.py ;;
    mixed)
      phase mixed_bench_cnn 45 $PY benchmarks/bench_training.py --device cuda --model emnist --compare mixed \
        --samples 128 --repeats 2
      phase mixed_bench_lstm 45 $PY benchmarks/bench_training.py --device cuda --model lstm --compare mixed \
        --samples 40 --batch-size 10 --repeats 2
      for mode in off mixed; do
        phase "mixed_emnist_$mode" 40 $PY cli simulate --backend local --dataset emnist --data-dir "$DATA/torchvision" \
          --device cuda --rounds 3 --client-batching $mode --quiet --force --out "$W/runs/emnist-$mode"
      done
      [ "${SHAKESPEARE_MIXED:-0}" = 1 ] && phase mixed_shakespeare 90 $PY cli simulate --backend local \
        --dataset shakespeare --data-dir "$DATA/shakespeare" --device cuda --rounds 1 --client-batching mixed \
        --quiet --force --out "$W/runs/shakespeare-mixed" ;;
    packs)
      phase pack_fjord 100 $PY benchmarks/bench_protocol.py --pack configs/pack-fjord-cifar10.yaml \
        --variants fjord-kd --device cuda --rounds 4 --json
      phase pack_heterofl 100 $PY benchmarks/bench_protocol.py --pack configs/pack-heterofl-cifar10.yaml \
        --variants iid-a --device cuda --rounds 4 --json ;;
    cells) phase cells 90 $PY benchmarks/bench_cells_per_gpu.py --k 1,2,4,8 --out "$W/cells" --json "$W/cells.json" -- \
             --dataset emnist --data-dir "$DATA/torchvision" --rounds 4 --device cuda ;;
    raytl) phase raytl 100 $PY benchmarks/ray_timeline.py --dataset emnist --data-dir "$DATA/torchvision" --device cuda \
             --rounds 4 --actors 2 --gpus-per-actor 0.45 --json ;;
    league) phase league 150 $PY benchmarks/bench_protocol.py --pack configs/league-cifar10.yaml \
              --variants fiarse-dir0.3-l4-10.20.30.40 --device cuda --rounds 2 --json ;;
    auto)  # item 4 of issue 48: eager, per-width batched, mixed-width batched and graphed one at a time, 2-50 clients
      for n in 2 3 5 10 50; do
        case $n in 2) tiers=1,1; widths=0.5,1.0 ;; 3) tiers=1,1,1; widths=0.25,0.5,1.0 ;;
          5) tiers=2,1,1,1; widths=0.25,0.5,0.75,1.0 ;; 10) tiers=4,3,2,1; widths=0.25,0.5,0.75,1.0 ;;
          50) tiers=20,13,10,7; widths=0.25,0.5,0.75,1.0 ;; esac
        phase "auto_cnn_$n" 40 $PY benchmarks/bench_training.py --device cuda --model emnist --compare mixed \
          --tiers $tiers --widths $widths --samples 128 --repeats 2
        phase "auto_lstm_$n" 40 $PY benchmarks/bench_training.py --device cuda --model lstm --compare mixed \
          --tiers $tiers --widths $widths --samples 40 --batch-size 10 --repeats 2
      done ;;
    table3) phase table3 200 $PY benchmarks/bench_protocol.py --device cuda --datasets emnist --rounds 2 --json ;;
    *) echo "[lease] unknown phase $p" | tee -a "$W/phases.txt" ;;
  esac
done

# Run directories' metrics, the logs and the summaries travel back in one archive (no checkpoints: they are large).
find "$W" -name "*.pt" -size +1M -delete 2>/dev/null
tar -czf "$OUT/lease.tar.gz" -C "$W" --exclude=out . 2>/dev/null
echo "==== summary ($(( $(date +%s) - T0 )) s)"
cat "$W/phases.txt"
for f in "$W"/kernel.log "$W"/ncu.log "$W"/variant_*.log; do [ -f "$f" ] && { echo "--- $(basename "$f")"; grep -v "^==PROF==" "$f" | grep -E "x[0-9]+:|copy|aggregate_chunks|passed|failed|Throughput|Duration|Registers|Eligible|Spilling" | cut -c1-230 | head -40; }; done
for f in "$W"/mixed_*.log "$W"/auto_*.log "$W"/cells.log "$W"/pack_*.log "$W"/league.log "$W"/table3.log "$W"/raytl.log "$W"/tests.log; do [ -f "$f" ] && { echo "--- $(basename "$f")"; tail -n 6 "$f" | cut -c1-300; }; done
[ -f "$W/gc/summary.md" ] && { echo "--- gpu_check"; cat "$W/gc/summary.md" | head -60; }
exit 0
