"""A Gene Ontology release, read from its OBO file: each term's aspect and its ancestors by is_a,
so that the terms carried to a protein are searched and kept per aspect and reduced to the most
specific, as goPredSim does (an alternative ID stands for its term; `part_of` is not followed).
"""

from pathlib import Path
from typing import NamedTuple

# GO's namespaces, by the names goPredSim and CAFA give its three aspects
ASPECTS = {"biological_process": "BPO", "molecular_function": "MFO", "cellular_component": "CCO"}


class OntologyError(ValueError):
    """A file given as the ontology that is not an OBO file of GO terms."""


class Term(NamedTuple):
    aspect: str
    parents: tuple[str, ...]  # its is_a parents


class Ontology:
    """The terms of a GO release (by ID and alternative ID), and the release (`version`)."""

    def __init__(self, terms: dict[str, Term], version: str):
        self.terms, self.version = terms, version
        self._ancestors: dict[str, frozenset[str]] = {}

    def aspect(self, term: str) -> str | None:
        found = self.terms.get(term)
        return found.aspect if found else None

    def ancestors(self, term: str) -> frozenset[str]:
        """Every term above `term` by is_a, however far (none for a term not in the release)."""
        if term not in self._ancestors:
            found, todo = set(), list(self.terms[term].parents if term in self.terms else ())
            while todo:
                parent = todo.pop()
                if parent not in found:
                    found.add(parent)
                    todo += self.terms[parent].parents if parent in self.terms else ()
            self._ancestors[term] = frozenset(found)
        return self._ancestors[term]

    def most_specific(self, terms) -> set[str]:
        """Those of `terms` that are no ancestor of another of them."""
        above = set().union(*(self.ancestors(t) for t in terms)) if terms else set()
        return {t for t in terms if t not in above}


def ontology_problem(path) -> str | None:
    """Why `path` cannot be read as a GO release, from its first line (a line that names it);
    None if it may."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            first = fh.readline()
    except OSError as err:
        return f"{path}: {err.strerror}: give a GO release's go-basic.obo"
    if not first.startswith("format-version:"):
        return not_obo(path, "it does not start with format-version:")
    return None


def read_ontology(path) -> Ontology:
    """The GO release in the OBO file `path` (go-basic.obo, go.obo); OntologyError naming the
    file where it is not one."""
    terms, version, stanza = {}, Path(path).name, None
    with open(path, encoding="utf-8", errors="replace") as fh:
        first = fh.readline()
        if not first.startswith("format-version:"):
            raise OntologyError(not_obo(path, "it does not start with format-version:"))
        for line in fh:
            line = line.strip()
            if line.startswith("["):
                add_term(terms, stanza)
                stanza = {"ids": [], "parents": []} if line == "[Term]" else None
            elif stanza is None:
                if line.startswith(("data-version:", "date:")) and version == Path(path).name:
                    version = line.split(":", 1)[1].strip()
            else:
                read_tag(stanza, line)
        add_term(terms, stanza)
    if not any(term.aspect for term in terms.values()):
        raise OntologyError(not_obo(path, "it holds no term of GO's three aspects"))
    return Ontology(terms, version)


def read_tag(stanza: dict, line: str) -> None:
    tag, _, value = line.partition(":")
    value = value.split("!", 1)[0].split("{", 1)[0].strip()
    if tag in ("id", "alt_id"):
        stanza["ids"].append(value)
    elif tag == "namespace":
        stanza["aspect"] = ASPECTS.get(value, "")
    elif tag == "is_a":
        stanza["parents"].append(value)


def add_term(terms: dict, stanza: dict | None) -> None:
    if stanza and stanza["ids"]:
        term = Term(stanza.get("aspect", ""), tuple(stanza["parents"]))
        for id_ in stanza["ids"]:
            terms[id_] = term


def not_obo(path, why: str) -> str:
    return f"{path} is not a Gene Ontology OBO file ({why}): give a GO release's go-basic.obo"
