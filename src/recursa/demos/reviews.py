"""`make demo`'s case: which shop has the unhappiest customers, over more reviews than the
model's window holds, when no review says whether its customer was happy.

Each record is one customer review (`Review 4127 | Shop: Kingsway | Product: kettle |
Customer: 48213 | Text: ...`), written by the bench's review generator (`bench.tasks._reviews`):
the customer's verdict is stated in other words ("stopped working after three days", "worth
every penny"), never as a label a search could find. Every shop occurs exactly equally often,
so counting names says nothing; one shop has a clearly higher hidden complaint rate than the others,
and the instance is redrawn until its lead in complaints is at least `MARGIN`, so the answer is
clear to anyone who judges every review, and to no one who does not.

Seeds are split like the bench's held-out families: below 1000 dev (the planned mode's prompt,
its leaf question and this demo's sizes were tuned on them), 1000 and above test (the demo, its
test and the figures in the README). Dev and test seeds draw their review phrasings, shops and
products from disjoint halves of the generator's lists.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace

from recursa.bench.tasks._reviews import make_reviews
from recursa.bench.tasks.judge_agg import complaints_by
from recursa.bench.tasks.strict import strict_choice

TEST_SEEDS_FROM = 1000
N_SHOPS = 4
MARGIN = 4           # complaints by which the answer leads the next shop, in the gold labels
QUERY = {"test": "Which shop has the most unhappy customers? Answer with the shop's name.",
         "dev": "Name the shop whose buyers were most often disappointed."}


@dataclass(frozen=True)
class Case:
    context: str
    query: str
    shop: str                       # the answer
    shops: tuple[str, ...]
    complaints: dict[str, int]      # the gold judgement, counted per shop
    records: int
    split: str

    def check(self, answer: str) -> bool:
        """Right when the answer names the shop and no other (a hedge or a pasted passage is
        wrong): the bench's strict rules."""
        return strict_choice(answer, self.shop, list(self.shops)).score == 1.0

    def grep_answer(self) -> str:
        """The no-model grep baseline: the record holding the query's rarest words."""
        from recursa.bench.baselines import grep_answer
        return grep_answer(self.query, self.context)

    def regex_answer(self) -> str:
        """The no-model regex baseline: the shop named most often, or "" when every shop is
        named equally often (as here: the names carry no signal, and a tie-break is a guess)."""
        names = Counter(line.split("| Shop: ", 1)[1].split(" |", 1)[0]
                        for line in self.context.splitlines() if "| Shop: " in line)
        (top, n1), (_, n2) = names.most_common(2)
        return top if n1 > n2 else ""


def make_case(seed: int = TEST_SEEDS_FROM, tokens: int = 4608) -> Case:
    """About `tokens` tokens of reviews (4 characters ~ 1 token) and the question."""
    split = "test" if seed >= TEST_SEEDS_FROM else "dev"
    rng = random.Random(f"reviews-demo:{seed}")
    for _ in range(50):
        worst = rng.randrange(N_SHOPS)
        rates = [rng.uniform(0.6, 0.75) if i == worst else rng.uniform(0.15, 0.4)
                 for i in range(N_SHOPS)]
        rs = make_reviews(rng, tokens, split, n_shops=N_SHOPS, n_products=5, shop_rates=rates)
        # whole rounds only: every shop named exactly as often as every other
        n = len(rs.lines) - len(rs.lines) % N_SHOPS
        rs = replace(rs, lines=rs.lines[:n], shops=rs.shops[:n], products=rs.products[:n],
                     customers=rs.customers[:n], labels=rs.labels[:n])
        counts = complaints_by(rs, "shop")
        (top, n1), (_, n2) = counts.most_common(2)
        if n1 - n2 >= MARGIN:
            break
    else:
        raise RuntimeError(f"seed {seed}: no instance with a clear answer in 50 draws")
    return Case(context=rs.text(), query=QUERY[split], shop=top, shops=tuple(rs.shop_names),
                complaints=dict(counts), records=len(rs.lines), split=split)
