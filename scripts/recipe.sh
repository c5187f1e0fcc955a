#!/usr/bin/env bash
# The measured recipe choice: which corpus, and whether stage 3 keeps the study's CE term.
# A gated_deltanet student of the offline SmolLM2-135M-Instruct teacher goes through stages
# 1 -> 2 -> 3 at micro-batch 64 x 512 tokens (150 / 150 / 400 steps by default: 4.9M + 4.9M +
# 13.1M tokens), on each corpus; from the same stage-2 checkpoint, stage 3 runs with
# ce_weight=1 (CE + KL, the study's) and ce_weight=0 (KL alone). Every stage-3 student is then
# measured: val perplexity and KL to the teacher on data/modern/val.bin, the study's task
# table (evaluate.py) and needle in a haystack (niah.py). The table lands in $OUT/recipe.md, the
# figure in $OUT/recipe.png.
#
#   bash scripts/recipe.sh                        # one GPU: both corpora, both losses
#   CORPORA=modern CES="1 0" bash scripts/recipe.sh
#   STEPS="4 4 4" BATCH=2 MC_LIMIT=5 NIAH="--lengths=256 --samples=1 --depths=50" EXTRA="--eval_iters=1" \
#     OUT=/tmp/recipe bash scripts/recipe.sh       # a dry run on a CPU (minutes)
#
# Environment: CORPORA (default "modern offline", folders under data/), CES (stage-3 CE weights,
# default "1 0"; the offline corpus runs only the first), STEPS (three step counts), BATCH
# (micro-batch, default 64), MC_LIMIT (questions per task, default 1000; 0 = all), NIAH (niah.py
# settings, default lengths 512,1024,2048 with 10 prompts a depth, 50 a length), OUT (default
# out/recipe), CK (checkpoints, default $OUT/ckpt; on a machine whose $OUT is copied back,
# somewhere else), PY (default .venv/bin/python when it exists, else python3), EXTRA (appended
# to every train.py run). Needs the corpora (data/<corpus>/prepare.py) and the task files
# (data/mc_offline/prepare.py).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/recipe}
CK=${CK:-$OUT/ckpt}
CORPORA=${CORPORA:-modern offline}
CES=${CES:-1 0}
read -r S1 S2 S3 <<< "${STEPS:-150 150 400}"
BATCH=${BATCH:-64}
MC_LIMIT=${MC_LIMIT:-1000}
NIAH=${NIAH:---lengths=512,1024,2048 --samples=10}
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}  # install.sh's venv when there is one
EXTRA=${EXTRA:-}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
for corpus in $CORPORA; do
  [ -f "data/$corpus/train.bin" ] || { echo "recipe.sh: data/$corpus/train.bin not found; build it with: python data/$corpus/prepare.py"; exit 1; }
done
[ -f data/mc_offline/arc_easy.jsonl ] || { echo "recipe.sh: task files not found; build them with: python data/mc_offline/prepare.py"; exit 1; }

train() {  # train <log name> <train.py settings...>
  local name=$1
  shift
  # eager: a run of a few minutes loses more to compiling (about 95 s) than it gains
  if ! $PY train.py --mixer=gated_deltanet --batch_size="$BATCH" --grad_accum=1 --block_size=512 --compile=false \
    --eval_iters=20 --resume=false "$@" $EXTRA > "$OUT/$name.log" 2>&1; then
    tail -n 3 "$OUT/$name.log"
    echo "recipe.sh: $name failed; its log: $OUT/$name.log"
    exit 1
  fi
  grep -E '^(stage|eval|warning)' "$OUT/$name.log"
}

for corpus in $CORPORA; do
  train "${corpus}_stage1" --stage=1 --data_dir="data/$corpus" --out_dir="$CK/$corpus" --max_iters="$S1" --eval_interval="$S1"
  train "${corpus}_stage2" --stage=2 --data_dir="data/$corpus" --out_dir="$CK/$corpus" --max_iters="$S2" --eval_interval="$S2"
  ces=$CES
  [ "$corpus" = modern ] || ces=${CES%% *}
  for ce in $ces; do
    run="${corpus}_ce$ce"
    train "${run}_stage3" --stage=3 --data_dir="data/$corpus" --out_dir="$CK/$run" --ce_weight="$ce" \
      --init_from="$CK/$corpus/gated_deltanet/stage2.pt" --max_iters="$S3" --eval_interval="$S3"
    student="$CK/$run/gated_deltanet/stage3.pt"
    $PY evaluate.py --init_from="$student" --data=data/modern/val.bin --mc_limit="$MC_LIMIT" \
      --out="$OUT/$run.eval.json" 2>&1 | tee "$OUT/$run.eval.log" | tail -n 8
    $PY niah.py --init_from="$student" $NIAH --out_dir="$OUT/$run.niah" 2>&1 | tail -n 4
  done
done

# the comparison, one row per student
$PY - "$OUT" <<'TABLE' | tee "$OUT/recipe.md"
import glob, json, os, sys

out, rows = sys.argv[1], []
for path in sorted(glob.glob(os.path.join(out, "*.eval.json"))):
    run = os.path.basename(path)[:-len(".eval.json")]
    ev = json.load(open(path))
    by = {}
    for r in json.load(open(os.path.join(out, run + ".niah", "results.json")))["records"]:
        by.setdefault((r["task"], r["length"]), []).append(r["correct"])
    rows.append((run, ev, {k: 100 * sum(v) / len(v) for k, v in sorted(by.items())}))
if rows:
    s0 = rows[0][1]["summary"]
    cols = s0["avg_of"] + ["avg"]
    print("| run | val ppl | KL | " + " | ".join(cols) + " | Avg recovery | "
          + " | ".join(f"{t} {n}" for t, n in rows[0][2]) + " |")
    print("|---" * (4 + len(cols) + len(rows[0][2])) + "|")
    for run, ev, niah in rows:
        s = ev["summary"]
        teacher, student = list(s["rows"].values())
        print(f"| {run} | {ev['model']['lm']['ppl']:.2f} | {ev['model']['lm']['kl']:.3f} | "
              + " | ".join(f"{100 * student[c][0]:.1f}" for c in cols)
              + f" | {100 * s['recovery']['avg'][0]:.1f}% | " + " | ".join(f"{a:.0f}" for a in niah.values()) + " |")
    print(f"| teacher | {rows[0][1]['teacher']['lm']['ppl']:.2f} | 0 | "
          + " | ".join(f"{100 * teacher[c][0]:.1f}" for c in cols) + " | 100% | |")
TABLE
$PY -c 'import plots, sys; plots.recipe(sys.argv[1], sys.argv[1] + "/recipe.png")' "$OUT"
echo "wrote $OUT/recipe.md and $OUT/recipe.png"
