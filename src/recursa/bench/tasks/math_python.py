"""math-python (Prime Intellect's environment, offline): seeded problems with exact answers,
checked with ``math-verify`` (sympy equivalence of parsed LaTeX/expressions).

Fallback when math-verify is not installed: sympy ``simplify(a - b) == 0`` on the parsed
answers, and without sympy, exact rational comparison with ``fractions.Fraction``."""

from __future__ import annotations

import math
import random
import re
import threading
from fractions import Fraction
from typing import Any

from .base import Instance, Score, Task, answer_segment, estimate_tokens, last_boxed

KINDS = ("fraction_arith", "linear_equation", "binomial", "anagrams", "modpow", "divisors",
         "sum_squares", "quadratic_root")


def _latex(q: Fraction) -> str:
    if q.denominator == 1:
        return str(q.numerator)
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}"


def _plain(q: Fraction) -> str:
    return str(q.numerator) if q.denominator == 1 else f"{q.numerator}/{q.denominator}"


def make_problem(kind: str, rng: random.Random) -> tuple[str, Fraction]:
    """(problem text, exact answer)."""
    if kind == "fraction_arith":
        x, y, z = (Fraction(rng.randrange(1, 20), rng.randrange(2, 13)) for _ in range(3))
        return (f"Compute {_plain(x)} + {_plain(y)} * {_plain(z)} exactly, as a reduced fraction.",
                x + y * z)
    if kind == "linear_equation":
        while True:
            a, c = rng.randrange(-9, 10), rng.randrange(-9, 10)
            if a != c and a and c:
                break
        b, d = rng.randrange(-30, 31), rng.randrange(-30, 31)
        return f"Solve for x: {a}x + {b} = {c}x + {d}.".replace("+ -", "- "), Fraction(d - b, a - c)
    if kind == "binomial":
        n = rng.randrange(6, 30)
        k = rng.randrange(2, n - 1)
        return (f"In how many ways can a committee of {k} people be chosen from {n} people?",
                Fraction(math.comb(n, k)))
    if kind == "anagrams":
        word = "".join(rng.choice("ABCDE") for _ in range(rng.randrange(5, 10)))
        counts = [word.count(ch) for ch in set(word)]
        total = math.factorial(len(word))
        for c in counts:
            total //= math.factorial(c)
        return f"How many distinct strings can be formed by rearranging the letters of {word}?", Fraction(total)
    if kind == "modpow":
        a, e, m = rng.randrange(2, 50), rng.randrange(10, 500), rng.randrange(7, 100)
        return f"What is the remainder when {a}^{e} is divided by {m}?", Fraction(pow(a, e, m))
    if kind == "divisors":
        n = rng.randrange(100, 100_000)
        cnt = sum(2 if i * i != n else 1 for i in range(1, math.isqrt(n) + 1) if n % i == 0)
        return f"How many positive divisors does {n} have?", Fraction(cnt)
    if kind == "sum_squares":
        lo = rng.randrange(1, 20)
        hi = rng.randrange(lo + 5, lo + 60)
        return (f"Compute the sum of k^2 for all integers k from {lo} to {hi} inclusive.",
                Fraction(sum(k * k for k in range(lo, hi + 1))))
    if kind == "quadratic_root":
        r1 = Fraction(rng.randrange(1, 12), rng.choice((1, 2, 3)))
        r2 = -Fraction(rng.randrange(1, 12), rng.choice((1, 2)))
        # (p x - ...) form with integer coefficients: scale by the denominators' lcm.
        lcm = r1.denominator * r2.denominator // math.gcd(r1.denominator, r2.denominator)
        # lcm*r1 and lcm*r2 are whole, so both products are too: int() only changes the type.
        a_ = lcm * lcm
        b_, c_ = int(-a_ * (r1 + r2)), int(a_ * r1 * r2)
        g = math.gcd(math.gcd(a_, b_), c_)
        a_, b_, c_ = a_ // g, b_ // g, c_ // g
        eq = f"{a_}x^2 + {b_}x + {c_} = 0".replace("+ -", "- ")
        return f"Find the positive solution of {eq}.", r1
    raise ValueError(kind)


class MathPython(Task):
    name = "math_python"
    # a whole-number answer of 4+ digits reads as a code (digits), as its gold shows it
    answer_kinds = ("number", "digits", "text")
    complexity = "n/a (short context)"
    description = "Seeded arithmetic/algebra/combinatorics problems; answers checked by math-verify."
    default_length = 0

    def generate(
        self, seed: int = 0, length_tokens: int | None = None, *, kind: str | None = None, **_: Any
    ) -> Instance:
        # The context is the problem itself; length_tokens is accepted for a uniform API but
        # does not size anything here (as in Prime Intellect's math-python).
        length = int(length_tokens or 0)
        rng = self.rng(seed, length, kind or "")
        kind = kind or rng.choice(KINDS)
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        problem, answer = make_problem(kind, rng)
        query = problem + " Use Python if helpful. Put the final answer in \\boxed{}."
        return Instance(
            id=self.make_id(seed, length, kind=kind),
            task=self.name,
            query=query,
            context=problem,
            gold=_plain(answer),
            meta={"kind": kind, "gold_latex": _latex(answer), "verifier": verifier_name(),
                  "length_targeted": False},
            length_tokens=estimate_tokens(problem),
        )

    def score(self, prediction: str, inst: Instance) -> Score:
        return math_score(prediction, str(inst.gold))


def verifier_name() -> str:
    try:
        import math_verify  # noqa: F401
        return "math-verify"
    except ImportError:
        pass
    try:
        import sympy  # noqa: F401
        return "sympy"
    except ImportError:
        return "fraction"


def extract_answer(prediction: str) -> str:
    """The answer expression: last \\boxed{}, else text after 'answer:', else the last number
    or fraction in the text."""
    text = prediction or ""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    seg = answer_segment(text)
    if seg != text.strip():
        return seg.rstrip(". ")
    nums = re.findall(r"-?\\frac\{\d+\}\{\d+\}|-?\d+(?:\.\d+)?(?:\s*/\s*\d+)?", text)
    return nums[-1] if nums else text.strip()


def _timeouts() -> int | None:
    # math-verify enforces timeouts with SIGALRM, which only works in the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


def equivalent(pred: str, gold: str) -> bool:
    """Is ``pred`` mathematically equal to ``gold`` ("1/2" == "0.5" == "\\frac{1}{2}")?"""
    try:
        from math_verify import parse, verify
    except ImportError:
        return _sympy_equal(pred, gold)
    t = _timeouts()
    g = parse(f"${gold}$", parsing_timeout=t)  # type: ignore[arg-type]
    for cand in (pred, f"${pred}$", f"\\boxed{{{pred}}}"):
        p = parse(cand, parsing_timeout=t)  # type: ignore[arg-type]
        if p and verify(g, p, timeout_seconds=t):
            return True
    return False


def _to_fraction(s: str) -> Fraction | None:
    s = s.strip().replace(" ", "")
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(\d+)\}", s)
    if m:
        return Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) else 1)
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _sympy_equal(pred: str, gold: str) -> bool:
    fp, fg = _to_fraction(pred), _to_fraction(gold)
    if fp is not None and fg is not None:
        return fp == fg
    try:
        import sympy
        from sympy.parsing.sympy_parser import parse_expr
    except ImportError:
        return False
    try:
        diff = parse_expr(pred.replace("^", "**")) - parse_expr(gold.replace("^", "**"))
        return bool(sympy.simplify(diff) == 0)
    except Exception:  # noqa: BLE001 - unparsable model output is simply wrong
        return False


def math_score(prediction: str, gold: str) -> Score:
    ans = extract_answer(prediction)
    ok = float(bool(ans) and equivalent(ans, gold))
    return Score(score=ok, metrics={"correct": ok}, parsed=ans)
