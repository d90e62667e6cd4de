#!/usr/bin/env bash
# Every run behind docs/reproduction/README.md, as sweeps (rerunning this script resumes: finished cells are skipped,
# an interrupted cell resumes from its checkpoint, and a cell whose config another sweep already ran is reused).
#   docs/reproduction/run.sh digits     # the embedded digits, full protocol, every method of Tables 3-6 (~25 min, 1 core)
#   docs/reproduction/run.sh emnist     # the real EMNIST sample in ../shared/data, seed 42, 30 rounds (~85 min, 1 core)
#   docs/reproduction/run.sh cifar10    # the CIFAR-10 sample, seed 42, 30 rounds
#   docs/reproduction/run.sh export     # the run folders -> the compact CSVs in docs/reproduction/results/ (per cell)
#   docs/reproduction/run.sh report     # the tables, CSVs and figures committed under docs/reproduction/, from
#                                       # results/ alone (no run folder needed)
# The runs of 2026-11-27 ran each sweep with `nice -n 19` (NICE="nice -n 19" docs/reproduction/run.sh digits).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-runs/reproduction}
DATA=${DATA:-../shared/data/torchvision}
common=(--backend local --quiet)
NICE=${NICE:-}
case "${1:-digits}" in
  digits)
    for config in table3-allocation table4-coverage-ablation table6-full-model table5-confound \
                  table5-confound-common-core avg-p-paper-tier-mix figure6-frontier; do
      $NICE hasfl-ray sweep "configs/$config.yaml" --datasets digits "${common[@]}" --out "$RUNS/digits-$config"
    done ;;
  emnist|cifar10)  # HAS-FL, coverage off, Uniform and FedAvg on the real sample: seed 42, 30 rounds
    sample=(--datasets "$1" --data-dir "$DATA" --seeds 42 --rounds 30 "${common[@]}")
    $NICE hasfl-ray sweep configs/table4-coverage-ablation.yaml --algorithms hasfl,hasfl-coverage-off "${sample[@]}" \
      --out "$RUNS/$1-sample-table4"
    $NICE hasfl-ray sweep configs/table3-allocation.yaml --algorithms uniform "${sample[@]}" --out "$RUNS/$1-sample-table3"
    $NICE hasfl-ray sweep configs/table6-full-model.yaml --algorithms fedavg "${sample[@]}" --out "$RUNS/$1-sample-table6"
    # Table 5's HAS-FL run again with the common-core estimator
    $NICE hasfl-ray sweep configs/table5-confound-common-core.yaml "${sample[@]}" --out "$RUNS/$1-sample-table5-common-core" ;;
  export)
    python docs/reproduction/export_cells.py "$RUNS" docs/reproduction/results ;;
  report)
    python docs/reproduction/make_report.py docs/reproduction ;;
  *) echo "usage: $0 digits|emnist|cifar10|export|report" >&2; exit 2 ;;
esac
