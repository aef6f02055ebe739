"""Keyword lexicons of the `lexicon` baseline for "what kind of thing does this definition
describe" (real_wordnet_*): a few dozen common words per kind.

Written from general knowledge of how dictionaries word definitions, BEFORE any test record
was read and without WordNet's own category files or hypernyms; not tuned on test records
(their per-record accuracy on the dev half is measured and documented in docs/bench/README.md).
A definition is labelled with the kind whose words it holds most (whole words, case-insensitive;
ties to the kind listed first), and "other" when it holds none.
"""

from __future__ import annotations

import re

KIND_KEYWORDS: dict[str, tuple[str, ...]] = {
    "noun.animal": (
        "animal", "animals", "mammal", "mammals", "bird", "birds", "fish", "fishes", "insect",
        "insects", "reptile", "amphibian", "beetle", "moth", "butterfly", "snake", "lizard",
        "frog", "toad", "dog", "dogs", "cat", "horse", "cattle", "sheep", "goat", "deer",
        "antelope", "monkey", "ape", "rodent", "rat", "mouse", "squirrel", "bat", "whale",
        "dolphin", "shark", "crab", "shrimp", "mollusk", "snail", "worm", "spider", "parrot",
        "duck", "hawk", "eagle", "owl", "songbird", "larva", "larvae", "feathers", "plumage",
        "fur", "hooves", "prey", "predator", "breed", "wings", "tail", "beak", "bill", "fins",
    ),
    "noun.plant": (
        "plant", "plants", "tree", "trees", "shrub", "shrubs", "herb", "herbs", "vine", "vines",
        "flower", "flowers", "flowering", "leaves", "leaf", "foliage", "petals", "stem",
        "stems", "roots", "fern", "moss", "grass", "grasses", "bulb", "bulbs", "shoots",
        "blooms", "shrubby", "perennial", "annual", "evergreen", "deciduous", "weed", "cactus",
        "orchid", "lily", "palm", "fungus", "fungi", "mushroom", "algae", "seaweed", "bark",
        "blossoms", "cultivated", "botanical", "fronds", "twigs",
    ),
    "noun.food": (
        "food", "foods", "dish", "dishes", "cooked", "baked", "fried", "roasted", "boiled",
        "served", "sauce", "soup", "bread", "cake", "cookie", "pie", "pastry", "dessert",
        "meat", "beef", "pork", "chicken", "lamb", "veal", "cheese", "butter", "cream", "milk",
        "sugar", "flour", "dough", "eaten", "edible", "eat", "drink", "beverage", "wine",
        "beer", "liquor", "whiskey", "juice", "tea", "coffee", "flavored", "salad", "stew",
        "sandwich", "vegetable", "vegetables", "spice", "seasoning", "candy", "chocolate",
        "pudding", "rice", "pasta", "noodles", "eggs", "cocktail", "gin", "rum", "brandy",
        "vodka", "syrup", "filling", "sliced", "chopped", "stuffed", "topped",
    ),
    "noun.person": (
        "person", "someone", "somebody", "man", "woman", "men", "women", "child", "children",
        "boy", "girl", "who", "member", "worker", "expert", "specialist", "official", "leader",
        "player", "writer", "author", "artist", "musician", "singer", "actor", "actress",
        "soldier", "officer", "king", "queen", "priest", "follower", "advocate", "supporter",
        "inhabitant", "native", "citizen", "owner", "employee", "student", "teacher",
        "physician", "lawyer", "politician", "philosopher", "scientist", "painter", "poet",
        "composer", "novelist", "statesman", "wife", "husband", "mother", "father", "son",
        "daughter", "dramatist", "explorer", "inventor", "president",
    ),
}
OTHER = "other"
_SETS = {k: frozenset(v) for k, v in KIND_KEYWORDS.items()}
_WORD = re.compile(r"[a-z]+")


def keyword_kind(text: str) -> str:
    """The kind whose keywords ``text`` holds most, or "other"."""
    words = _WORD.findall(text.lower())
    best, best_n = OTHER, 0
    for kind, keys in _SETS.items():
        n = sum(w in keys for w in words)
        if n > best_n:
            best, best_n = kind, n
    return best
