"""The demo case: a natural question about one incident buried in a long archive of real text.

The archive is real encyclopedic text (the bench corpora: Wikipedia summaries shipped in a PyPI
package, or the Python standard library's docs as a fallback), several times the local model's
window, with one long maintenance report inserted at a seeded depth. The facts of the report
(site, cause, who fixed it) are drawn from seeded lists, so no model knows them beforehand. The
report is longer than the REPL output a turn may print, so reading it whole is a job for a
sub-model: the natural way is to search for the site's name, then `llm_query` on what was found.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

SITES = ["Harrow Valley Observatory", "Kestrel Point Lighthouse", "Brannock Water Works",
         "Ollander Seed Vault", "Tamsin Ridge Weather Station", "Corvel Street Library"]
CAUSES = [("squirrel", "a family of squirrels had chewed through the main feeder cable"),
          ("frost", "frost had cracked the casing of the transformer and let water in"),
          ("lightning", "a lightning strike had fused the breaker on the north panel"),
          ("flood", "flood water had reached the basement switchgear"),
          ("rat", "rats had nested inside the generator and gnawed its wiring")]
FIXERS = ["Ilse Marrow", "Tomas Quill", "Wren Adebayo", "Priya Halvorsen", "Dario Fenwick"]
RED_HERRINGS = ["a faulty fuse in the visitor centre", "an overloaded heater in the archive room",
                "a software fault in the control computer", "a loose plug in the kitchen"]


@dataclass(frozen=True)
class Case:
    context: str
    query: str
    site: str
    cause_word: str
    fixer: str

    def check(self, answer: str) -> bool:
        """Right when the answer names the real cause and the person who fixed it, as whole
        words, and no other cause or person (a hedge listing every suspect is wrong), and is an
        answer rather than a pasted passage (the bench's strict scoring rules)."""
        return names_only(answer, self.cause_word, [w for w, _ in CAUSES], self.fixer, FIXERS)


def names_only(answer: str, cause_word: str, cause_words: list[str], fixer: str,
               people: list[str]) -> bool:
    """The demos' strict judge: the answer names `cause_word` and `fixer`'s surname as whole
    words, no other of `cause_words` or `people`, and is not a pasted passage."""
    from recursa.bench.tasks.strict import is_dump, mentioned
    if is_dump(answer, max_words=60):
        return False
    forms = {f: w for w in cause_words for f in (w, w + "s")}   # 'rat' and 'rats'
    causes = {forms[f] for f in mentioned(answer, list(forms))}
    named = set(mentioned(answer, sorted({n.split()[-1] for n in people})))
    return causes == {cause_word} and named == {fixer.split()[-1]}


def _report(rng: random.Random, site: str, cause: str, fixer: str) -> str:
    guesses = rng.sample(RED_HERRINGS, 3)
    others = rng.sample([f for f in FIXERS if f != fixer], 2)
    day = rng.randrange(2, 27)
    return "\n".join([
        f"MAINTENANCE REPORT - power outage at the {site}",
        f"On the night of the {day}th the {site} lost all power at 02:14. The night guard "
        f"logged the outage and called the duty engineer, {others[0]}, who arrived within the "
        "hour and began by checking the obvious suspects.",
        f"The first suspicion was {guesses[0]}, but that was not the cause: the power stayed "
        f"off. {others[0]} next examined {guesses[1]}, which was not the cause either. "
        f"The morning shift under {others[1]} suspected {guesses[2]} and spent most of the "
        "day testing it without result. Several staff members wrote to the board about the "
        "cold and the lost observations, and a temporary generator was hired for the week.",
        "Timeline of the tests: at 03:05 the fuse board in the entrance hall was opened and "
        "every fuse checked with a meter; at 04:40 the emergency lighting was found to be "
        "running on its own batteries; at 07:30 the control computer was restarted twice; at "
        "09:15 the heating contractor was called about the boiler room; at 11:50 the phone "
        "company confirmed that their line was live; at 14:20 the insurance office was told; "
        "at 16:00 the staff were sent home and the doors were locked for the night.",
        "On the second day the team repeated the checks with a borrowed tester, opened the "
        "cable trench beside the car park without finding any damage, and asked the regional "
        "supplier for the records of the substation. The supplier reported no fault on their "
        "side of the meter, which meant the problem was somewhere inside the site itself.",
        f"On the third day the contractor {fixer} traced the cables from the substation and "
        f"found the real cause: {cause}. {fixer} replaced the damaged section, tested every "
        "circuit and restored power that evening. The board thanked the contractor and asked "
        "for a yearly inspection of the site's supply.",
        "Costs: the hired generator, two days of overtime and the replacement parts were "
        "charged to the maintenance budget. Lessons: inspect the supply route first, keep a "
        "spare breaker on site, and record every test in the log book, including the ones "
        "that find nothing.",
    ])


def make_case(seed: int = 0, chars: int = 260_000) -> Case:
    """A context of about `chars` characters (4 characters ~ 1 token) and its question."""
    from recursa.bench.corpora import filler_text, get_corpus
    rng = random.Random(seed)
    site = rng.choice(SITES)
    cause_word, cause = rng.choice(CAUSES)
    fixer = rng.choice(FIXERS)
    report = _report(rng, site, cause, fixer)
    hay = filler_text(get_corpus(), chars - len(report), rng)
    # insert at a paragraph boundary at a seeded depth between 20% and 80%
    cut = hay.find("\n\n", int(len(hay) * rng.uniform(0.2, 0.8)))
    cut = len(hay) if cut < 0 else cut
    text = hay[:cut] + "\n\n" + report + hay[cut:]
    query = f"What caused the power outage at the {site}, and who fixed it?"
    return Case(context=text, query=query, site=site, cause_word=cause_word, fixer=fixer)


def mentions(text: str, word: str) -> int:
    return len(re.findall(re.escape(word), text, flags=re.I))
