"""Search queries over runs' search text (docs/http-api.md#search).

The indexer (:mod:`toren.api.search`) stores a run's search text as its words, lowercase,
one space apart (:func:`words`): both databases then tokenize it the same way (SQLite's
FTS5 ``unicode61`` and PostgreSQL's ``simple`` configuration split on spaces and keep a
run of letters and digits whole), and a query split by the same function matches exactly
what was indexed.

The syntax, parsed here and never passed through to the database as written:

- ``refund invoice``: runs holding every word (any order);
- ``"refund approved"``: the words next to each other, in that order;
- ``refu*``: a word starting with ``refu`` (a trailing ``*``; on a phrase, its last word).

Case does not matter; characters other than letters and digits separate words (so
``order-42`` is the phrase ``"order 42"``). A query with no letter or digit finds nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A word: letters and digits (Unicode), the underscore being a separator as in both
# databases' tokenizers.
_WORD = re.compile(r"[^\W_]+")
_TERM = re.compile(r'"([^"]*)"(\*?)|(\S+)')
MAX_TERMS = 16  # more words than this in one query are ignored


@dataclass(frozen=True)
class Term:
    words: tuple[str, ...]  # one word, or a phrase
    prefix: bool = False  # the last word is a prefix


def words(text: str) -> list[str]:
    """The words of ``text`` as the index holds them: lowercase runs of letters and digits."""
    return _WORD.findall(text.lower())


def parse(query: str) -> list[Term]:
    terms: list[Term] = []
    for match in _TERM.finditer(query):
        quoted, star, bare = match.groups()
        if bare is not None:
            prefix = bare.endswith("*")
            found = words(bare)
        else:
            prefix = star == "*"
            found = words(quoted)
        if found:
            terms.append(Term(tuple(found), prefix))
    return terms[:MAX_TERMS]


def fts5_match(terms: list[Term]) -> str:
    """An FTS5 MATCH expression: quoted phrases (words hold no quote) joined by AND."""
    return " AND ".join(f'"{" ".join(t.words)}"{"*" if t.prefix else ""}' for t in terms)


def tsquery(terms: list[Term]) -> str:
    """A PostgreSQL ``to_tsquery`` text: quoted lexemes (words hold no quote), phrases
    with ``<->``, a prefix with ``:*``, terms joined by ``&``."""
    parts = []
    for t in terms:
        lexemes = [f"'{w}'" for w in t.words]
        if t.prefix:
            lexemes[-1] += ":*"
        parts.append(f"({' <-> '.join(lexemes)})")
    return " & ".join(parts)
