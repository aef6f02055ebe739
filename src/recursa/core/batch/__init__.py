"""Many RLM runs as one batch: the same question over many documents, many questions over one
corpus, or a typed extraction into a table (docs/batch.md).

    res = rlm.batch([("Who signed?", Path("a.txt")), ...], concurrency=4,
                    budget=BatchBudget(max_cost_usd=20))
    res = rlm.batch(query="Who signed?", contexts=Path("contracts/"))

Results come back in order; one failed item never stops the rest; the batch budget (cost,
tokens, time across all items) stops new items from starting and says so. `iter_batch` /
`aiter_batch` yield items as they finish; `executor=RayBatchExecutor(address=...)` runs the
items as Ray tasks on a cluster with one ledger actor holding the budget. `recursa batch` is
the command (recursa.batch.cli): resumable rows, progress, CSV / Parquet tables.

This package also holds the pieces the bench shares: the results file (rowfile) and the
executor seam (executors). Importing it imports neither Ray nor rich.
"""

from __future__ import annotations

from .items import BatchItem, expand_contexts, make_items
from .ledger import BatchBudget, BatchLedger
from .run import BatchResult, ItemResult, abatch, aiter_batch, batch, iter_batch

__all__ = ["BatchBudget", "BatchItem", "BatchLedger", "BatchResult", "ItemResult", "abatch",
           "aiter_batch", "batch", "expand_contexts", "iter_batch", "make_items"]
