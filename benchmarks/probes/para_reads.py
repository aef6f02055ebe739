"""Where a paraphrased-retrieval run went wrong, from its rows and traces: for each `rlm-plan`
instance, whether the needle's passage reached a reader (the gold code is in a sub-call's
prompt), whether a reader answered the gold, and whether the final answer did. Separates
"search did not bring the passage" from "the reader misread it" from "the answer step chose
wrong" (issue 34 item 7).

Usage: para_reads.py ROWS.jsonl   (trace paths in the rows are relative to the checkout that ran)
"""
import json
import sys
from pathlib import Path


def main(rows_path: str) -> None:
    rows = [json.loads(line) for line in open(rows_path)]
    base = Path(rows_path).resolve().parents[3]        # docs/bench/<dir>/rows.jsonl -> checkout
    read = answered = right = n = 0
    for r in rows:
        if r["method"] != "rlm-plan" or not r["task"].startswith("para_niah"):
            continue
        gold = str(r.get("gold"))
        events = [json.loads(x) for x in open(base / r["trace_path"])]
        prompts = [json.dumps(e["data"]) for e in events
                   if e["kind"] == "subcall" and e.get("phase") == "start"]
        replies = [str(e["data"].get("response", "")) for e in events
                   if e["kind"] == "subcall" and e.get("phase") == "end"]
        was_read = any(gold in p for p in prompts)
        was_answered = any(gold in x for x in replies)
        n, read, answered = n + 1, read + was_read, answered + was_answered
        right += r["score"] == 1.0
        print(f"seed {r['seed']}: needle read {was_read}, a reader named it {was_answered}, "
              f"answer {r.get('answer')!r} (gold {gold}) {'right' if r['score'] == 1.0 else 'wrong'}")
    print(f"{n} instances: needle read {read}, a reader named it {answered}, right {right}")


if __name__ == "__main__":
    main(sys.argv[1])
