"""Sentence embeddings for the `embed` baselines: the pinned all-MiniLM-L6-v2 int8 ONNX encoder.

It moved to recursa.core.contextual (search() in the REPL uses it too, and the core may not
import the bench); this module re-exports it so the baselines and their figures are unchanged.
"""

from __future__ import annotations

from recursa.core.contextual import (
    BATCH,
    MAX_TOKENS,
    MODEL,
    TOKENIZER,
    EmbedUnavailable,
    MiniLM,
    encoder,
    pinned_file,
)

__all__ = ["BATCH", "MAX_TOKENS", "MODEL", "TOKENIZER", "EmbedUnavailable", "MiniLM", "encoder",
           "pinned_file"]
