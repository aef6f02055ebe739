"""Two-hop lookup: the answer of the first lookup is the key of the second, far apart.

"Orla Vance was given locker 4471." sits in one part of the text and "Locker 4471 turned out to
hold a brass telescope." in another; the question asks what Orla Vance's locker holds. The
question's rare words (the person's name) find only the first hop, which does not contain the
answer; the second hop shares no word with the question but the number. Other people's chains
of the same shape, and second hops for numbers close to the right one, sit in the text too.
"""

from __future__ import annotations

from typing import Any

from ._hay import haystack, spread
from ._words import FIRST_NAMES
from .base import Instance, Score, Task
from .split import halves, pick, split_corpus, start
from .strict import strict_choice

SURNAMES = (
    "Vance Holloway Okafor Lindqvist Marchetti Brennan Castellanos Duarte Ellery Fairweather "
    "Gallagher Hargreave Ibarra Jansen Kowalczyk Lachance Moreau Nakagawa Oyelaran Pellegrini "
    "Quennell Rasmussen Szabo Thorne Underhill Valdivia Whitlock Yilmaz Zamora Achterberg"
).split()
ITEMS = [
    "a brass telescope", "a jar of buttons", "a folded parachute", "a violin case",
    "a box of seashells", "a rusty lantern", "a stack of postcards", "a wooden chess set",
    "a pair of ice skates", "a silver teapot", "a model sailing ship", "a bundle of maps",
    "a typewriter", "a birdcage", "a crate of lemons", "a fencing mask", "a tin of marbles",
    "a quilted blanket", "a pocket watch", "a set of paintbrushes", "a cactus in a pot",
    "a stuffed owl", "a tuba", "a roll of canvas", "a box of candles", "a kite",
    "a sewing machine", "a cricket bat", "a snow globe", "a coil of rope", "a globe",
    "a tool belt", "a bag of coffee beans", "a harmonica", "a rocking horse", "a microscope",
]
CONTAINERS = ["locker", "mailbox", "storage unit", "cabin", "desk drawer", "crate"]
# (first hop, second hop) phrasings; {c} container, {n} its number, {who}, {item}
HOPS = {
    "test": [
        ("{who} was given {c} {n}.", "{C} {n} turned out to hold {item}."),
        ("The key to {c} {n} went to {who}.", "When {c} {n} was opened, it held {item}."),
        ("{who} signed for {c} {n} on arrival.", "Inside {c} {n} the porter found {item}."),
    ],
    "dev": [
        ("{C} {n} is the one assigned to {who}.", "The inventory of {c} {n} lists {item}."),
        ("{who} rents {c} {n}.", "Someone had left {item} in {c} {n}."),
    ],
}
QUESTIONS = {
    "test": ["What is kept in the {c} of {who}?", "What would you find in {who}'s {c}?"],
    "dev": ["What does the {c} belonging to {who} contain?"],
}


def item_name(item: str) -> str:
    """'a jar of buttons' -> 'jar of buttons' (the form answers are matched in)."""
    return item.split(" ", 1)[1] if item.startswith(("a ", "an ")) else item


class TwoHop(Task):
    name = "two_hop"
    answer_kinds = ("choice",)
    complexity = "constant"
    description = ("Follow a person to a numbered container, then the container to its "
                   "contents; the two facts are far apart, among other chains.")
    default_length = 2**14

    def generate(self, seed: int = 0, length_tokens: int | None = None, *,
                 split: str | None = None, n_chains: int | None = None, **_: Any) -> Instance:
        split, length, rng, inst_id = start(self, seed, length_tokens, split)
        items = halves(ITEMS)[split]
        container = rng.choice(CONTAINERS)
        n = n_chains if n_chains is not None else max(6, min(14, length // 2048))
        firsts = rng.sample(halves(FIRST_NAMES)[split], min(n, len(halves(FIRST_NAMES)[split])))
        people = [f"{f} {s}" for f, s in zip(firsts, rng.sample(SURNAMES, len(firsts)),
                                                 strict=False)]
        n = len(people)
        numbers = rng.sample(range(1000, 9999), n)
        chosen_items = rng.sample(items, n + 2)
        frames = list(pick(HOPS, split))
        inserts: list[tuple[float, str]] = []
        chains: list[dict[str, Any]] = []
        # first hops in one half, second hops in the other, so each answer is far from its key
        first_half = rng.random() < 0.5
        d1 = spread(rng, n, 0.02, 0.45)
        d2 = spread(rng, n, 0.55, 0.98)
        if not first_half:
            d1, d2 = d2, d1
        for i, (who, num, item) in enumerate(zip(people, numbers, chosen_items, strict=False)):
            h1, h2 = rng.choice(frames)
            fill = {"c": container, "C": container.capitalize(), "n": num, "who": who,
                    "item": item}
            inserts.append((d1[i], h1.format(**fill)))
            inserts.append((d2[i], h2.format(**fill)))
            chains.append({"who": who, "number": num, "item": item})
        # second hops for numbers one digit away from the asked one (misread traps)
        target = chains[0]
        for item in chosen_items[n:]:
            # the digits reversed, or one off in the last two places
            near = (int(str(target["number"])[::-1]) if rng.random() < 0.5
                    else target["number"] + rng.choice((-1, 1, 10, -10)))
            while near in numbers or not 1000 <= near <= 9999:
                near = rng.randrange(1000, 9999)
            numbers.append(near)
            h2 = rng.choice(frames)[1]
            inserts.append((rng.random(), h2.format(c=container, C=container.capitalize(),
                                                    n=near, item=item)))
        corpus = split_corpus(None, split)
        context = haystack(rng, corpus, length, inserts)
        query = rng.choice(pick(QUESTIONS, split)).format(c=container, who=target["who"]) + \
            " Answer with the object only."
        candidates = sorted(item_name(x) for x in chosen_items)
        return Instance(
            id=inst_id, task=self.name, query=query,
            context=context, gold=item_name(target["item"]),
            meta={"split": split, "chains": chains, "container": container,
                  "candidates": candidates, "corpus": corpus.name,
                  "corpus_source": corpus.source,
                  "answer_shape": {"kind": "choice", "choices": candidates}},
            length_tokens=length)

    def score(self, prediction: str, inst: Instance) -> Score:
        return strict_choice(prediction, str(inst.gold), inst.meta["candidates"])
