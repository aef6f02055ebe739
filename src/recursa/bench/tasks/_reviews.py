"""Customer reviews whose sentiment must be judged: shared by judge_agg and judge_pairs.

One record per line:
``Review 0412 | Shop: Northgate | Product: kettle | Customer: 48213 | Text: <four sentences>``.
Whether the customer was pleased or unhappy is never written as a word the question uses
(complaint, praise, happy, unhappy, positive, negative, satisfied ...; tests check it): it is
stated in other words ("stopped working after three days", "worth every penny"). The records
are clear-cut on purpose, so a 1.5B model can judge each one; the difficulty is doing it for
every record of an input several times its window.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from .base import CHARS_PER_TOKEN
from .split import halves

LABELS = ("praise", "complaint")
# words a record must never contain (they would make a label greppable)
LABEL_WORDS = ("praise", "complaint", "complain", "happy", "unhappy", "satisfied",
               "dissatisfied", "positive", "negative", "pleased", "displeased", "sentiment")

POSITIVE = [
    "The {p} arrived a day early and works perfectly.",
    "I have used the {p} every day for a month and it has never let me down.",
    "Best {p} I have ever owned, sturdy and easy to clean.",
    "The {p} does exactly what it promised and looks lovely on the shelf.",
    "My family adores the new {p}; we should have bought one years ago.",
    "Great value: the {p} feels twice as expensive as it was.",
    "The {p} is quiet, quick and beautifully made.",
    "Setting up the {p} took two minutes and it has worked flawlessly since.",
    "I would buy this {p} again without a second thought.",
    "The {p} exceeded every expectation I had.",
    "Such a well designed {p}; every detail has been thought through.",
    "Five stars for the {p}, it is a joy to use.",
    "The {p} replaced an older one and is better in every way.",
    "Wonderful {p}, it has made my mornings so much easier.",
    "The {p} is solid, reliable and a real bargain.",
    "Honestly the nicest {p} in the shop, and the staff were lovely too.",
    "The {p} works like a charm and the finish is gorgeous.",
    "I recommend this {p} to all my friends.",
    "Brilliant {p}: light, strong and easy to carry.",
    "The {p} has been perfect from the first day.",
    "Top quality {p}, worth every penny.",
    "The {p} is a delight and arrived beautifully packed.",
    "Everything about the {p} is excellent.",
    "The {p} is fantastic and the instructions were clear.",
]
POSITIVE_CLOSE = [
    "I will certainly shop here again.", "Thank you for a lovely product.",
    "Very glad I chose it.", "A fantastic purchase.", "Highly recommended.",
    "Could not ask for more.", "It was money well spent.", "Full marks from me.",
    "I am delighted with it.", "A real treat to own.", "Superb service as well.",
    "It has made life easier.",
]
NEGATIVE = [
    "The {p} stopped working after three days.",
    "The {p} arrived with a cracked handle and nobody answered my emails.",
    "Worst {p} I have ever bought; it leaks everywhere.",
    "The {p} broke the first time I used it.",
    "The {p} is flimsy, noisy and far too expensive.",
    "I regret buying this {p}; it is a waste of money.",
    "The {p} smells of burnt plastic whenever it is switched on.",
    "The {p} looks nothing like the picture and feels cheap.",
    "After a week the {p} simply died and the refund is still not here.",
    "The {p} rattles, wobbles and scratches the table.",
    "Two parts were missing from the {p} box and support never replied.",
    "The {p} overheated and tripped the fuse twice.",
    "The {p} is the most frustrating thing I have owned.",
    "The {p} fell apart within a fortnight.",
    "Dreadful {p}; the buttons stick and the lid will not close.",
    "The {p} was sent to the wrong address and arrived damaged.",
    "The {p} never worked properly, not even once.",
    "Avoid this {p}: it is poorly made and useless.",
    "The {p} is so loud that nobody in the house can sleep.",
    "The paint on the {p} peeled off in days.",
    "The {p} is a terrible design and hurts to hold.",
    "I sent the {p} back after it ruined a whole batch of food.",
    "The {p} is a complete letdown.",
    "The {p} jammed on day one and has been useless since.",
]
NEGATIVE_CLOSE = [
    "I want my money back.", "Never again.", "Very poor service overall.",
    "I would not wish it on anyone.", "Save your money.", "What a waste.",
    "Deeply disappointing.", "I am furious about it.", "Stay well away.",
    "Utterly let down.", "A miserable experience.", "Shameful quality.",
]
NEUTRAL = [
    "I ordered it on a {day} and collected it from the counter.",
    "It is mostly used in the kitchen by my partner and me.",
    "The box was the usual brown cardboard.",
    "We live in a small flat, so space matters.",
    "I paid by card at the till.",
    "It came in the {colour} version.",
    "My neighbour has a similar one from another brand.",
    "This was a birthday present for my brother.",
    "It is the medium size, which fits on the counter.",
    "I bought it during the spring sale after comparing a few models.",
    "The manual comes in four languages.",
    "It uses a standard plug and a one metre cable.",
    "My daughter picked the colour.",
    "We had been looking for one since we moved house in {month}.",
    "I read about it in a magazine at the dentist.",
    "The delivery driver left it with the neighbours.",
    "It replaced one that my parents gave us years ago.",
    "I mostly use it at weekends.",
    "The shop assistant showed me how to clean it before I left.",
    "Our old one went to the recycling centre on the same day.",
    "I chose the model with the longer warranty, just in case.",
    "It sits next to the bread bin, under the window.",
    "We have two children and a dog, so everything gets heavy use here.",
    "I compared the prices of three shops in town before buying.",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
COLOURS = ["grey", "white", "black", "green", "blue", "red", "cream"]
MONTHS = ["March", "April", "May", "June", "September", "October"]
PRODUCTS = ["kettle", "toaster", "blender", "desk lamp", "coffee grinder", "rice cooker",
            "hair dryer", "electric fan", "vacuum cleaner", "bread maker", "air fryer",
            "food processor", "space heater", "juicer", "steam iron", "radio", "alarm clock",
            "waffle maker"]
SHOPS = ["Northgate", "Riverside", "Old Market", "Harbour Street", "Hillcrest", "Westfield",
         "Elm Road", "Station Square", "Millbrook", "Kingsway", "Bayview", "Oakley",
         "Castle Green", "Fairfield", "Brookside", "Queensbury", "Ashby Cross", "Lakeside"]


@dataclass
class Reviews:
    lines: list[str]
    shops: list[str]
    products: list[str]
    customers: list[int]
    labels: list[str]
    shop_names: list[str]
    product_names: list[str]
    customer_ids: list[int]
    header: str
    extra: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        return self.header + "\n".join(self.lines) + "\n"

    def meta(self) -> dict[str, Any]:
        return {"labels": self.labels, "shops": self.shops, "products": self.products,
                "customers": self.customers, "shop_names": self.shop_names,
                "product_names": self.product_names, "customer_ids": self.customer_ids,
                "n_records": len(self.lines), "label_space": list(LABELS)}


def review_text(rng: random.Random, label: str, product: str, split: str) -> str:
    pos, neg = halves(POSITIVE)[split], halves(NEGATIVE)[split]
    pos_c, neg_c = halves(POSITIVE_CLOSE)[split], halves(NEGATIVE_CLOSE)[split]
    opener = rng.choice(pos if label == "praise" else neg).format(p=product)
    closer = rng.choice(pos_c if label == "praise" else neg_c)
    middle = rng.sample(NEUTRAL, 4)     # neutral detail: ~110 tokens a record
    middle = [m.format(day=rng.choice(DAYS), colour=rng.choice(COLOURS),
                       month=rng.choice(MONTHS)) for m in middle]
    return " ".join([opener, *middle, closer])


HEADER = ("Customer reviews, one per line: review number, shop, product, customer id and the "
          "customer's own words.\n")


def balanced(rng: random.Random, names: list[Any], n: int) -> list[Any]:
    """``n`` draws made of shuffled rounds of every name, so that in any prefix (the records
    that fit the length) every name appears equally often, +-1."""
    out: list[Any] = []
    while len(out) < n:
        block = list(names)
        rng.shuffle(block)
        out += block
    return out[:n]


def make_reviews(rng: random.Random, length_tokens: int, split: str, *, n_shops: int = 6,
                 n_products: int = 6, n_customers: int | None = None,
                 shop_rates: list[float] | None = None, product_rates: list[float] | None = None,
                 customer_rates: list[float] | None = None) -> Reviews:
    """Records filling about ``length_tokens`` tokens. A record is a complaint with the mean of
    the hidden rates given for its shop, product and customer (the i-th rate goes to the i-th
    name in sorted order; 0.5 when none is given); shops, products and
    customers each appear about equally often, so how often a name occurs says nothing about
    how many complaints it got."""
    budget = length_tokens * CHARS_PER_TOKEN - len(HEADER)
    shop_names = sorted(rng.sample(halves(SHOPS)[split], n_shops))
    product_names = sorted(rng.sample(halves(PRODUCTS)[split], n_products))
    # estimate the record count (~460 chars a record) and fill to the budget
    est = max(8, budget // 460)
    n_cust = n_customers or max(8, est // 8)
    customer_ids = sorted(rng.sample(range(10_000, 100_000), n_cust))
    lines: list[str] = []
    shops: list[str] = []
    products: list[str] = []
    customers: list[int] = []
    labels: list[str] = []
    shop_seq = balanced(rng, shop_names, est * 2)
    prod_seq = balanced(rng, product_names, est * 2)
    cust_seq = balanced(rng, customer_ids, est * 2)
    review_nos = rng.sample(range(1000, 10_000), est * 2)
    used = 0
    for i in range(est * 2):
        shop, product, cust = shop_seq[i], prod_seq[i], cust_seq[i]
        ps = [r[names.index(x)] for r, names, x in
              ((shop_rates, shop_names, shop), (product_rates, product_names, product),
               (customer_rates, customer_ids, cust)) if r is not None]
        p = sum(ps) / len(ps) if ps else 0.5
        label = "complaint" if rng.random() < p else "praise"
        line = (f"Review {review_nos[i]} | Shop: {shop} | Product: {product} | Customer: {cust} "
                f"| Text: {review_text(rng, label, product, split)}")
        if used + len(line) + 1 > budget and lines:
            break
        lines.append(line)
        shops.append(shop)
        products.append(product)
        customers.append(cust)
        labels.append(label)
        used += len(line) + 1
    return Reviews(lines, shops, products, customers, labels, shop_names, product_names,
                   customer_ids, HEADER)
