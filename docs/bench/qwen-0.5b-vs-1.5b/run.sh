#!/usr/bin/env bash
# The 0.5B on the same harness and settings as docs/bench/qwen-1.5b (rlm on S-NIAH), to choose
# the default local model. Resumable like every bench run.
set -e
OUT=${OUT:-docs/bench/qwen-0.5b-vs-1.5b}
R=${RECURSA:-.venv/bin/recursa}
$R bench run --task sniah --lengths 8k,32k -n 5 --method rlm --concurrency 1 \
  --model local:qwen2.5-coder-0.5b --n-ctx 8192 --max-iterations 6 --max-output-chars 2000 \
  --max-answer-tokens 400 --temperature 0 --max-seconds 420 --cell-timeout 60 --no-progress \
  --out $OUT
$R bench report $OUT
