"""Every prose list of sandbox kinds, task families and providers in the docs equals what its
registry holds (recursa.sandbox.kinds, recursa.frontend.tasks, recursa.models.registry): a kind,
a family or a provider added to a registry fails here, naming each list that misses it, until
the list says it too. Each place is a span of a page (a regex) and the names expected in it;
the check compares the registry's names found in the span with those expected, both ways."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from recursa.frontend.tasks import task_names
from recursa.models.registry import PROVIDERS
from recursa.sandbox.kinds import REMOTE_KINDS, kind_names

ROOT = Path(__file__).resolve().parent.parent
KINDS = kind_names()
REMOTE = list(REMOTE_KINDS)
# the kinds that do not isolate model code from your files and network (docs/security.md), as
# their registry entries say
UNISOLATED = kind_names(isolates=False)
ISOLATING = kind_names(isolates=True)
PROVIDER_NAMES = PROVIDERS.names()
# scripted model replies for tests (docs/testing.md), not a provider one chooses
SCRIPTED = ["replay", "replay-file"]
KEYED = [p for p in PROVIDER_NAMES if PROVIDERS.get(p).key_env]     # type: ignore[union-attr]

# (page, span regex, how names are written there, the names the list must hold, the universe of
# names it is checked against)
PLACES = [
    ("docs/cli.md", r"\| `--sandbox KIND` \|[^\n]*", "word", KINDS, KINDS),
    ("docs/cli.md", r"for `docker` the CLI.*?installed extra", "code", REMOTE, KINDS),
    ("docs/security.md", r"which sandboxes can still work:.*?\.\n", "code",
     REMOTE + ["wasm", "limits"], KINDS),
    ("docs/server.md", r"isolating sandbox \(.*?\)", "code", ISOLATING, KINDS),
    ("docs/remote.md", r"make_remote_sandbox\(\"docker\"[^\n]*", "quoted", REMOTE, KINDS),
    ("README.md", r"- `sandbox=\"docker\"`.*?no cloud access\)", "quoted", REMOTE, KINDS),
    ("docs/datasets.md", r"## Families\n.*?\n## ", "row", task_names(), task_names()),
    ("docs/providers.md", r"\| prefix \| SDK \(extra\) \|.*?\n\n", "row",
     [p for p in PROVIDER_NAMES if p not in SCRIPTED], PROVIDER_NAMES),
    ("docs/cli.md", r"\| `recursa keys set PROVIDER` \| stores a key for [^(]*", "code", KEYED,
     PROVIDER_NAMES),
]

STYLES = {
    "word": r"(?<![\w-]){}(?![\w-])",
    "code": r"`{}`",
    "quoted": r"\"{}\"",
    "row": r"(?m)(?:^\| |, |/ )`{}:?`",      # a table's first column: `name`, `a`, `b` / `x:`
}


@pytest.mark.parametrize("page,span,style,expected,universe", PLACES,
                         ids=[f"{p[0]}:{p[1][:24]}" for p in PLACES])
def test_a_docs_list_names_what_its_registry_holds(page: str, span: str, style: str,
                                                  expected: list[str],
                                                  universe: list[str]) -> None:
    text = (ROOT / page).read_text()
    m = re.search(span, text, re.S)
    assert m, f"{page}: the list is gone (no match for {span!r}); update tests/test_doc_lists.py"
    found = {n for n in universe
             if re.search(STYLES[style].format(re.escape(n)), m.group(0))}
    missing, extra = sorted(set(expected) - found), sorted(found - set(expected))
    assert not missing and not extra, (
        f"{page}: the list at {m.group(0)[:60]!r}... "
        + (f"misses {', '.join(missing)}" if missing else "")
        + ("; " if missing and extra else "")
        + (f"names {', '.join(extra)}, which does not belong there" if extra else ""))


def test_the_cli_help_lists_come_from_their_registries() -> None:
    # the parser reads recursa's own entries only (other packages' are not loaded to build it)
    from recursa.cli import build_parser
    from recursa.frontend.options import OPTIONS
    from recursa.models.providers import BUILTIN as OWN_PROVIDERS
    from recursa.sandbox.kinds import BUILTIN as OWN_KINDS
    sandbox = next(o.help for o in OPTIONS if o.dest == "sandbox")
    for k in OWN_KINDS:
        assert f"{k.name} (" in sandbox and k.description in sandbox, k.name
    parser = build_parser()
    for name in ("keys", "set"):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    help_text = next(a.help for a in parser._actions if a.dest == "provider")
    keyed = [p.prefix for p in OWN_PROVIDERS if p.key_env]
    assert help_text is not None and help_text.startswith(", ".join(keyed) + ", ")
