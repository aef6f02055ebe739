#!/usr/bin/env bash
# The held-out (test split) evidence runs with the local Qwen2.5-Coder-1.5B as root and sub model,
# loaded with a 2,048-token window for every method (`direct` gets the same window), one instance
# at a time on 2 cores. Rows resume: re-running this script finishes what an earlier session began.
# A cell whose rows failed (an input over direct's window is a recorded failure) does not stop
# the script: `bench run` exits 1 then, and the next cell runs.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=docs/bench/heldout-1.5b
COMMON=(--model local:qwen2.5-coder-1.5b --window 2048 --split test --parallel 1
  --max-iterations 8 --max-output-chars 2000 --max-answer-tokens 400 --temperature 0
  --max-seconds 900 --cell-timeout 600 --no-progress)
cell() { .venv/bin/recursa bench run "$@" "${COMMON[@]}" || echo "run.sh: rows failed in: $*"; }

# Round 1 (rows in heldout-1.5b/)
# judged aggregation at 4x the window: the headline cell (n = 20)
cell --task judge_agg --lengths 8k -n 20 --method rlm-plan,direct --out "$OUT"
# the largest length direct can run in the same window, beside the planned mode
cell --task judge_agg --lengths 1536 -n 10 --method rlm-plan,direct --out "$OUT"
# paraphrased retrieval at 4x the window: the other headline cell (n = 20)
cell --task para_niah --lengths 8k -n 20 --method rlm-plan,direct --out "$OUT"
# two-hop and pairs at 4x the window: measured and reported (n = 10)
cell --task two_hop --lengths 8k -n 10 --method rlm-plan,direct --out "$OUT"
cell --task judge_pairs --lengths 8k -n 10 --method rlm-plan,direct --out "$OUT"
.venv/bin/recursa bench report "$OUT"

# Round 2 (rows in heldout-1.5b-r2/): the same headline cells with the changes made on dev
# after round 1 (the typed count choice, misread plans, header lines, the pair rule;
# docs/bench/README.md)
OUT2=docs/bench/heldout-1.5b-r2
cell --task judge_agg --lengths 8k -n 20 --method rlm-plan,direct --out "$OUT2"
cell --task judge_pairs --lengths 8k -n 10 --method rlm-plan,direct --out "$OUT2"
cell --task judge_agg --lengths 1536 -n 10 --method rlm-plan,direct --out "$OUT2"
cell --task para_niah --lengths 8k -n 20 --method rlm-plan,direct --out "$OUT2"
.venv/bin/recursa bench report "$OUT2"
