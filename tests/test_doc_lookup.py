"""The lookup family over real documents (recursa.bench.tasks.doc_lookup): pinned texts, split
questions, every answer present in its document, strict scoring, and the no-model baselines."""

from __future__ import annotations

import pytest

from recursa.bench import documents
from recursa.bench.baselines import baseline_answer
from recursa.bench.lookup_baselines import sentences
from recursa.bench.record_baselines import applies
from recursa.bench.tasks import SPLIT_FAMILIES, get_task
from recursa.bench.tasks.base import normalize
from recursa.bench.tasks.doc_lookup import LOOKUPS, lookup_for

TASK = get_task("real_doc_lookup")


def test_every_document_is_the_pinned_one_and_longer_than_the_window():
    for name in documents.DOCUMENTS:
        text = documents.document(name)
        assert len(text) // 4 > 2048, name          # every lookup needs more than one window


def test_a_changed_document_fails_loudly(tmp_path, monkeypatch):
    (tmp_path / "documents").mkdir()
    (tmp_path / "documents" / "GPL-3.txt").write_text("not the licence")
    monkeypatch.setattr(documents, "DATA_DIR", tmp_path)
    documents.document.cache_clear()
    try:
        with pytest.raises(documents.SnapshotError, match="SHA-256"):
            documents.document("GPL-3")
    finally:
        documents.document.cache_clear()


@pytest.mark.parametrize("split", ["dev", "test"])
def test_every_answer_is_in_its_document(split):
    """A question whose answer the document does not state would test nothing."""
    for q in LOOKUPS[split]:
        text = normalize(documents.document(q.doc))
        for group in q.require:
            assert any(normalize(s) in text for s in group), (q.question, group)


def test_seeds_pick_their_own_split_and_refuse_the_other():
    assert lookup_for(0)[0] == "dev" and lookup_for(1000)[0] == "test"
    assert {lookup_for(s)[2] for s in range(1000, 1000 + len(LOOKUPS["test"]))} == \
        set(LOOKUPS["test"])
    with pytest.raises(ValueError, match="test seed"):
        TASK.generate(1000, split="dev")
    assert "real_doc_lookup" in SPLIT_FAMILIES
    inst = TASK.generate(1000, split="test")
    assert inst.meta["question_type"] == "lookup" and inst.length_tokens > 8000


@pytest.mark.parametrize("answer, right", [
    ("30", True), ("Thirty days.", True), ("Within 30 days after your receipt of the notice.", True),
    ("60", False), ("30 or 60 days", False),                       # a look-alike: a hedge
    ("I could not find it.", False),
    (" ".join(["the licence says"] * 20) + " 30 days", False),      # a pasted passage
])
def test_scoring_is_strict(answer, right):
    inst = TASK.generate(1000, split="test")       # "Within how many days ... cure it"
    assert TASK.score(answer, inst).score == float(right)


def test_an_answer_must_name_every_part_asked():
    inst = TASK.generate(2, split="dev")           # month and year
    assert TASK.score("January 2004", inst).score == 1.0
    assert TASK.score("2004", inst).score == 0.0


def test_the_baselines_that_apply_answer_and_grep_is_a_real_contender():
    assert applies("embed", "real_doc_lookup") and not applies("lexicon", "real_doc_lookup")
    right = 0
    for seed in range(len(LOOKUPS["dev"])):
        inst = TASK.generate(seed, split="dev")
        right += TASK.score(baseline_answer("grep", inst, inst.context, seed), inst).score
    assert right >= 2          # a line holding the question's rare words often holds the answer


def test_sentences_join_wrapped_lines():
    s = sentences("  First line of a\n  sentence goes on. Second one here.\n\nA new paragraph.")
    assert s == ["First line of a sentence goes on.", "Second one here.", "A new paragraph."]
