#!/usr/bin/env bash
# The held-out (test split) evidence runs with the local Qwen2.5-Coder-1.5B as root and sub model,
# loaded with a 2,048-token window for every method (`direct` gets the same window), one instance
# at a time on 2 cores. Rows resume: re-running this script finishes what an earlier session began.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=docs/bench/heldout-1.5b
COMMON=(--model local:qwen2.5-coder-1.5b --window 2048 --split test --parallel 1
  --max-iterations 8 --max-output-chars 2000 --max-answer-tokens 400 --temperature 0
  --max-seconds 900 --cell-timeout 600 --no-progress --out "$OUT")
# judged aggregation at 4x the window: the headline cell (n = 20)
.venv/bin/recursa bench run --task judge_agg --lengths 8k -n 20 --method rlm-plan,direct "${COMMON[@]}"
# the largest length direct can run in the same window, beside the planned mode
.venv/bin/recursa bench run --task judge_agg --lengths 1536 -n 10 --method rlm-plan,direct "${COMMON[@]}"
.venv/bin/recursa bench report "$OUT"
