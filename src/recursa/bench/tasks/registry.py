"""recursa's own task families, one row each, in the order `recursa bench list` shows them.

recursa.frontend.tasks reads this table through recursa's entry point in the
`recursa.task_tables` group (pyproject.toml): a new family is its module in this package plus
a row here.
"""

from __future__ import annotations

from .browsecomp import BrowseComp
from .codeqa import CodeQA
from .doc_lookup import RealDocLookup
from .judge_agg import JudgeAgg
from .judge_pairs import JudgePairs
from .math_python import MathPython
from .meta import Meta
from .oolong import Oolong
from .oolong_pairs import OolongPairs
from .para_niah import ParaNIAH, ParaNIAHMultiValue
from .real import RealSentimentCount, RealSentimentMost, RealWordnetCount, RealWordnetMost
from .sniah import SNIAH
from .two_hop import TwoHop
from .verbatim_copy import VerbatimCopy

FAMILIES = (
    SNIAH, Oolong, OolongPairs, CodeQA, BrowseComp, VerbatimCopy, MathPython,
    ParaNIAH, ParaNIAHMultiValue, JudgeAgg, JudgePairs, TwoHop, Meta,
    RealSentimentCount, RealSentimentMost, RealWordnetCount, RealWordnetMost,
    RealDocLookup,
)
