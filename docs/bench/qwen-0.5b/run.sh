#!/usr/bin/env bash
# The real run in docs/bench/qwen-0.5b: local Qwen2.5-Coder 0.5B (Q4_K_M) as root and sub model.
# Re-running it resumes: finished rows (keyed task/length/seed/method/model) are skipped.
set -e
OUT=${OUT:-docs/bench/qwen-0.5b}
COMMON="--method rlm,direct,compaction,codeact-bm25 --concurrency 1 --model local:qwen2.5-coder-0.5b
  --n-ctx 16384 --max-iterations 5 --max-output-chars 2000 --max-answer-tokens 400 --temperature 0
  --max-seconds 300 --cell-timeout 30 --out $OUT"
recursa bench run --task sniah --lengths 2k,8k -n 2 $COMMON
recursa bench run --task oolong --lengths 2k -n 2 $COMMON
recursa bench run --task oolong --lengths 8k -n 1 $COMMON
recursa bench report $OUT
