#!/bin/bash
# Reward-model kinds compared on the same held-out questions: the reward_model stage of this checkout
# re-run in a scratch copy of a finished default run, once per kind (reward_model.objective x epochs, as an overlay
# on the run's params.yaml), each RM kept with its training's wall time, load and stage metrics (train_run.json), then
# benchmarks/rm_auc.py on them all (every kind samples and splits alike: the same held-out questions).
#
#   benchmarks/rm_kinds.sh RUN_DIR SCRATCH [OUT]     # RUN_DIR is only read; OUT: benchmarks/results/rm_kinds.json
#   KINDS="pointwise:1 pairwise:1" benchmarks/rm_kinds.sh ...   # objective:epochs, the default below
set -euo pipefail
code=$(cd "$(dirname "$0")/.." && pwd)
run=$1 scratch=$2 out=${3:-$code/benchmarks/results/rm_kinds.json}
py=${PYTHON:-python}
kinds=${KINDS:-"pointwise:1 pairwise:1 both:1 pointwise:3 pairwise:3 both:3"}
mkdir -p "$scratch" && rm -rf "$scratch/run" && cp -a "$run" "$scratch/run" && cd "$scratch/run"
args=()
for k in $kinds; do
  obj=${k%:*} ep=${k#*:} name=${k%:*}_${k#*:}ep
  sed "s/^reward_model:\$/reward_model:\n  objective: $obj\n  epochs: $ep/" params.yaml > "params_$name.yaml"
  l0=$(cut -d' ' -f1-3 /proc/loadavg) s=$(date +%s.%N)
  echo "$name: start $(date -u +%T) load $l0"
  PYTHONPATH=$code nice -n 10 "$py" -m stages.reward_model --params "params_$name.yaml" > "$scratch/$name.log" 2>&1
  e=$(date +%s.%N) l1=$(cut -d' ' -f1-3 /proc/loadavg)
  rm -rf "${scratch:?}/$name" && mv data/models/reward_model "$scratch/$name"
  "$py" - "$scratch/$name/train_run.json" "$(echo "$e - $s" | bc)" "$l0" "$l1" <<'EOF'
import json, sys
d = json.load(open("data/details/reward_model.json"))
t = json.load(open("data/timings/reward_model.json"))
keep = ("loss_per_epoch", "n_train_examples", "n_heldout_examples", "heldout")
json.dump({"stage_wall_s": round(float(sys.argv[2]), 1), "load_before": sys.argv[3], "load_after": sys.argv[4],
           "timings": {k: t.get(k) for k in ("sampling_s", "training_s", "wall_s", "loadavg")},
           "stage_metrics": {k: d.get(k) for k in keep}}, open(sys.argv[1], "w"), indent=1)
EOF
  echo "$name: done $(date -u +%T) load $l1"
  args+=(--rm "$name=$scratch/$name")
done
first=${kinds%% *}
cd "$code" && PYTHONPATH=$code nice -n 10 "$py" -m benchmarks.rm_auc "${args[@]}" --out "$out" \
  --heldout "$scratch/${first%:*}_${first#*:}ep/heldout.jsonl"
