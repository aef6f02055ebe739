"""Rebuild src/recursa/bench/data/sentiment/records.jsonl.gz from the npm package sentiment@5.0.2.

The package's test fixtures are the UCI "Sentiment Labelled Sentences" data set (Kotzias et al.,
"From Group to Individual Labels using Deep Features", KDD 2015; CC BY 4.0): 1,000 sentences
each from Amazon, IMDb and Yelp, ``{"text", "class"}`` with class 0 negative and 1 positive, plus
one empty entry per file, which is dropped. Every other record is kept, in file order, with its
site, its label and its half (dev / test by a hash of its text, recursa.bench.realdata.split_of).

    python benchmarks/data/rebuild_sentiment.py [--package sentiment-5.0.2.tgz] [--check]
"""

from __future__ import annotations

import io
import json
import tarfile

from _snapshot import package_bytes, parser, write_records

from recursa.bench.realdata import SNAPSHOTS, split_of

URL = "https://registry.npmjs.org/sentiment/-/sentiment-5.0.2.tgz"
SITES = ("amazon", "imdb", "yelp")
LABELS = {0: "negative", 1: "positive"}


def build(tgz: bytes) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        for site in SITES:
            member = tar.extractfile(f"package/test/fixtures/{site}.json")
            if member is None:
                raise SystemExit(f"{site}.json missing from the package")
            items = json.loads(member.read().decode("utf-8"))
            for i, item in enumerate(items, 1):
                text = " ".join(str(item.get("text") or "").split())
                if not text or item.get("class") not in LABELS:
                    continue          # the one empty entry at the end of each file
                rows.append({"id": f"{site}-{i:04d}", "source": site, "text": text,
                             "label": LABELS[item["class"]], "split": split_of(text)})
    return rows


def main() -> None:
    a = parser(__doc__).parse_args()
    write_records("sentiment", build(package_bytes(URL, SNAPSHOTS["sentiment"].source_sha256,
                                                   a.package)), a.check)


if __name__ == "__main__":
    main()
