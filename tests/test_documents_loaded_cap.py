"""The text a load keeps in this process is bounded (recursa.documents.limits.MAX_LOADED_CHARS):
one document's text, and what the confined parser may write back for a whole load, so a small
file cannot become gigabytes in the host. A file streamed to the sandbox (`recursa run` with a
file) is bounded by MAX_TEXT_CHARS instead. Caps lowered here; the inputs are generated."""

from __future__ import annotations

from pathlib import Path

import pytest

from recursa.documents import DocumentError, confine, limits
from recursa.documents.load import load


def write_csv(path: Path, rows: int) -> Path:
    """A CSV of `rows` rows of ~60 characters each."""
    path.write_text("id,name,note\n" + "".join(
        f"{i},name {i:06d},a note about row {i:06d} that fills the line\n" for i in range(rows)))
    return path


def test_the_defaults_keep_a_loaded_document_to_a_few_hundred_million_characters():
    assert limits.MAX_LOADED_CHARS <= 300_000_000
    assert limits.text_cap(10 * 1024**2, held=True) == limits.MAX_LOADED_CHARS   # not 1G
    assert limits.loaded_output_mb() <= 1024


def test_a_document_over_the_loaded_cap_is_refused_naming_the_file_and_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(limits, "MAX_LOADED_CHARS", 100_000)
    big = write_csv(tmp_path / "big.csv", 3_000)          # ~170,000 characters of text
    with pytest.raises(DocumentError, match=r"big\.csv: its text is over 100,000 characters"
                                            r".*MAX_LOADED_CHARS"):
        load(big)
    small = load(write_csv(tmp_path / "small.csv", 500))  # under the cap: loads
    assert "name 000499" in str(small)
    # streamed to a sandbox, the same file is bounded by MAX_TEXT_CHARS alone
    got = confine.load_file(big, stream_to=tmp_path / "payload.json")
    assert got.stats is not None and got.stats.chars > 100_000


def test_a_folder_whose_text_passes_the_loaded_cap_loses_files_with_a_note(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Eight files each under the one-document cap, 2.4 MB of text together against the 2 MB
    the parser may write back: the files it was writing at the cap are skipped, each named in
    a note with the bound, and the rest loads."""
    monkeypatch.setattr(limits, "MAX_LOADED_CHARS", 500_000)    # -> 2 MB written back
    assert limits.loaded_output_mb() == 2
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(8):
        write_csv(folder / f"part{i}.csv", 5_000)             # ~300,000 characters each
    value, notes = confine.load_folder(folder)
    skipped = [n for n in notes if "MAX_LOADED_CHARS" in n]
    assert 1 <= len(skipped) <= 3, notes
    assert all("the 2 MB the parser may write" in n for n in skipped), skipped
    assert 5 <= len(value) < 8 and all(k.startswith("part") for k in value)
