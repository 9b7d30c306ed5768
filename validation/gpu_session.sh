#!/usr/bin/env bash
# The GPU validation plan: what a session lent a GPU runs, one device call per part.
#
#   bash validation/gpu_session.sh 1            # ~9 min: environment, calibration, transfer
#                                               # bench, op lists, CUDA graphs, then validation
#                                               # runs until the budget (BUDGET_S, default 500)
#   bash validation/gpu_session.sh 2            # ~9 min each: more validation runs, skipping
#   bash validation/gpu_session.sh 3            # those committed in validation/data/<gpu>/
#   bash validation/gpu_session.sh --dry-run 1  # the same code paths on this CPU, tiny models
#
# Everything is written under $OUT (the only folder whose files come back from the device
# machine): environment.json, profile.toml + its raw JSON, transfer.json, cuda-ops.json, cuda-graphs.json, advise-measured.json, records-<part>-<UTC time>.jsonl
# and log-<part>-<UTC time>.txt (stamped: a later session's files sit beside the committed ones
# instead of replacing them). After each call, copy them into validation/data/<gpu>/ and commit them;
# `python validation/compare.py validation/data/<gpu> --write-baseline validation/data/<gpu>/baseline.json`
# then fixes the error tables CI holds the model to.
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
part="${1:?usage: gpu_session.sh [--dry-run] PART (1, 2, 3)}"
export OUT="${OUT:-/tmp/nnperf-gpu-session}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=6
nnperf() { python3 -c 'import sys; from nnperf.cli import main; sys.argv[0] = "nnperf"; main()' "$@"; }

if [ "$dry" = 1 ]; then
    device=cpu; tiny=(--tiny); quick=(--quick); budget=${BUDGET_S:-150}; steps=(--steps 2 --warmup 1)
else
    device=cuda; tiny=(); quick=(); budget=${BUDGET_S:-500}; steps=()
fi
stamp=$(date -u +%Y%m%dT%H%M)
log="$OUT/log-$part-$stamp.txt"
start=$(date +%s)
{
    python3 - "$device" >"$OUT/environment.json" <<'PY'
import json, sys, torch
from nnperf.measure.runner import environment
print(json.dumps(environment(torch.device(sys.argv[1])), indent=1))
PY
    cat "$OUT/environment.json"
    [ "$device" = cuda ] && nvidia-smi
    if [ "$part" = 1 ]; then
        # (a) microbenchmarks first: they make the calibrated profile the model runs are predicted with
        nnperf calibrate --device "$device" "${quick[@]}" -o "$OUT/profile.toml"
        nnperf bench transfer --device "$device" --json >"$OUT/transfer.json"
        # the ops the device runs beside the trace's substitutions (tests/measure/test_op_lists.py)
        python3 validation/cuda_ops.py --device "$device" --out "$OUT/cuda-ops.json"
        # host-bound decoding eager and as a CUDA graph (the advice item cuda-graphs' test set)
        [ "$device" = cuda ] && python3 validation/cuda_graphs.py --out "$OUT/cuda-graphs.json"
        # advice items before and after on gpt2 and resnet50, beside their predicted gains
        python3 validation/advise_measure.py --device "$device" "${tiny[@]}" "${steps[@]}" --out "$OUT/advise-measured.json"
        budget=$((budget - ($(date +%s) - start)))
    fi
    # (b) the zoo, most informative configurations first, one JSON line each as it finishes
    gpu_dir="validation/data/$(python3 -c "import sys, torch; from nnperf.hardware import load_gpu; print(load_gpu(torch.cuda.get_device_name()).id if sys.argv[1] == 'cuda' else 'cpu-dry-run')" "$device")"
    skip=()
    for f in "$gpu_dir"/records-*.jsonl; do [ -e "$f" ] && skip+=(--skip-done "$f"); done
    python3 validation/run.py --device "$device" "${tiny[@]}" "${steps[@]}" --budget-s "$budget" \
        --out "$OUT/records-$part-$stamp.jsonl" "${skip[@]}"
    echo "part $part took $(($(date +%s) - start)) s"
} 2>&1 | tee "$log"
