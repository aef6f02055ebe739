"""Documents as contexts: PDF, Word, PowerPoint, Excel, EPUB, HTML, Markdown, CSV/TSV, JSON Lines,
Parquet, SQLite and zip/tar archives of them, read into a `Document` (a str holding the whole
text, with its pages / slides / sheets / sections / chapters / tables as `.parts`), and folders
read honouring .gitignore. The format libraries are the optional `docs` extra
(pip install 'recursa[docs]'); Markdown, CSV/TSV, JSON Lines and SQLite need nothing.

    from recursa.documents import load
    doc = load("report.pdf")            # Document; doc.pages[2].number == 3
    rlm.completion("...", context=doc)  # or context=Path("report.pdf"), or a folder

`Location` / `locate()` say where a span of text lies (file, page, line, character offsets).

Documents are parsed in a confined process of their own (recursa.documents.confine: bubblewrap,
no keys, no network, memory / CPU / time / output caps), never in the caller's; the bounds on
what one may cost are recursa.documents.limits.
"""

from typing import TYPE_CHECKING, Any

from recursa.documents.errors import DocumentError, MissingExtra
from recursa.documents.load import load
from recursa.documents.model import Document, Location, Part, locate
from recursa.documents.tree import load_tree

if TYPE_CHECKING:
    from recursa.documents.build import DocStats

__all__ = ["DocStats", "Document", "DocumentError", "Location", "MissingExtra", "Part", "load",
           "load_tree", "locate"]


def __getattr__(name: str) -> Any:
    # DocStats loads on first use (PEP 562): reading a plain-text file, as a run of
    # `recursa run -c notes.txt` does, needs nothing of recursa.documents.build
    if name != "DocStats":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from recursa.documents.build import DocStats
    return DocStats
