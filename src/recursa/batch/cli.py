"""`recursa batch`: one question over many documents (or many questions over one corpus, or a
typed extraction into a table), resumable, with progress and one budget for the whole batch.

    recursa batch "Who signed?" --contexts contracts/ --out answers.jsonl
    recursa batch --queries questions.txt --context corpus/ --out answers.jsonl
    recursa batch "Extract the parties" --contexts filings.parquet --column text \\
        --schema parties.json --out parties.csv --total-cost 20

Every finished item is one JSON row appended (fsynced) to the rows file: --out itself, or
OUT.rows.jsonl beside a .csv / .parquet --out, which is written from the rows at the end.
Re-running the same command resumes: items with a row are skipped (--retry-errors redoes the
failed ones); an item its own limits cut to no answer is not done and runs again. Exit status
as `bench run`: 0 all done, 1 some failed, 2 bad options (or a rows file whose rows are not
recursa's), 4 items left undone by a limit (the batch budget stopped it, or items were cut
with no answer), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from recursa.core.batch.table import TABLE_FORMATS
from recursa.frontend.options import OptionError, RLMOptions, _number, plain_error, query_and_cache

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUDGET, EXIT_INTERRUPTED = 0, 1, 2, 4, 130


def register(sub: Any) -> None:
    from recursa.core.batch.executors import add_executor_options
    b = sub.add_parser(
        "batch", help="one question over many documents (or many over one), resumable",
        description="Run QUERY over every context (a directory: one item per file; a "
        ".jsonl/.csv/.parquet file: one item per row), or every --queries line over one "
        "--context. One JSON row per item in --out, fsynced; re-running resumes. Exit status: "
        "0 all done, 1 some failed, 2 bad options, 4 a limit left items undone (the batch "
        "budget, or items cut with no answer: a re-run does them), 130 interrupted.")
    b.add_argument("query", nargs="?", help="the question asked of every context")
    src = b.add_argument_group("items")
    src.add_argument("--contexts", nargs="+", metavar="PATH",
                     help="files, directories (one item per file) or a .jsonl/.csv/.parquet "
                          "table (one item per row)")
    src.add_argument("--column", help="the table column holding the context (default: the "
                     "first of context, text, document, content, body)")
    src.add_argument("--query-column", help="a table column holding each row's question")
    src.add_argument("--id-column", help="a table column naming each row (kept in the output; "
                     "default: the row number)")
    src.add_argument("--queries", metavar="FILE",
                     help="many questions (one per line) over the one --context")
    src.add_argument("--context", metavar="PATH", action="append", help="with --queries: "
                     "the corpus every question is asked of (a file, a directory, - or a pipe "
                     "such as <(cmd)); repeat it for several, which load as one context "
                     "{name: contents}")
    out = b.add_argument_group("output")
    out.add_argument("--out", required=True, help="rows file (.jsonl), or a .csv / .parquet "
                     "table (one column per --schema field; rows in OUT.rows.jsonl)")
    out.add_argument("--schema", metavar="FILE", help="JSON schema of the answer (typed "
                     "extraction); a table --out gets one column per top-level field")
    out.add_argument("--retry-errors", action="store_true", help="redo items whose row failed")
    out.add_argument("--trace-dir", help="write one trace file per item into this directory")
    out.add_argument("--quiet", "-q", action="store_true", help="no progress, no summary")
    out.add_argument("--events", choices=["jsonl"], help="one JSON line per finished item (and "
                     "a summary line) on stderr instead of the progress bar")
    bb = b.add_argument_group("the batch budget (across all items; each item reserves its own "
                              "--max-cost / --max-tokens, or an equal share of the batch's)")
    bb.add_argument("--total-cost", type=_number(float, 0), metavar="USD",
                    help="USD across the batch: no item starts that could pass it")
    bb.add_argument("--total-tokens", type=_number(int, 1), metavar="N",
                    help="tokens across the batch")
    bb.add_argument("--total-seconds", type=_number(float, 0, above=True), metavar="S",
                    help="wall time of the batch: no item starts after it, running ones are "
                         "cut to end by it")
    b.add_argument("--concurrency", type=_number(int, 1), default=4, metavar="N",
                   help="items run at once (default 4; on Ray: Ray's free CPUs decide)")
    b.add_argument("--retries", type=_number(int, 0), default=2, metavar="N",
                   help="ray: times an item whose worker or node died is tried again")
    add_executor_options(b, what="items")
    RLMOptions.add_to(b, skip_aliases=("--concurrency",))
    b.set_defaults(fn=cmd_batch, command_parser=b)   # its usage line for main's errors


def out_paths(out: str) -> tuple[Path, Path | None]:
    """(rows file, table or None) for --out."""
    p = Path(out)
    if p.suffix.lower() in TABLE_FORMATS:
        return p.with_name(p.name + ".rows.jsonl"), p
    return p, None


def _items(a: argparse.Namespace) -> list[Any]:
    from recursa.core.batch.items import make_items
    if a.queries:
        if a.contexts or a.query:
            raise OptionError("--queries asks many questions of one --context; give no QUERY "
                              "and no --contexts with it")
        if not a.context:
            raise OptionError("--queries needs --context (the corpus every question is asked of)")
        try:
            qs = [q.strip() for q in Path(a.queries).read_text(encoding="utf-8").splitlines()]
        except OSError as e:
            raise OptionError(f"--queries {a.queries}: cannot read it ({e.strerror})") from None
        from recursa.frontend.contexts import read_contexts
        corpus = read_contexts(a.context)
        return make_items([(q, corpus) for q in dict.fromkeys(q for q in qs if q)])
    if a.context:
        raise OptionError("--context goes with --queries; for one question over many "
                          "documents use --contexts")
    if not a.contexts:
        raise OptionError("give --contexts (one item per file or row) or --queries + --context")
    if not a.query and not a.query_column:
        raise OptionError("give QUERY (or --query-column for a table with a question per row)")
    ctx: Any = [Path(c) for c in a.contexts]
    return make_items(query=a.query, contexts=ctx if len(ctx) > 1 else ctx[0],
                      column=a.column, query_column=a.query_column, id_column=a.id_column)


def cmd_batch(a: argparse.Namespace) -> int:
    from recursa.base.types import RecursaError
    from recursa.frontend.console import Notices
    from recursa.frontend.schema import read_schema
    notes = Notices(jsonl=a.events == "jsonl", quiet=a.quiet)
    try:
        return _batch(a, notes, read_schema)
    except (RecursaError, OptionError, ValueError, TypeError, OSError) as e:
        notes.error(plain_error(e))
        return EXIT_USAGE
    finally:
        notes.close()


def _batch(a: argparse.Namespace, notes: Any, read_schema: Any) -> int:
    from recursa.core.batch.ledger import BatchBudget
    from recursa.core.batch.rowfile import ResultsFile
    from recursa.core.batch.rows import row_cut, row_failed, row_problem
    from recursa.core.batch.run import RayBatchExecutor, aiter_batch
    from recursa.core.preflight import check_options

    rows_path, table_path = out_paths(a.out)
    if not a.queries and not a.query_column:      # QUERY is needed: --cache may have taken it
        a.query, a.cache = query_and_cache(a.query, a.cache)
    opts = RLMOptions.from_args(a).with_default_model(say=notes.warn)
    output = read_schema(a.schema)
    items = _items(a)
    budget = BatchBudget(max_cost_usd=a.total_cost, max_tokens=a.total_tokens,
                         max_seconds=a.total_seconds)
    check_options(opts, say=notes.info)        # once, before any item: nothing spent yet
    rlm = opts.build(trace_dir=a.trace_dir, preflight=False)
    executor = None
    if a.executor == "ray":
        executor = RayBatchExecutor(a.address, retries=a.retries, env_vars=a.ray_env)
    # a resume trusts the rows (which items are done): a row that is not one of ours is named
    # by file and line before anything runs
    results = ResultsFile(rows_path, check=row_problem)
    mine = {it.key for it in items}
    # an item a limit cut to no answer is not done: it runs again (with the limits given now)
    done = results.done(a.retry_errors, redo=row_cut)
    todo = [it for it in items if it.key not in done]
    skipped = len(items) - len(todo)
    recut = sum(1 for k, r in results.rows.items() if k in mine and row_cut(r))
    if skipped:
        notes.info(f"resuming: {skipped} of {len(items)} items already have a row in {rows_path}")
    if recut:
        notes.info(f"{recut} items a limit cut with no answer run again")
    mode = "jsonl" if a.events == "jsonl" else "quiet" if a.quiet else "rich"
    from recursa.core.batch.progress import BatchProgress
    bar = BatchProgress(len(todo), mode=mode, skipped=skipped)
    summary: dict[str, Any] = {}

    async def go() -> None:
        async for r in aiter_batch(rlm, todo, concurrency=a.concurrency, budget=budget,
                                   output=output, executor=executor, summary=summary):
            if r.row is not None:
                results.append(r.row)          # durable before anything looks at it
                bar.item(r.row, row_failed(r.row), cut=row_cut(r.row))

    interrupted = False
    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        interrupted = True
    finally:
        results.close()
    rows = [r for k, r in results.rows.items() if k in mine]
    failed = [r for r in rows if row_failed(r)]
    cut = [r for r in rows if row_cut(r)]
    remaining = len(items) - len(rows) + len(cut)     # no row yet, or cut with no answer
    if table_path is not None:
        from recursa.core.batch.table import schema_fields, table_rows, write_table
        extra = [a.id_column] if a.id_column else []
        write_table(table_rows(rows, schema_fields(output.schema if output else None), extra),
                    table_path)
    final = {"items": len(items), "ran": summary.get("done", bar.done), "skipped": skipped,
             "failed": len(failed), "cut": len(cut), "remaining": remaining,
             "not_started": summary.get("not_started", 0),
             "cost_usd": summary.get("cost_usd"), "tokens": summary.get("tokens", bar.tokens),
             "stopped": summary.get("stopped"), "lost_attempts": summary.get("lost_attempts", 0),
             "elapsed_s": summary.get("elapsed_s"), "rows": str(rows_path),
             "table": str(table_path) if table_path else None, "interrupted": interrupted}
    bar.close(final)
    if mode == "rich":
        _print_summary(final, failed)
    if interrupted:
        # said in every mode but -q: a stopped batch must not read as a finished one
        notes.warn(f"interrupted: {remaining} of {len(items)} items remain; run the same "
                   f"command again to resume (finished items are kept in {rows_path})")
        return EXIT_INTERRUPTED
    if failed:
        return EXIT_FAILED
    return EXIT_BUDGET if remaining else EXIT_OK


def _print_summary(s: dict[str, Any], failed: list[dict[str, Any]]) -> None:
    from recursa.frontend.console import escape, stderr_console
    from recursa.frontend.failures import failure_reasons
    con = stderr_console()
    cost = "cost ?" if s["cost_usd"] is None else f"${s['cost_usd']:.4f}"
    con.print(f"{s['ran']} run, {s['skipped']} already done, {s['failed']} failed, "
              f"{s['cut']} cut by a limit with no answer, "
              f"{s['not_started']} not started; {cost}, {s['tokens']:,} tokens, "
              f"{s['elapsed_s'] or 0:.1f}s; rows in {escape(s['rows'])}"
              + (f", table {escape(s['table'])}" if s["table"] else ""))
    if s["stopped"]:
        con.print(f"[yellow]the batch budget ({s['stopped']}) stopped it: {s['not_started']} "
                  "items did not start; raise the limit and re-run to do them[/]")
    if s["cut"]:
        con.print(f"[yellow]{s['cut']} items were cut by their own limits (--max-cost, "
                  "--max-tokens, --max-seconds...) before they had an answer: not done; "
                  "re-run (with a higher limit) to do them[/]")
    if s["lost_attempts"]:
        con.print(f"[yellow]{s['lost_attempts']} attempts were lost with their worker and "
                  "retried (their reported spend is counted)[/]")
    if failed:
        con.print(f"[red]{len(failed)} items failed[/] (re-run with --retry-errors to redo them):")
        for why, n in failure_reasons([{**r, "error": r.get("error") or r.get("output_error")}
                                       for r in failed]):
            con.print(f"  {n} x {escape(why)}")

