"""Rebuild src/recursa/bench/data/wordnet/records.jsonl.gz from Debian's wordnet-base=1:3.0-37.

From usr/share/wordnet/data.noun (WordNet 3.0, Princeton University; licence in NOTICE): each
synset's gloss (the text after "|", without its example sentences in quotes) is a record, and the
lexicographer file its synset was filed in (field 2, a number, named by the standard lexnames
list below, as in WordNet's lexnames(5WN)) is its label. Kept: glosses of 8-60 words from eight
well-separated noun files, at most 500 per file, chosen by the SHA-256 of the synset offset
(deterministic, unrelated to the text), then in offset order. Each record gets its half
(dev / test by a hash of its text, recursa.bench.realdata.split_of).

    python benchmarks/data/rebuild_wordnet.py [--package wordnet-base_1%3a3.0-37_all.deb] [--check]
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile

from _snapshot import package_bytes, parser, write_records

from recursa.bench.realdata import SNAPSHOTS, split_of

URL = "https://deb.debian.org/debian/pool/main/w/wordnet/wordnet-base_3.0-37_all.deb"
DATA_NOUN = "usr/share/wordnet/data.noun"

# WordNet 3.0's lexicographer files, by number (lexnames(5WN))
LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
    "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event",
    "noun.feeling", "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object",
    "noun.person", "noun.phenomenon", "noun.plant", "noun.possession", "noun.process",
    "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition",
    "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather",
    "adj.ppl",
)
KEEP = ("noun.animal", "noun.plant", "noun.food", "noun.person",
        "noun.artifact", "noun.location", "noun.body", "noun.communication")
PER_LABEL = 500
MIN_WORDS, MAX_WORDS = 8, 60


def deb_member(deb: bytes, path: str) -> bytes:
    """One file of a .deb: an ar archive whose data.tar.* holds the files."""
    if not deb.startswith(b"!<arch>\n"):
        raise SystemExit("not a .deb (ar) archive")
    pos = 8
    while pos + 60 <= len(deb):
        header = deb[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = deb[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                f = tar.extractfile("./" + path)
                if f is None:
                    raise SystemExit(f"{path} missing from the package")
                return f.read()
        pos += 60 + size + (size % 2)
    raise SystemExit("no data.tar.* in the package")


def gloss_definition(gloss: str) -> str:
    """The definition part of a gloss: before the first quoted example sentence."""
    text = re.split(r';?\s*"', gloss, maxsplit=1)[0]
    return " ".join(text.split()).rstrip(";").strip()


def build(deb: bytes) -> list[dict[str, object]]:
    candidates: dict[str, list[tuple[str, str, str]]] = {k: [] for k in KEEP}
    for line in deb_member(deb, DATA_NOUN).decode("utf-8").splitlines():
        if line.startswith("  ") or "|" not in line:
            continue            # the licence header
        head, _, gloss = line.partition("|")
        fields = head.split()
        offset, lex, lemma = fields[0], LEXNAMES[int(fields[1])], fields[4]
        text = gloss_definition(gloss)
        if lex in candidates and MIN_WORDS <= len(text.split()) <= MAX_WORDS:
            candidates[lex].append((offset, lemma.replace("_", " "), text))
    rows: list[dict[str, object]] = []
    for lex in KEEP:
        ranked = sorted(candidates[lex],
                        key=lambda c: hashlib.sha256(c[0].encode()).hexdigest())[:PER_LABEL]
        for offset, lemma, text in sorted(ranked):
            rows.append({"id": f"n{offset}", "source": lemma, "text": text, "label": lex,
                         "split": split_of(text)})
    rows.sort(key=lambda r: str(r["id"]))
    return rows


def main() -> None:
    a = parser(__doc__).parse_args()
    write_records("wordnet", build(package_bytes(URL, SNAPSHOTS["wordnet"].source_sha256,
                                                 a.package)), a.check)


if __name__ == "__main__":
    main()
