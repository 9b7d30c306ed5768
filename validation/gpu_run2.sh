#!/usr/bin/env bash
# The second GPU run (issue 36): one prepared device call, most informative first.
#
#   bash validation/gpu_run2.sh             # on a lent GPU: one `run` call with timeout_s 560
#   bash validation/gpu_run2.sh --dry-run   # every code path on this CPU, tiny sizes (CI runs it)
#
# Device seconds per item, in the order they run: the model's own estimates (`python
# validation/run.py <the item's options> --plan --gpu h200-sxm`, 2026-12-02: trace, weights
# initialised at 2e9 parameters/s, every timed and profiled step at its predicted time, 6 s of
# fixed cost per configuration) and, for the two microbenchmark scripts, the issue's sizing:
#
#   1. fresh configurations (22, validation/fresh/frozen-2026-12-02.json)        ~160 s
#   2. kernel microbenchmarks (validation/kernel_bench.py)                        ~90 s
#   3. paired CNN runs (24: resnet50 train and inference, efficientnet_b0,
#      mobilenet_v2, vgg16, convnext_tiny training x {bf16, fp16} x
#      cudnn.benchmark off/on; 10 steps)                                         ~155 s
#   4. host microbenchmarks (nnperf.measure.calibration.host_parts)               ~60 s
#   5. host-bound runs again, 50 steps and 50 back to back (7: bert-base train
#      and inference, bert-large inference, mlp and mnist-cnn both ways)          ~45 s
#   6. llama-7b inference and mixtral training profiled again (2)                 ~30 s
#      total                                                                     ~540 s (9 min)
#
# The first run's configurations ran 310 s where these estimates said 363 s (52 runs; the long
# steps over, the short ones under). BUDGET_S (default 530) bounds the whole script: each item
# gets what is left, at most 1.5x its estimate, and what does not fit is logged as left over
# with the seconds it would need. Every configuration runs with its profiled steps, the
# back-to-back wall clock and no RuntimeEstimator (the first run has it for the zoo).
#
# Everything lands under $OUT as it finishes (at most 8 files come back: these are 6), stamped
# so a later run's files sit beside the committed ones instead of replacing them:
#   log-run2-<UTC>.txt, environment-run2-<UTC>.json, records-fresh-<UTC>.jsonl (item 1),
#   kernel-bench-<UTC>.json (2), records-run2-<UTC>.jsonl (3, 5, 6), host-parts-<UTC>.json (4)
# After the call: copy them into validation/data/<gpu>/ and commit; a second call (when time is
# left) skips what those files already hold (REDO=1 runs everything again). Then:
#   python validation/fresh_compare.py validation/fresh/frozen-2026-12-02.json validation/data/<gpu> --markdown
#   python validation/compare.py validation/data/<gpu> --write-baseline validation/data/<gpu>/baseline.json
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
export OUT="${OUT:-/tmp/nnperf-gpu-run2}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=6
py="${PYTHON:-python3}"
fresh_file=validation/fresh/frozen-2026-12-02.json
stamp=$(date -u +%Y%m%dT%H%M%S)
log="$OUT/log-run2-$stamp.txt"

if [ "$dry" = 1 ]; then
    # tiny models, one step, one profiled step, and one configuration of each kind per item;
    # a budget no item reaches (the dry run is for the code paths)
    device=cpu; budget=${BUDGET_S:-900}; tiny=(--tiny)
    steps=(--steps 1 --warmup 1 --profile-repeats 1); host_steps=(--steps 3 --warmup 1 --profile-repeats 1)
    pair_steps=("${steps[@]}")
    only_fresh=(--only 'hf:Qwen/Qwen2.5-0.5B-infer*' --only 'bert-base-infer*' --only 'gpt2-train-fp16*')
    only_pairs=(--only 'resnet50-infer-bf16-*'); only_host=(--only 'mlp-train-*'); only_again=(--only 'llama-7b-*')
else
    device=cuda; budget=${BUDGET_S:-530}; tiny=()
    steps=(); host_steps=(--steps 50 --warmup 5); pair_steps=(--steps 10 --warmup 3)
    only_fresh=(); only_pairs=(); only_host=(); only_again=()
fi
common=(--device "$device" "${tiny[@]}" --back-to-back --no-runtime-estimator)
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
# seconds item N may take: what is left, at most 1.5x its estimate
allot() { local cap=$(($1 * 3 / 2)) rest; rest=$(left); echo $((rest < cap ? rest : cap)); }
enough() {  # enough ITEM ESTIMATE: whether to start it, else log what it would have needed
    if [ "$(left)" -lt 20 ]; then
        echo "== item $1 left over: $(left) s of the budget remain, it needs ~$2 s (next call)"; return 1
    fi
}

if [ "$dry" = 1 ]; then
    gpu_dir=validation/data/cpu-dry-run
else
    gpu_dir="validation/data/$("$py" -c "import torch; from nnperf.hardware import load_gpu; print(load_gpu(torch.cuda.get_device_name()).id)")"
fi
skip_fresh=(); skip_run2=()
if [ -z "${REDO:-}" ]; then
    for f in "$gpu_dir"/records-fresh-*.jsonl; do [ -e "$f" ] && skip_fresh+=(--skip-done "$f"); done
    for f in "$gpu_dir"/records-run2-*.jsonl; do [ -e "$f" ] && skip_run2+=(--skip-done "$f"); done
fi
done_before() { [ -z "${REDO:-}" ] && compgen -G "$gpu_dir/$1" >/dev/null; }

{
    echo "gpu_run2 $stamp: device $device, budget $budget s, out $OUT, committed data $gpu_dir"
    "$py" - "$device" >"$OUT/environment-run2-$stamp.json" <<'PY'
import json, sys, torch
from nnperf.measure.runner import environment
print(json.dumps(environment(torch.device(sys.argv[1])), indent=1))
PY
    cat "$OUT/environment-run2-$stamp.json"
    [ "$device" = cuda ] && nvidia-smi

    echo "== item 1: fresh configurations ($fresh_file), est. ~160 s, $(left) s left"
    enough 1 160 && "$py" validation/run.py --fresh "$fresh_file" "${common[@]}" "${steps[@]}" "${only_fresh[@]}" \
        --budget-s "$(allot 160)" --out "$OUT/records-fresh-$stamp.jsonl" "${skip_fresh[@]}"

    echo "== item 2: kernel microbenchmarks, est. ~90 s, $(left) s left"
    if [ ! -f validation/kernel_bench.py ]; then
        echo "item 2 skipped: validation/kernel_bench.py is not in this checkout (it needs ~90 s on the device)"
    elif done_before 'kernel-bench-*.json'; then
        echo "item 2 skipped: $gpu_dir already holds kernel-bench-*.json (REDO=1 runs it again)"
    elif enough 2 90; then
        timeout "$(allot 90)" "$py" validation/kernel_bench.py --device "$device" --out "$OUT/kernel-bench-$stamp.json" \
            || echo "item 2 ended with status $? (124: stopped at its $(allot 90) s)"
    fi

    echo "== item 3: paired CNN runs, cudnn.benchmark off and on, est. ~155 s, $(left) s left"
    enough 3 155 && "$py" validation/run.py --configs cnn-pairs "${common[@]}" "${pair_steps[@]}" "${only_pairs[@]}" \
        --budget-s "$(allot 155)" --out "$OUT/records-run2-$stamp.jsonl" "${skip_run2[@]}"

    echo "== item 4: host microbenchmarks of an eager step's parts, est. ~60 s, $(left) s left"
    if ! "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("nnperf.measure.calibration.host_parts") is None)'; then
        echo "item 4 skipped: nnperf.measure.calibration.host_parts is not in this checkout (it needs ~60 s on the device)"
    elif done_before 'host-parts-*.json'; then
        echo "item 4 skipped: $gpu_dir already holds host-parts-*.json (REDO=1 runs it again)"
    elif enough 4 60; then
        timeout "$(allot 60)" "$py" -m nnperf.measure.calibration.host_parts --device "$device" --out "$OUT/host-parts-$stamp.json" \
            || echo "item 4 ended with status $? (124: stopped at its $(allot 60) s)"
    fi

    echo "== item 5: host-bound runs, 50 steps, est. ~45 s, $(left) s left"
    enough 5 45 && "$py" validation/run.py --configs host-bound "${common[@]}" "${host_steps[@]}" "${only_host[@]}" \
        --budget-s "$(allot 45)" --out "$OUT/records-run2-$stamp.jsonl" "${skip_run2[@]}"

    echo "== item 6: llama-7b inference and mixtral training profiled again, est. ~30 s, $(left) s left"
    enough 6 30 && "$py" validation/run.py --configs reprofile "${common[@]}" "${steps[@]}" "${only_again[@]}" \
        --budget-s "$(allot 30)" --out "$OUT/records-run2-$stamp.jsonl" "${skip_run2[@]}"

    if [ "$dry" = 1 ] && [ -s "$OUT/records-fresh-$stamp.jsonl" ]; then
        # on the device this would spend its seconds tracing again: run it on the copied files
        echo "== the fresh configurations against the frozen predictions and today's model"
        "$py" validation/fresh_compare.py "$fresh_file" "$OUT/records-fresh-$stamp.jsonl"
    fi
    [ "$device" = cuda ] && nvidia-smi -q -d CLOCK,PERFORMANCE
    echo "== files under $OUT (at most 8 come back):"
    ls -l "$OUT"
    echo "gpu_run2 took $(($(date +%s) - start)) s"
} 2>&1 | tee "$log"
