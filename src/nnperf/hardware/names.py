"""Forgiving GPU name resolution: 'h100', 'H100-SXM' and 'NVIDIA H100 80GB HBM3' all work.

Names are compared after lower-casing, dropping every non-alphanumeric character and the vendor
words PyTorch puts in device names (NVIDIA, Tesla, GeForce, AMD, Instinct). An exact match on
an id, name or alias wins; otherwise a unique prefix, of whole words, of an id or a name (the
first spelling of each id): 'h100-pcie' names 'H100 PCIe 80GB', but 'h20' does not name
'H200 SXM' nor 'l40' 'L40S' (a word cut short is another GPU); aliases match whole, since an
alias spelled 'L40-S' would otherwise make 'l40' a word of the L40S. Otherwise the user gets
the list of candidates (ambiguous prefix) or of the closest names (unknown).
"""

from __future__ import annotations

import difflib
import re

from nnperf.errors import UsageError

_VENDOR_WORDS = re.compile(r"\b(nvidia|tesla|geforce|amd|instinct)\b")
#: What a GPU name may hold besides letters and digits (PyTorch's device names, the catalog's).
_STRAY = re.compile(r"[^A-Za-z0-9 _\-./()+]")


def normalize(name: str) -> str:
    """The comparison key of a GPU name."""
    return re.sub(r"[^a-z0-9]", "", _VENDOR_WORDS.sub("", name.lower()))


def word_prefixes(name: str) -> list[str]:
    """The comparison keys of ``name``'s leading whole words: 'H100 SXM5 80GB' -> 'h100',
    'h100sxm5', 'h100sxm580gb'."""
    words = re.findall(r"[a-z0-9]+", _VENDOR_WORDS.sub("", name.lower()))
    return ["".join(words[:n]) for n in range(1, len(words) + 1)]


def resolve(query: str, index: dict[str, list[str]]) -> str:
    """Return the id that ``query`` names. ``index`` maps an id to all its spellings, its name
    first."""
    keys: dict[str, set[str]] = {}
    prefixes: dict[str, set[str]] = {}
    for gpu_id, spellings in index.items():
        for spelling in [gpu_id, *spellings]:
            keys.setdefault(normalize(spelling), set()).add(gpu_id)
        for spelling in [gpu_id, *spellings[:1]]:
            for prefix in word_prefixes(spelling):
                prefixes.setdefault(prefix, set()).add(gpu_id)
    stray = _STRAY.findall(query)
    if stray:  # normalize() would drop it: 'h100😀' would silently be the H100
        raise UsageError(f"invalid GPU name {query!r}: {stray[0]!r} is in no GPU's name (letters, digits, "
                         "spaces and - _ . / ( ) +); run 'nnperf gpus' for the list")
    q = normalize(query)
    if not q:
        raise UsageError(f"empty GPU name {query!r}; run 'nnperf gpus' for the list")
    exact = keys.get(q, set())
    if len(exact) == 1:
        return next(iter(exact))
    prefixed = exact or prefixes.get(q, set())
    if len(prefixed) == 1:
        return next(iter(prefixed))
    if prefixed:
        raise UsageError(
            f"GPU name {query!r} is ambiguous; candidates: {', '.join(sorted(prefixed))}"
        )
    close = difflib.get_close_matches(q, list(keys), n=8, cutoff=0.5)
    ids = list(dict.fromkeys(i for k in close for i in sorted(keys[k])))[:5]
    hint = f"closest: {', '.join(ids)}" if ids else f"known: {', '.join(sorted(index))}"
    raise UsageError(f"unknown GPU {query!r}; {hint} (run 'nnperf gpus' for the list)")
