"""The demo case: a question, worded as a user would, about one incident among several in a long
archive of real text, asked in words the incident's report never uses.

The archive is real encyclopedic text (the bench corpora) several times the local model's window,
with five maintenance reports inserted at seeded depths: a loss of power and four other
incidents (a burst pipe, a failed boiler, a jammed lift, a leaking roof) of the same shape, each
with its own site, cause, contractor and red herrings. The question ("the blackout", "the
electricity") shares no content word with the power report, so searching for the question's
words finds nothing useful (the grep baseline shows it); the five reports name five contractors
and each lists suspected causes that were not the cause, so an answer listing candidates is a
hedge and is scored wrong. Finding the report needs search by meaning; reading it needs a
sub-model. (The duty engineer and the morning shift are not named: with their names in the
report, the 1.5B named the first person mentioned on 6 of 6 dev seeds, not the one who fixed it.)

Seeds are split: below 1000 dev (prompts, examples, tips and the plans' settings were tuned on
them), 1000 and above test (the demo and its test). The facts are drawn from seeded lists, so no model knows them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

TEST_SEEDS_FROM = 1000

SITES = ["Harrow Valley Observatory", "Kestrel Point Lighthouse", "Brannock Water Works",
         "Ollander Seed Vault", "Tamsin Ridge Weather Station", "Corvel Street Library",
         "Pelling Marsh Pumping House", "Ashgrove Botanical Garden"]
FIXERS = ["Ilse Marrow", "Tomas Quill", "Wren Adebayo", "Priya Halvorsen", "Dario Fenwick",
          "Nadia Okonkwo", "Callum Strand", "Mirela Vos", "Jonas Pike", "Esme Thorne"]
# The power incident: (the cause's word, how the report states it). The report says "power" and
# "supply"; the question says "blackout" and "electricity", which no report uses.
CAUSES = [("squirrel", "a family of squirrels had chewed through the main feeder cable"),
          ("frost", "frost had cracked the casing of the transformer and let water in"),
          ("lightning", "a lightning strike had fused the breaker on the north panel"),
          ("flood", "flood water had reached the basement switchgear"),
          ("rat", "rats had nested inside the generator and gnawed its wiring")]
OTHER_INCIDENTS = [
    ("burst pipe", "the water supply to the east wing failed",
     [("corrosion", "corrosion had eaten through a joint in the riser pipe"),
      ("root", "tree roots had cracked the main pipe under the lawn")]),
    ("boiler failure", "the heating stopped in every room",
     [("soot", "soot had blocked the boiler's flue and tripped its safety cut-out"),
      ("pump", "the circulation pump had seized after years without grease")]),
    ("lift breakdown", "the goods lift stopped between two floors",
     [("hoist", "a frayed hoist cable had tripped the overspeed governor"),
      ("door", "a bent landing door had left the safety circuit open")]),
    ("roof leak", "rain came through the ceiling of the reading room",
     [("slate", "a storm had lifted a row of slates above the gutter"),
      ("leaves", "leaves had blocked the gutter and water ran under the flashing")]),
]
RED_HERRINGS = ["a faulty fuse in the visitor centre", "an overloaded heater in the archive room",
                "a software fault in the control computer", "a loose plug in the kitchen",
                "a worn seal on the service hatch", "a cracked tile above the entrance"]

QUERY = ("When the blackout hit, who got the electricity running again, and what had knocked it "
         "out?")


@dataclass(frozen=True)
class Case:
    context: str
    query: str
    site: str
    cause_word: str
    fixer: str
    cause: str = ""                    # the report's sentence for the cause
    others: tuple[str, ...] = field(default=())   # the other reports' cause words

    def check(self, answer: str) -> bool:
        """Right when the answer names the real cause and the person who fixed it, as whole
        words, and no other cause or person (a hedge listing suspects is wrong), and is an
        answer rather than a pasted passage (the bench's strict scoring rules)."""
        from recursa.demos.outage import names_only
        others = [w for w in self.others if w not in self.cause.lower()]
        return names_only(answer, self.cause_word, [w for w, _ in CAUSES] + others, self.fixer,
                          FIXERS)

    def grep_answer(self) -> str:
        """What the no-model grep baseline answers: the sentence holding the query's rarest
        words (the bench's `grep` baseline)."""
        from recursa.bench.baselines import grep_answer
        return grep_answer(self.query, self.context)


def _report(rng: random.Random, title: str, site: str, what: str, cause: str,
            fixer: str) -> str:
    guesses = rng.sample(RED_HERRINGS, 3)
    day = rng.randrange(2, 27)
    return "\n".join([
        f"MAINTENANCE REPORT - {title} at the {site}",
        f"On the night of the {day}th, at the {site}, {what}. The night guard logged it and "
        "called the duty engineer, who arrived within the hour and began by checking the "
        "obvious suspects.",
        f"The first suspicion was {guesses[0]}, but that was not the cause. The engineer next "
        f"examined {guesses[1]}, which was not the cause either. The morning shift suspected "
        f"{guesses[2]} and spent most of the day testing it without result. Several staff "
        "members wrote to the board about the disruption.",
        "On the second day the team repeated the checks with borrowed tools, opened the "
        "service trench beside the car park without finding any damage, and asked the "
        "regional supplier for their records, which showed no fault on their side.",
        f"On the third day the contractor {fixer} traced the problem and found the real cause: "
        f"{cause}. {fixer} replaced the damaged part, tested everything and put it right that "
        "evening. The board thanked the contractor and asked for a yearly inspection.",
        "Costs: two days of overtime and the replacement parts were charged to the "
        "maintenance budget. Lessons: inspect the whole route first, keep spare parts on site, "
        "and record every test in the log book, including the ones that find nothing.",
    ])


def make_case(seed: int = TEST_SEEDS_FROM, chars: int = 260_000) -> Case:
    """A context of about `chars` characters (4 characters ~ 1 token) and its question."""
    from recursa.bench.corpora import filler_text, get_corpus
    rng = random.Random(f"demo:{seed}")
    sites = rng.sample(SITES, 5)
    fixers = rng.sample(FIXERS, 5)
    cause_word, cause = rng.choice(CAUSES)
    reports = [_report(rng, "loss of power", sites[0], "power was lost across the whole site",
                       cause, fixers[0])]
    others = []
    for i, (title, what, causes) in enumerate(rng.sample(OTHER_INCIDENTS, 4), start=1):
        word, text = rng.choice(causes)
        others.append(word)
        reports.append(_report(rng, title, sites[i], what, text, fixers[i]))
    rng.shuffle(reports)
    hay = filler_text(get_corpus(), chars - sum(len(r) + 2 for r in reports), rng)
    pieces, last = [], 0
    for frac, rep in zip(sorted(rng.uniform(0.05, 0.95) for _ in reports), reports, strict=True):
        cut = hay.find("\n\n", max(last, int(len(hay) * frac)))   # at a paragraph boundary
        cut = len(hay) if cut < 0 else cut
        pieces += [hay[last:cut], "\n\n" + rep]
        last = cut
    pieces.append(hay[last:])
    return Case(context="".join(pieces), query=QUERY, site=sites[0], cause_word=cause_word,
                fixer=fixers[0], cause=cause, others=tuple(others))
