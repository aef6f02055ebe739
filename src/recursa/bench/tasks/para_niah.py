"""Paraphrased retrieval (RULER multi-key / multi-value, reworded): the needle shares no content
word with the question.

The question asks for "the combination for the safe in the physician's office"; the needle says
"The keypad beside the strongbox of the doctor's surgery accepts 4827193." Places, objects and
the sentence frames come in pairs of (question wording, needle wording) with no word in common,
so a grep of the question's words finds nothing of the needle. Near the needle sit distractors of
the same shape that share its place or its object but not both ("... strongbox of the vet's
clinic accepts ..."), and the haystack carries many more 7-digit numbers in filing notes, so no
regex of the answer's shape can pick the right one.

``para_niah``: one value for the asked key among many keys (multi-key).
``para_niah_mv``: the asked key has 2-4 values stated in separate needles; the answer lists them
all, scored by F1 (a list of every 7-digit number in the text earns almost no precision).
"""

from __future__ import annotations

from typing import Any

from ._hay import haystack, spread
from .base import Instance, Score, Task
from .split import halves, pick, split_corpus, start
from .strict import strict_digits, strict_set

# (question wording, needle wording): no content word shared within a pair or across the lists'
# two sides (tests check it).
PLACES = [
    ("the physician's office", "the doctor's surgery"),
    ("the harbour master's building", "the port captain's hut"),
    ("the railway station", "the train depot"),
    ("the town hall", "the municipal chambers"),
    ("the public library", "the lending archive"),
    ("the primary school", "the elementary academy"),
    ("the bakery", "the bread shop"),
    ("the hospital", "the infirmary"),
    ("the chapel", "the little church"),
    ("the butcher's", "the meat market"),
    ("the cinema", "the movie theatre"),
    ("the pharmacy", "the chemist's counter"),
    ("the post office", "the mail depot"),
    ("the museum", "the heritage gallery"),
    ("the airport", "the aerodrome"),
    ("the prison", "the jail"),
    ("the vineyard", "the wine estate"),
    ("the lighthouse", "the coastal beacon tower"),
    ("the police precinct", "the constabulary"),
    ("the veterinary clinic", "the animal surgery"),
    ("the courthouse", "the tribunal"),
]
OBJECTS = [
    ("safe", "strongbox"),
    ("storeroom", "supply closet"),
    ("back gate", "rear entrance"),
    ("filing cabinet", "document drawer"),
    ("alarm panel", "security console"),
    ("basement", "cellar"),
    ("bike shed", "cycle shelter"),
    ("medicine cabinet", "drug cupboard"),
    ("roof hatch", "attic trapdoor"),
    ("locker room", "changing area"),
    ("server room", "computer cubicle"),
    ("tool chest", "equipment trunk"),
    ("garage", "carport"),
    ("vault", "strongroom"),
    ("darkroom", "photo lab"),
]
QUESTIONS = {
    "test": [
        "Which number opens the {o} at {p}?",
        "What is the combination for the {o} in {p}?",
        "What must someone type to unlock the {o} at {p}?",
    ],
    "dev": [
        "What code gets a person into the {o} at {p}?",
        "Tell me the digits that open the {o} in {p}.",
    ],
}
QUESTIONS_MV = {
    "test": [
        "Several numbers open the {o} at {p}. Which are they? List them all.",
        "There is more than one combination for the {o} in {p}. List every one.",
    ],
    "dev": [
        "Several codes get a person into the {o} at {p}. Tell me all of them.",
    ],
}
NEEDLES = {
    "test": [
        "Staff at {p} reach the {o} by entering {v} on the keypad.",
        "The keypad beside the {o} of {p} accepts {v}.",
        "Remember that {v} releases the {o} at {p}.",
    ],
    "dev": [
        "Whoever needs the {o} at {p} punches in {v}.",
        "The {o} in {p} swings free once {v} is keyed.",
    ],
}
# Filing notes: many more 7-digit numbers in the text, none of them an answer.
NOISE = {
    "test": [
        "This entry is filed under record {v}.",
        "Archive reference {v} covers this material.",
        "See catalogue item {v} for the source.",
        "Ledger line {v} lists this account.",
    ],
    "dev": [
        "Index card {v} holds this note.",
        "This passage was transcribed as document {v}.",
    ],
}
ANSWER_SUFFIX = " Answer with the number only."
ANSWER_SUFFIX_MV = " Answer with the numbers only."


def _parts(split: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    return halves(PLACES)[split], halves(OBJECTS)[split]


class ParaNIAH(Task):
    name = "para_niah"
    answer_kinds = ("digits",)
    complexity = "constant"
    description = ("Find a 7-digit code whose needle is worded unlike the question, among "
                   "same-shaped distractors and many 7-digit numbers (multi-key).")
    default_length = 2**14
    multi_value = False

    def generate(self, seed: int = 0, length_tokens: int | None = None, *,
                 split: str | None = None, n_distractors: int | None = None,
                 **_: Any) -> Instance:
        split, length, rng, inst_id = start(self, seed, length_tokens, split)
        places, objects = _parts(split)
        (pq, pn), (oq, on) = rng.choice(places), rng.choice(objects)
        used_values: set[str] = set()

        def value() -> str:
            while True:
                v = str(rng.randrange(1_000_000, 10_000_000))
                if v not in used_values:
                    used_values.add(v)
                    return v

        n_values = rng.randint(2, 4) if self.multi_value else 1
        frames = list(pick(NEEDLES, split))
        gold = [value() for _ in range(n_values)]
        needles = [rng.choice(frames).format(p=pn, o=on, v=v) for v in gold]
        # distractors share the place or the object with the asked key, never both
        n_dis = n_distractors if n_distractors is not None else max(6, min(16, length // 2048))
        distractors = []
        for i in range(n_dis):
            if i % 2 == 0:
                o2 = rng.choice([o for o in objects if o[1] != on])[1]
                key = (pn, o2)
            else:
                p2 = rng.choice([p for p in places if p[1] != pn])[1]
                key = (p2, on)
            distractors.append(rng.choice(frames).format(p=key[0], o=key[1], v=value()))
        noise_frames = list(pick(NOISE, split))
        n_noise = max(40, length // 200)
        noise = [rng.choice(noise_frames).format(v=value()) for _ in range(n_noise)]
        # needles in the middle 80%; distractors within +-6% of a needle; noise anywhere
        needle_depths = spread(rng, n_values, 0.1, 0.9)
        inserts = list(zip(needle_depths, needles, strict=True))
        for i, d in enumerate(distractors):
            base = needle_depths[i % n_values]
            inserts.append((min(0.99, max(0.0, base + rng.uniform(-0.06, 0.06))), d))
        inserts += [(rng.random(), s) for s in noise]
        rng.shuffle(inserts)     # order within a paragraph: not always needle first
        corpus = split_corpus(None, split)
        context = haystack(rng, corpus, length, inserts)
        qframes = pick(QUESTIONS_MV if self.multi_value else QUESTIONS, split)
        query = rng.choice(qframes).format(o=oq, p=pq) + (
            ANSWER_SUFFIX_MV if self.multi_value else ANSWER_SUFFIX)
        return Instance(
            id=inst_id, task=self.name, query=query,
            context=context, gold=gold if self.multi_value else gold[0],
            meta={"split": split, "needles": needles, "distractors": distractors,
                  "depths": needle_depths, "key_question": [pq, oq], "key_needle": [pn, on],
                  "n_values_in_text": len(used_values), "corpus": corpus.name,
                  "corpus_source": corpus.source,
                  "answer_shape": {"kind": "digits_set" if self.multi_value else "digits",
                                   "n": 7}},
            length_tokens=length)

    def score(self, prediction: str, inst: Instance) -> Score:
        if self.multi_value:
            return strict_set(prediction, list(inst.gold), n_digits=7)
        return strict_digits(prediction, str(inst.gold))


class ParaNIAHMultiValue(ParaNIAH):
    name = "para_niah_mv"
    answer_kinds = ("digits_set",)
    description = ("List every 7-digit code of a key stated in 2-4 needles worded unlike the "
                   "question (multi-value); F1 over the codes.")
    multi_value = True
