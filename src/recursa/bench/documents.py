"""Real documents for lookup questions: licence texts as Debian's `base-files` ships them in
/usr/share/common-licenses (each licence permits verbatim copies), pinned by SHA-256 so a
changed file fails loudly instead of quietly changing every question's answer.

Snapshot in src/recursa/bench/data/documents/ (README there), taken from
`base-files=12.4+deb12u11`.
"""

from __future__ import annotations

from functools import cache

from .realdata import DATA_DIR, SnapshotError, checked

DOCUMENTS: dict[str, str] = {      # name -> SHA-256 of its UTF-8 text
    "GPL-3": "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986",
    "Apache-2.0": "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30",
    "MPL-2.0": "fab3dd6bdab226f1c08630b1dd917e11fcb4ec5e1e020e2c16f83a0a13863e85",
    "GFDL-1.3": "110535522396708cea37c72a802c5e7e81391139f5f7985631c93ef242b206a4",
}


@cache
def document(name: str) -> str:
    """The text of one pinned document."""
    if name not in DOCUMENTS:
        raise KeyError(f"unknown document {name!r}; known: {', '.join(DOCUMENTS)}")
    path = DATA_DIR / "documents" / f"{name}.txt"
    if not path.is_file():
        raise SnapshotError(f"document {name!r} missing: {path}")
    return checked(path.read_bytes(), DOCUMENTS[name], f"document {name!r} at {path}"
                   ).decode("utf-8")
