"""BrowseComp-Plus-style multi-hop retrieval over a ~1,000-document corpus.

A fictional chain (artifact -> inventor -> birthplace -> organisation seated there -> founding
year) is spread over 3 evidence documents, among hard negatives that reuse the same surnames,
town names and organisation names with different attributes. Filler documents are real text."""

from __future__ import annotations

import random
from typing import Any

from ..corpora import Corpus, get_corpus
from ._words import ADJECTIVES, FIRST_NAMES, NOUNS, SYLLABLES
from .base import CHARS_PER_TOKEN, Instance, Score, Task, match_choice

_TOWN_SUFFIX = ("by", "ton", "ford", "wick", "holm", "stead", "mouth")
_REGIONS = ("Northern Marches", "Coastal Reach", "Upper Vale", "Eastern Fens", "Western Downs",
            "Lake District of Orm", "Southern Steppe")
_ORG_KINDS = ("Society", "Guild", "Institute", "Academy", "Company")
_DEVICES = ("engine", "loom", "compass", "press", "clock", "furnace", "telescope")


def _word(rng: random.Random, n: int = 2) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(n)).capitalize()


def _body(rng: random.Random, corpus: Corpus, n_chars: int) -> tuple[str, str]:
    """(title, text of exactly n_chars) from real paragraphs starting at a random one."""
    idx = rng.randrange(len(corpus.paragraphs))
    title = corpus.titles[idx] if corpus.titles else f"Note {idx}"
    parts, total, i = [], 0, idx
    while total < n_chars:
        p = corpus.paragraphs[i % len(corpus.paragraphs)]
        parts.append(p)
        total += len(p) + 1
        i += 1
    text = " ".join(parts)[:n_chars]
    sp = text.rfind(" ", max(0, n_chars - 40))
    if sp > 0:
        text = text[:sp] + "." + " " * (n_chars - sp - 1)
    return title, text


class BrowseComp(Task):
    name = "browsecomp"
    answer_kinds = ("digits", "choice")
    complexity = "n/a (multi-hop retrieval)"
    description = "Answer a 2-3 hop question from ~1,000 documents with hard negatives."
    default_length = 200_000

    def generate(
        self,
        seed: int = 0,
        length_tokens: int | None = None,
        *,
        n_docs: int | None = None,
        hops: int | None = None,
        corpus: str | None = None,
        **_: Any,
    ) -> Instance:
        length = int(length_tokens or self.default_length)
        rng = self.rng(seed, length, n_docs or "", hops or "")
        corp = get_corpus(corpus)
        hops = hops or rng.choice((2, 3))
        if hops not in (2, 3):
            raise ValueError("hops must be 2 or 3")
        # ~1,000 documents as in BrowseComp-Plus, fewer when that would make them tiny.
        n_docs = n_docs or max(20, min(1000, length // 200))

        surname = _word(rng, 3)
        first, first_neg = rng.sample(FIRST_NAMES, 2)
        person, person_neg = f"{first} {surname}", f"{first_neg} {surname}"
        adj, adj_neg = rng.sample(ADJECTIVES, 2)
        noun, device = rng.choice(NOUNS), rng.choice(_DEVICES)
        artifact, artifact_neg = f"the {adj} {noun} {device}", f"the {adj_neg} {noun} {device}"
        town = _word(rng, 2) + rng.choice(_TOWN_SUFFIX)
        region, region_neg = rng.sample(_REGIONS, 2)
        org_stem = f"{rng.choice(ADJECTIVES).capitalize()} {rng.choice(NOUNS).capitalize()}"
        kind, kind_sim, kind_neg = rng.sample(_ORG_KINDS, 3)
        org, org_sim = f"{org_stem} {kind}", f"{org_stem} {kind_sim}"
        org_neg = f"{_word(rng, 2)} {rng.choice(NOUNS).capitalize()} {kind_neg}"
        year, year_neg, year_sim = rng.sample(range(1620, 1900), 3)

        facts = {
            "person": (person, f"{person} is remembered as the maker of {artifact}, first shown "
                       f"to the public after years of trials. {first} {surname} was born in "
                       f"{town}, a town in the {region}."),
            "town": (f"{town} ({region})", f"{town} is a market town in the {region}. It is "
                     f"best known as the seat of the {org}, whose hall stands on the main square."),
            "org": (org, f"The {org} was founded in {year} by a group of local merchants and "
                    "has kept its charter ever since."),
            # hard negatives: same surname / same town name / near-identical organisation name
            "neg_person": (person_neg, f"{person_neg} is remembered as the maker of "
                           f"{artifact_neg}. {first_neg} {surname} was born in {town}, a town in "
                           f"the {region_neg}."),
            "neg_town": (f"{town} ({region_neg})", f"{town} is a small town in the {region_neg}. "
                         f"It is the seat of the {org_neg}."),
            "neg_org": (org_neg, f"The {org_neg} was founded in {year_neg}."),
            "sim_org": (org_sim, f"The {org_sim}, not to be confused with similarly named bodies, "
                        f"was founded in {year_sim} in a distant city."),
        }
        if hops == 3:
            query = (f"The maker of {artifact} was born in a town that is the seat of an "
                     "organisation. In what year was that organisation founded?")
            gold, candidates = str(year), [str(year), str(year_neg), str(year_sim)]
        else:
            query = (f"Which organisation has its seat in the town where the maker of {artifact} "
                     "was born?")
            gold, candidates = org, [org, org_neg, org_sim]

        budget = length * CHARS_PER_TOKEN
        ids = [f"doc-{i:04d}" for i in range(n_docs)]
        slots = rng.sample(range(n_docs), len(facts))
        special: dict[int, tuple[str, str, str]] = {}
        for (role, (title, sentence)), slot in zip(facts.items(), slots, strict=True):
            special[slot] = (role, title, sentence)
        # Evidence documents get real-text padding too, so they are not spotted by length.
        pad = 200
        fixed = sum(len(ids[s]) + len(f"Title: {t}\n\n{txt} ") + pad for s, (_, t, txt) in special.items())
        filler_ids = [i for i in range(n_docs) if i not in special]
        remaining = budget - fixed - sum(len(ids[i]) for i in filler_ids)
        per_doc = max(40, remaining // max(1, len(filler_ids)))
        extra = remaining - per_doc * len(filler_ids)
        docs: dict[str, str] = {}
        roles: dict[str, str] = {}
        for i in range(n_docs):
            if i in special:
                role, title, sentence = special[i]
                _title, padding = _body(rng, corp, pad)   # `_` is the kwargs dict here
                docs[ids[i]] = f"Title: {title}\n\n{sentence} {padding}"
                roles[ids[i]] = role
            else:
                size = per_doc + (1 if extra > 0 else 0)
                extra -= 1
                title, text = _body(rng, corp, max(10, size - 10))
                head = f"Title: {title}\n\n"
                text = text[: max(0, size - len(head))]
                docs[ids[i]] = head + text
        evidence = [d for d, r in roles.items() if r in ("person", "town", "org")]
        if hops == 2:
            evidence = [d for d in evidence if roles[d] != "org"]
        return Instance(
            id=self.make_id(seed, length, n_docs=n_docs, hops=hops),
            task=self.name,
            query=query,
            context=docs,
            gold=gold,
            meta={
                "hops": hops,
                "candidates": candidates,
                "evidence_docids": sorted(evidence),
                "negative_docids": sorted(d for d, r in roles.items() if r.startswith(("neg", "sim"))),
                "roles": roles,
                "entities": {"person": person, "artifact": artifact, "town": town,
                             "region": region, "org": org, "year": year},
                "n_docs": n_docs,
                "corpus": corp.name,
            },
            length_tokens=length,
        )

    def score(self, prediction: str, inst: Instance) -> Score:
        s, parsed = match_choice(prediction, str(inst.gold), list(inst.meta.get("candidates", [])))
        return Score(score=s, metrics={"exact": s}, parsed=parsed)
