#!/usr/bin/env bash
# The GPU numbers of train.py, reproducibly: a gated_deltanet student of SmolLM2-135M-Instruct
# through stages 1 -> 2 -> 3 on one GPU (tokens/s, MFU, peak memory, val perplexity against the
# teacher's), the teacher's own training step against the stage-3 step at length 2048, and,
# with GPUS=2, stage 3 again on two GPUs through torchrun (same batch per GPU: the scaling).
#
#   bash scripts/gpu_distill.sh [teacher]        # teacher: anything --teacher takes; 'default'
#   GPUS=2 STEPS=300 bash scripts/gpu_distill.sh
#   GPUS=2 EXTRA=--compile=true bash scripts/gpu_distill.sh random   # speed only, see below
#
# Teacher 'random': a SmolLM2-135M with random weights and a gated_deltanet student of it,
# written to $OUT; stages 1 and 2 are skipped and stage 3 runs once on one GPU. The numbers
# that depend on weights (perplexities) then mean nothing; the speeds are the real ones.
#
# Environment: STEPS optimizer steps per stage (default 150, 32k tokens each: 4.9M tokens a
# stage), STEPS_2K steps of the length-2048 runs (default 30), GPUS (default 1), OUT results
# folder (default out/gpu), PY python (default python3), EXTRA settings appended to every run
# (e.g. --compile=true; --profile=10, with 'random' only, since a profiled run writes no
# checkpoint for the next stage; or a smaller model or data for a dry run on a CPU).
# Every run's log goes to $OUT/<row>.log and its last step and eval lines to $OUT/results.md as
# soon as it finishes. Needs data/modern/*.bin (python data/modern/prepare.py), or --data_dir in EXTRA.
set -euo pipefail
cd "$(dirname "$0")/.."
TEACHER=${1:-default}
OUT=${OUT:-out/gpu}
STEPS=${STEPS:-150}
GPUS=${GPUS:-1}
PY=${PY:-python3}
EXTRA=${EXTRA:-}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
CK="$OUT/ckpt"  # the stage checkpoints, each stage starting from the previous one

row() {  # row <name> <launcher...> -- <train.py settings...>: run, keep the log, summarize
  local name=$1 t0=$SECONDS
  shift
  "$@" $EXTRA 2>&1 | tee "$OUT/$name.log"
  {
    echo "### $name ($((SECONDS - t0)) s): $*"
    echo '```'
    grep '^step' "$OUT/$name.log" | tail -n 1
    grep '^eval' "$OUT/$name.log" | tail -n 1
    echo '```'
  } >> "$OUT/results.md"
}

{ echo "## train.py on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo cpu), $(date -u +%Y-%m-%d)"
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>/dev/null || true
} >> "$OUT/results.md"

STAGES="1 2 3"
if [ "$TEACHER" = random ]; then
  mkdir -p "$CK/gated_deltanet"
  $PY - "$OUT/random_teacher.pt" "$CK/gated_deltanet/stage2.pt" <<'SETUP'
import sys

import torch

import checkpoint
import model

torch.manual_seed(0)
teacher = model.SmolLM2(model.Config.from_preset("smollm2-135m"))
checkpoint.save(sys.argv[1], teacher)
checkpoint.save(sys.argv[2], checkpoint.student_from_teacher(teacher, "gated_deltanet"))
SETUP
  TEACHER="$OUT/random_teacher.pt"
  STAGES=3
fi

# 1. the three stages at the study's length 512, 16 x 512 x 4 = 32k tokens per step
for stage in $STAGES; do
  row "stage$stage" $PY train.py --mixer=gated_deltanet --stage=$stage --teacher="$TEACHER" --out_dir="$CK" \
    --max_iters="$STEPS" --eval_interval="$STEPS" --eval_iters=10 --resume=false
done

# 2. one step at length 2048: the teacher training itself (lm, softmax attention) vs stage 3
L2K="--block_size=2048 --batch_size=8 --grad_accum=1 --max_iters=${STEPS_2K:-30} --eval_interval=${STEPS_2K:-30} --eval_iters=2 --resume=false"
row teacher_lm_2048 $PY train.py --mixer=attention --stage=lm --teacher="$TEACHER" --out_dir="$OUT/lm2048" $L2K
row stage3_2048 $PY train.py --mixer=gated_deltanet --stage=3 --teacher="$TEACHER" --out_dir="$OUT/s3_2048" \
  --init_from="$CK/gated_deltanet/stage2.pt" $L2K

# 3. stage 3 on all GPUs: the same batch per GPU, so tokens/s should nearly double with two
if [ "$GPUS" -gt 1 ]; then
  row "stage3_${GPUS}gpu" $PY -m torch.distributed.run --standalone --nproc_per_node="$GPUS" train.py \
    --mixer=gated_deltanet --stage=3 --teacher="$TEACHER" --out_dir="$OUT/ddp" \
    --init_from="$CK/gated_deltanet/stage2.pt" --max_iters="$STEPS" --eval_interval="$STEPS" --eval_iters=10 --resume=false
fi
cat "$OUT/results.md"
