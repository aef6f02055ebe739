"""CodeQA: multiple-choice questions about real code (the Python stdlib on this machine).

Answers are computed from the included sources with ``ast``, never from documentation, so
they are right for whatever Python version generated the instance (recorded in meta)."""

from __future__ import annotations

import ast
import builtins
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..corpora import stdlib_dir, stdlib_py_files
from .base import CHARS_PER_TOKEN, Instance, Score, Task, answer_segment, mentioned_choices

LETTERS = "ABCD"
QUESTION_TYPES = ("method_owner", "caller", "import_count", "defines_function")
_BUILTINS = set(dir(builtins))


@dataclass
class FileFacts:
    classes: dict[str, set[str]] = field(default_factory=dict)  # class -> methods it defines
    calls: dict[str, set[str]] = field(default_factory=dict)  # function qualname -> called names
    imports: set[str] = field(default_factory=set)  # top-level modules imported
    functions: set[str] = field(default_factory=set)  # top-level def names


def _called_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def analyze(source: str) -> FileFacts:
    facts = FileFacts()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            facts.imports.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            facts.imports.add(node.module.split(".")[0])
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            facts.functions.add(node.name)
            facts.calls[node.name] = _calls_in(node)
        elif isinstance(node, ast.ClassDef):
            methods = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    methods.add(item.name)
                    facts.calls[f"{node.name}.{item.name}"] = _calls_in(item)
            facts.classes[node.name] = methods
    return facts


def _calls_in(fn: ast.AST) -> set[str]:
    return {n for c in ast.walk(fn) if isinstance(c, ast.Call) and (n := _called_name(c))}


@lru_cache(maxsize=4096)
def _facts_for(path: str) -> FileFacts | None:
    try:
        return analyze(Path(path).read_text(encoding="utf-8"))
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return None


@lru_cache(maxsize=1)
def _catalogue() -> tuple[tuple[str, str, int], ...]:
    """(relative path, absolute path, size in chars) of every parseable-looking stdlib file."""
    root = stdlib_dir()
    out = []
    for p in stdlib_py_files():
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append((p.relative_to(root).as_posix(), str(p), len(text)))
    return tuple(out)


class CodeQA(Task):
    name = "codeqa"
    answer_kinds = ("choice",)
    complexity = "linear"
    description = "Multiple choice about the stdlib source: call graph, class methods, imports."
    default_length = 32_000

    def generate(
        self,
        seed: int = 0,
        length_tokens: int | None = None,
        *,
        question: str | None = None,
        format: str = "dict",
        **_: Any,
    ) -> Instance:
        length = int(length_tokens or self.default_length)
        if format not in ("dict", "str"):
            raise ValueError("format must be 'dict' or 'str'")
        if question is not None and question not in QUESTION_TYPES:
            raise ValueError(f"question must be one of {QUESTION_TYPES}")
        rng = self.rng(seed, length, question or "", format)
        budget = length * CHARS_PER_TOKEN
        files = list(_catalogue())
        rng.shuffle(files)
        chosen: list[tuple[str, str]] = []
        facts: dict[str, FileFacts] = {}
        used = 0
        # Greedy fill with whole files (so every answer is computed on complete, parseable code);
        # skipping files that do not fit lands within a few hundred chars of the target.
        for rel, path, size in files:
            cost = size + len(rel) + (len(f"### {rel}\n\n\n") - len(rel) if format == "str" else 0)
            if used + cost > budget:
                continue
            f = _facts_for(path)
            if f is None:
                continue
            chosen.append((rel, path))
            facts[rel] = f
            used += cost
            if budget - used < 0.005 * budget:
                break
        chosen.sort()
        sources = {rel: Path(path).read_text(encoding="utf-8") for rel, path in chosen}
        q = self._question(rng, facts, question)
        if q is None:
            raise ValueError(f"could not build a codeqa question at {length} tokens; use more")
        qtype, qtext, choices, correct = q
        letter = LETTERS[correct]
        query = (
            "The context is Python source code from the standard library, one entry per file. "
            + qtext
            + "\n"
            + "\n".join(f"{LETTERS[i]}) {c}" for i, c in enumerate(choices))
            + "\nAnswer with the letter of the correct choice."
        )
        context: str | dict[str, str]
        if format == "dict":
            context = sources
        else:
            context = "".join(f"### {rel}\n{src}\n\n" for rel, src in sources.items())
        return Instance(
            id=self.make_id(seed, length, question=question, format=format),
            task=self.name,
            query=query,
            context=context,
            gold=letter,
            meta={
                "question_type": qtype,
                "choices": choices,
                "answer_text": choices[correct],
                "files": [rel for rel, _ in chosen],
                "python": sys.version.split()[0],
                "corpus": "stdlib",
            },
            length_tokens=length,
        )

    def _question(
        self, rng: Any, facts: dict[str, FileFacts], want: str | None
    ) -> tuple[str, str, list[str], int] | None:
        order = [want] if want else rng.sample(QUESTION_TYPES, len(QUESTION_TYPES))
        for qt in order + [t for t in QUESTION_TYPES if t not in order]:
            q = getattr(self, f"_q_{qt}")(rng, facts)
            if q is not None:
                return (qt, *q)
        return None

    @staticmethod
    def _place(rng: Any, gold: str, distractors: list[str]) -> tuple[list[str], int]:
        choices = [gold, *distractors]
        rng.shuffle(choices)
        return choices, choices.index(gold)

    def _q_method_owner(self, rng: Any, facts: dict[str, FileFacts]):
        classes = [(f"{c} (in {rel})", c, ms) for rel, f in sorted(facts.items()) for c, ms in sorted(f.classes.items())]
        owners: dict[str, list[str]] = {}
        for label, _, ms in classes:
            for m in ms:
                if not m.startswith("__"):
                    owners.setdefault(m, []).append(label)
        cands = sorted(m for m, o in owners.items() if len(o) == 1)
        rng.shuffle(cands)
        for m in cands[:50]:
            gold = owners[m][0]
            others = sorted(label for label, _, ms in classes if m not in ms and label != gold)
            if len(others) >= 3:
                choices, idx = self._place(rng, gold, rng.sample(others, 3))
                return f"Which class defines a method named `{m}`?", choices, idx
        return None

    def _q_caller(self, rng: Any, facts: dict[str, FileFacts]):
        funcs = [(f"{q} (in {rel})", calls) for rel, f in sorted(facts.items()) for q, calls in sorted(f.calls.items())]
        callers: dict[str, list[str]] = {}
        for label, calls in funcs:
            for n in calls:
                if n not in _BUILTINS and len(n) >= 4 and not n.startswith("__"):
                    callers.setdefault(n, []).append(label)
        cands = sorted(n for n, c in callers.items() if 1 <= len(c) <= 2)
        rng.shuffle(cands)
        for n in cands[:50]:
            gold = rng.choice(sorted(callers[n]))
            others = sorted(label for label, calls in funcs if n not in calls)
            if len(others) >= 3:
                choices, idx = self._place(rng, gold, rng.sample(others, 3))
                text = (
                    f"Which of these functions or methods calls something named `{n}` "
                    f"(as `{n}(...)` or `obj.{n}(...)`) in its body?"
                )
                return text, choices, idx
        return None

    def _q_import_count(self, rng: Any, facts: dict[str, FileFacts]):
        counts: dict[str, int] = {}
        for f in facts.values():
            for m in f.imports:
                counts[m] = counts.get(m, 0) + 1
        cands = sorted(m for m, c in counts.items() if c >= 2)
        if not cands:
            return None
        mod = rng.choice(cands)
        gold = counts[mod]
        pool = [gold + d for d in (-3, -2, -1, 1, 2, 3, 4) if gold + d >= 0]
        distractors = [str(x) for x in rng.sample(pool, 3)]
        choices, idx = self._place(rng, str(gold), distractors)
        text = (
            f"How many of the files in the context import the module `{mod}` or one of its "
            f"submodules (`import {mod}`, `import {mod}.x`, `from {mod} import ...`, "
            f"`from {mod}.x import ...`, anywhere in the file; relative imports do not count)?"
        )
        return text, choices, idx

    def _q_defines_function(self, rng: Any, facts: dict[str, FileFacts]):
        where: dict[str, list[str]] = {}
        for rel, f in sorted(facts.items()):
            for fn in f.functions:
                if not fn.startswith("_"):
                    where.setdefault(fn, []).append(rel)
        cands = sorted(fn for fn, w in where.items() if len(w) == 1)
        files = sorted(facts)
        if not cands or len(files) < 4:
            return None
        fn = rng.choice(cands)
        gold = where[fn][0]
        others = [r for r in files if r != gold]
        choices, idx = self._place(rng, gold, rng.sample(others, 3))
        return f"Which file defines a top-level function named `{fn}`?", choices, idx

    def score(self, prediction: str, inst: Instance) -> Score:
        letter = parse_choice_letter(prediction, inst.meta.get("choices", []))
        s = float(letter == inst.gold)
        return Score(score=s, metrics={"accuracy": s}, parsed=letter)


def parse_choice_letter(prediction: str, choices: list[str], letters: str = LETTERS) -> str | None:
    """The chosen letter from free text: 'B', '(B)', 'B) ...', 'Answer: B', 'option B', or the
    text of exactly one choice. Returns None when nothing (or several letters) is chosen."""
    seg = answer_segment(prediction)
    cls = f"[{letters}]"
    # A leading letter counts when punctuated ("B)", "B.") or alone; "A or B" is a hedge.
    m = re.match(rf"^\W*({cls})(?:[).:\]]|\s*$)", seg)
    if m:
        return m.group(1)
    m = re.search(rf"\b(?:option|choice|letter)\s*\(?({cls})\)?(?!\w)", seg, re.IGNORECASE)
    if m:
        return m.group(1).upper()
    found = set(re.findall(rf"\(({cls})\)|(?<!\w)({cls})\)", seg))
    flat = {a or b for a, b in found}
    if len(flat) == 1:
        return flat.pop()
    alone = set(re.findall(rf"(?<![\w'])({cls})(?![\w'])", seg))
    if len(alone) == 1:
        return alone.pop()
    if choices:
        hits = mentioned_choices(seg, choices)
        if len(hits) == 1:
            return letters[choices.index(hits[0])]
    return None
