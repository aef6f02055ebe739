#!/usr/bin/env bash
# The real run in docs/bench/qwen-1.5b: local Qwen2.5-Coder-1.5B (Q4_K_M) as root and sub model,
# on 2 cores. Re-running it resumes: finished rows (task/length/seed/method/model) are skipped,
# so the run may span sessions. Order: what matters most first.
set -e
OUT=${OUT:-docs/bench/qwen-1.5b}
R=${RECURSA:-.venv/bin/recursa}
COMMON="--concurrency 1 --model local:qwen2.5-coder-1.5b --n-ctx 16384 --max-iterations 6
  --max-output-chars 2000 --max-answer-tokens 400 --temperature 0 --max-seconds 420
  --cell-timeout 60 --no-progress --out $OUT"
$R bench run --task sniah --lengths 8k,32k,128k -n 5 --method rlm,direct $COMMON
$R bench run --task oolong --lengths 8k,16k -n 5 --method rlm,direct $COMMON
$R bench run --task sniah --lengths 8k,32k,128k -n 5 --method codeact-bm25 $COMMON
$R bench run --task oolong --lengths 8k,16k -n 5 --method codeact-bm25 $COMMON
$R bench report $OUT
