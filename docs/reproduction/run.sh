#!/usr/bin/env bash
# Every run behind docs/reproduction/README.md, as sweeps (rerunning this script resumes: finished cells are skipped,
# an interrupted cell resumes from its checkpoint, and a cell whose config another sweep already ran is reused).
#   docs/reproduction/run.sh digits     # the embedded digits, full protocol, every method of Tables 3-6 (~25 min, 1 core)
#   docs/reproduction/run.sh emnist     # the real EMNIST sample in DATA, seed 42, 30 rounds (~85 min, 1 core)
#   docs/reproduction/run.sh cifar10    # the CIFAR-10 sample, seed 42, 30 rounds
#   docs/reproduction/run.sh async      # async-digits.md: configs/digits-async.yaml and digits-async-trace.yaml (54 runs)
#   docs/reproduction/run.sh clocked    # clocked-digits.md: configs/table3-clocked.yaml on the digits (9 runs)
#   docs/reproduction/run.sh packs      # packs.md's one-round sample table: every variant of the four packs, seed 42
#   docs/reproduction/run.sh ablation   # packs.md's masked-loss ablation: noniid2-e, 30 and 100 rounds, on and off
#   docs/reproduction/run.sh export     # the run folders -> the compact CSVs in docs/reproduction/results/ (per cell,
#                                       # per run of the async, clocked, packs and ablation runs)
#   docs/reproduction/run.sh report     # the tables, CSVs and figures committed under docs/reproduction/, from
#                                       # results/ alone (no run folder needed)
# The runs of 2026-11-27 ran each sweep with `nice -n 19` (NICE="nice -n 19" docs/reproduction/run.sh digits).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-runs/reproduction}
DATA=${DATA:-data}  # a torchvision root: the runs of 2026-11-27/28 used the CPU samples of docs/datasets.md
common=(--backend local --quiet)
NICE=${NICE:-}
case "${1:-digits}" in
  digits)
    for config in table3-allocation table4-coverage-ablation table6-full-model table5-confound \
                  table5-confound-common-core avg-p-paper-tier-mix figure6-frontier; do
      $NICE hasfl-ray sweep "configs/$config.yaml" --datasets digits "${common[@]}" --out "$RUNS/digits-$config"
    done ;;
  emnist|cifar10)  # HAS-FL, coverage off, Uniform and FedAvg on the real sample: seed 42, 30 rounds
    # every round tested and the widths every 5th, as the stored runs were (the configs' own cadence is the paper's:
    # every 5th round from the first, --test-every 5 --test-phase 1)
    sample=(--datasets "$1" --data-dir "$DATA" --seeds 42 --rounds 30 --test-every 1 --test-phase 5 "${common[@]}")
    $NICE hasfl-ray sweep configs/table4-coverage-ablation.yaml --algorithms hasfl,hasfl-coverage-off "${sample[@]}" \
      --out "$RUNS/$1-sample-table4"
    $NICE hasfl-ray sweep configs/table3-allocation.yaml --algorithms uniform "${sample[@]}" --out "$RUNS/$1-sample-table3"
    $NICE hasfl-ray sweep configs/table6-full-model.yaml --algorithms fedavg "${sample[@]}" --out "$RUNS/$1-sample-table6"
    # Table 5's HAS-FL run again with the common-core estimator
    $NICE hasfl-ray sweep configs/table5-confound-common-core.yaml "${sample[@]}" --out "$RUNS/$1-sample-table5-common-core" ;;
  async)
    $NICE hasfl-ray sweep configs/digits-async.yaml "${common[@]}" --out "$RUNS/digits-async"
    $NICE hasfl-ray sweep configs/digits-async-trace.yaml "${common[@]}" --out "$RUNS/digits-async-trace" ;;
  async-lognormal|async-trace)  # one of the two populations alone
    config=digits-async; [ "$1" = async-trace ] && config=digits-async-trace
    $NICE hasfl-ray sweep "configs/$config.yaml" "${common[@]}" --out "$RUNS/$config" ;;
  clocked)
    $NICE hasfl-ray sweep configs/table3-clocked.yaml --datasets digits "${common[@]}" --out "$RUNS/clocked-digits" ;;
  packs)  # one round, seed 42, all clients every round (8 for the FIARSE-style pack: two a width); one local epoch,
          # except the FIARSE-style pack, which trains local_steps (100 iterations) and refuses --local-epochs beside it.
          # PACKS="fiarse-protocol" runs some of the four (e.g. two sweeps side by side on two cores).
    for pack in ${PACKS:-heterofl-cifar10 fjord-cifar10 fedrolex-cifar10 fiarse-protocol}; do
      clients=10; epochs=(--local-epochs 1)
      [ "$pack" = fiarse-protocol ] && clients=8 && epochs=()
      $NICE hasfl-ray sweep "configs/pack-$pack.yaml" --data-dir "$DATA" --seeds 42 --rounds 1 --clients "$clients" \
        --clients-per-round "$clients" "${epochs[@]}" "${common[@]}" --out "$RUNS/packs/$pack"
    done ;;
  ablation)  # HeteroFL's masked cross-entropy, in direction: noniid2-e, seeds 42-44, on and off
    for rounds in 30 100; do
      every=10; [ "$rounds" = 100 ] && every=25
      for masked in on off; do
        $NICE hasfl-ray sweep configs/pack-heterofl-cifar10.yaml --data-dir "$DATA" --algorithms noniid2-e \
          --seeds 42,43,44 --rounds "$rounds" --clients 10 --clients-per-round 10 --local-epochs 1 \
          --eval-every "$every" --masked-loss "$masked" "${common[@]}" --out "$RUNS/ablation/$rounds-$masked"
      done
    done ;;
  export)
    python docs/reproduction/export_cells.py "$RUNS" docs/reproduction/results
    python docs/reproduction/export_runs.py "$RUNS" docs/reproduction/results ;;
  report)
    python docs/reproduction/make_report.py docs/reproduction ;;
  *) echo "usage: $0 digits|emnist|cifar10|async|async-lognormal|async-trace|clocked|packs|ablation|export|report" >&2; exit 2 ;;
esac
