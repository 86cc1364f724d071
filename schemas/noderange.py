"""Slurm hostlists ("node ranges"): `c[1-3,5]-[2-4].fox` <-> the host names it stands for.

Sonar's `NodeRange`, sacct's `NodeList`, sinfo's `%N` and the cluster envelopes all carry host lists in this
compact form, so every producer and consumer needs the same reading of it. The grammar implemented here:

    noderange := item ("," item)*            top-level commas separate items; commas in brackets do not
    item      := (text | "[" ranges "]")+    text = [A-Za-z0-9._-]*, and the item may not be empty
    ranges    := range ("," range)*
    range     := digits | digits "-" digits

Semantics, as Slurm (`hostlist.c`) and the Sonar spec define them:

* A range's zero padding comes from its *low* bound: `n[01-10]` is n01..n10, `n[8-10]` is n8, n9, n10.
  Each range inside one bracket has its own width (`n[9,010-011]` is n9, n010, n011). The high bound's
  own padding does not matter (Slurm reads it as a plain number).
* Several bracket groups multiply out, the first group varying slowest: `c[1-2]-[3-4]` is c1-3, c1-4,
  c2-3, c2-4 (the order of the Sonar spec's example).
* Invalid (so `expand` raises `ValueError` naming the offending part): an empty range or item, a low bound
  above the high bound, a number repeated inside one bracket group (`n[1-3,2]`, and also `n[1,01]`: the
  spec forbids repeated *numbers*), nested or unbalanced brackets, whitespace, characters outside
  `[A-Za-z0-9._-]`, an empty label (`..`, an item starting or ending with `.`) and a label starting with `-`:
  every name a node range
  stands for is a host name by `schemas.names`' rule, never a path such as `..` or `../x`. `None assigned` (sacct/squeue's placeholder for a job without nodes) is not a node
  range: callers map it to an empty list themselves; `expand` rejects it with a reason that says so.
* Repeated host names at the top level (`n1,n1`) are kept, as `scontrol show hostnames` keeps them.
* One node range may not stand for more than `MAX_HOSTS` names: a typo such as `n[1-1000000000]` must
  fail with a reason rather than exhaust memory.

`compress` is the inverse: it folds a set of host names into a sorted list of node ranges. Each name is
cut into alternating text and digit runs; names with the same texts (the same "shape") form a grid whose
dimensions are the digit runs. The grid is folded dimension by dimension, **the last digit run first**
(the usual "varying" number, as in `c1-[5-28]`), then the earlier ones, repeating until nothing more
merges, so `c1-2.fox ... c5-4.fox` comes back as `c[1-3,5]-[2-4].fox`. Because the result depends only on
the *set* of names, and expanding it gives back exactly that set, `compress(expand_all(compress(s))) ==
compress(s)`: the output is canonical.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import NoReturn

__all__ = ["MAX_HOSTS", "compress", "expand", "expand_all", "is_placeholder", "is_valid"]

MAX_HOSTS = 1 << 20
"""Largest number of names one node range may expand to (Slurm's own limit is of the same order)."""

# Compiled once at import: `expand` runs on every sacct/squeue line.
_HOSTNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)*")
"""A plain host name: dot-separated labels of `[A-Za-z0-9_-]`, none empty (no `..`, no leading or trailing
dot) nor starting with `-`: `schemas.names`' host-name rule, so an expanded name never becomes a path
outside its directory nor an option of a command."""
_DIGIT_RUNS = re.compile(r"([0-9]+)")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9._,\[\]-]")
_WELL_BRACKETED = re.compile(r"[^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)*")
"""Brackets balanced and not nested."""
_TOP_COMMA = re.compile(r",(?![^\[]*\])")
"""A comma outside brackets (no `]` ahead before the next `[`), given well-bracketed input."""

_Box = tuple[frozenset[str], ...]
"""One product of digit-string sets, one set per digit run of a host-name shape."""


def expand(noderange: str) -> list[str]:
    """All host names of `noderange`, in order.

    Raises `ValueError` whose message quotes the node range and names the offending part. The common cases
    (a single host, a plain comma list) take a fast path without bracket parsing.
    """
    if not isinstance(noderange, str):
        raise TypeError(f"a node range is a str, not {type(noderange).__name__}")
    if "[" not in noderange and "]" not in noderange:
        if _HOSTNAME.fullmatch(noderange):
            return [noderange]
        names = noderange.split(",")
        if all(_HOSTNAME.fullmatch(name) for name in names):
            return names
        _raise_plain(noderange)
    out: list[str] = []
    for item in _split_items(noderange):
        out.extend(_expand_item(noderange, item))
        if len(out) > MAX_HOSTS:
            raise _error(noderange, f"stands for more than {MAX_HOSTS} host names")
    return out


def expand_all(noderanges: Iterable[str]) -> list[str]:
    """The host names of several node ranges (e.g. Sonar's `nodes: []NodeRange`), concatenated in order."""
    out: list[str] = []
    for noderange in noderanges:
        out.extend(expand(noderange))
    return out


def is_valid(s: object) -> bool:
    """True when `expand(s)` would succeed; checks syntax and counts names without building their product."""
    if not isinstance(s, str):
        return False
    try:
        if "[" not in s and "]" not in s:
            return all(_HOSTNAME.fullmatch(name) for name in s.split(","))
        total = 0
        for item in _split_items(s):
            total += _count(_parse_item(s, item))
        return total <= MAX_HOSTS
    except ValueError:
        return False


def is_placeholder(text: str) -> bool:
    """True for Slurm's words for "no nodes" (`None assigned`, `None allocated`, sacct/squeue and Sonar's
    `slurm_jobs[].nodes` of a pending job): not a node range, and no error either."""
    return text.startswith("None ") or text.strip() in ("None assigned", "None allocated")


def compress(hostnames: Iterable[str]) -> list[str]:
    """A sorted, canonical list of node ranges standing for exactly the set of `hostnames`.

    Duplicates are ignored (the result covers the set). Each name must be a plain host name
    (`[A-Za-z0-9._-]+`), else `ValueError`. The list is sorted by the natural order (numbers compared as
    numbers) of the first host each node range stands for.
    """
    hosts: set[str] = set()
    for name in hostnames:
        if not isinstance(name, str) or not _HOSTNAME.fullmatch(name):
            raise ValueError(f"cannot compress {name!r}: not a plain host name (labels of [A-Za-z0-9_-])")
        hosts.add(name)

    by_shape: dict[tuple[str, ...], set[_Box]] = defaultdict(set)
    for name in hosts:
        parts = _DIGIT_RUNS.split(name)
        by_shape[tuple(parts[0::2])].add(tuple(frozenset((digits,)) for digits in parts[1::2]))

    ranked: list[tuple[tuple[object, ...], str]] = []
    for texts, boxes in by_shape.items():
        for box in _fold(boxes, len(texts) - 1):
            first = _interleave(texts, [min(values, key=_number_order) for values in box])
            ranked.append((_natural_key(first), _interleave(texts, [_render_set(values) for values in box])))
    ranked.sort()
    return [text for _, text in ranked]


# --- expand ------------------------------------------------------------------------------------------------


def _error(noderange: str, reason: str) -> ValueError:
    return ValueError(f"node range {noderange!r}: {reason}")


def _raise_plain(noderange: str) -> NoReturn:
    """Explain why a bracket-free node range failed (called only after the fast path said no)."""
    if noderange == "":
        raise _error(noderange, "is empty")
    if is_placeholder(noderange):
        raise _error(
            noderange,
            "is Slurm's placeholder for a job that has no nodes yet, not a node range (treat it as no nodes)",
        )
    _check_chars(noderange)
    names = noderange.split(",")
    for position, name in enumerate(names):
        if not name:
            raise _error(noderange, f"item {position + 1} is empty (stray comma)")
    _check_dots(noderange, names)
    raise _error(noderange, "is not a valid node range")  # pragma: no cover - every case is caught above


def _check_chars(noderange: str) -> None:
    bad = _BAD_CHAR.search(noderange)
    if bad is not None:
        what = "whitespace" if bad.group().isspace() else f"character {bad.group()!r}"
        raise _error(noderange, f"{what} at offset {bad.start()} is not allowed in a host name")


def _check_dots(noderange: str, items: list[str]) -> None:
    """Reject an empty label (`..`, an item starting or ending with `.`: `..` and `../x` are no hosts) and a
    label starting with `-`, as `schemas.names` does."""
    for position, item in enumerate(items):
        if ".." in item or item.startswith(".") or item.endswith("."):
            raise _error(
                noderange,
                f"item {position + 1} ({item!r}) has an empty label ('..', or a leading or trailing '.'): "
                "not a host name",
            )
        if item.startswith("-") or ".-" in item:
            raise _error(noderange, f"item {position + 1} ({item!r}) has a label starting with '-'")


def _split_items(noderange: str) -> list[str]:
    """Split at top-level commas; reject nested and unbalanced brackets, empty items and empty labels."""
    if noderange == "":
        raise _error(noderange, "is empty")
    _check_chars(noderange)
    items: list[str]
    if _WELL_BRACKETED.fullmatch(noderange):
        items = _TOP_COMMA.split(noderange) if "," in noderange else [noderange]
        if all(items):
            _check_dots(noderange, items)
            return items
    # Slow path, only to say precisely what is wrong.
    items = []
    depth = 0
    start = 0
    for offset, char in enumerate(noderange):
        if char == "[":
            if depth:
                raise _error(noderange, f"nested '[' at offset {offset}")
            depth = 1
        elif char == "]":
            if not depth:
                raise _error(noderange, f"']' at offset {offset} has no matching '['")
            depth = 0
        elif char == "," and not depth:
            items.append(noderange[start:offset])
            start = offset + 1
    if depth:
        raise _error(noderange, f"'[' at offset {noderange.rindex('[')} is never closed")
    items.append(noderange[start:])
    for position, item in enumerate(items):
        if not item:
            raise _error(noderange, f"item {position + 1} is empty (stray comma)")
    _check_dots(noderange, items)
    return items


def _parse_item(noderange: str, item: str) -> list[list[str]]:
    """The item as a list of segments, each the list of its alternatives (a text is a 1-element segment)."""
    segments: list[list[str]] = []
    pos = 0
    while True:
        open_at = item.find("[", pos)
        if open_at < 0:
            if pos < len(item):
                segments.append([item[pos:]])
            return segments
        if open_at > pos:
            segments.append([item[pos:open_at]])
        close_at = item.index("]", open_at)  # balanced: checked by _split_items
        segments.append(_expand_ranges(noderange, item[open_at + 1 : close_at]))
        pos = close_at + 1


def _expand_ranges(noderange: str, inner: str) -> list[str]:
    """The digit strings of one bracket group, e.g. `01-03,7` -> 01, 02, 03, 7."""
    if not inner:
        raise _error(noderange, "empty brackets '[]'")
    spans: list[tuple[int, int, int, str]] = []
    total = 0
    for part in inner.split(","):
        if not part:
            raise _error(noderange, f"empty range in '[{inner}]' (stray comma)")
        low_text, dash, high_text = part.partition("-")
        if not (low_text.isdigit() and low_text.isascii()) or (
            dash and not (high_text.isdigit() and high_text.isascii())
        ):
            raise _error(noderange, f"range {part!r} in '[{inner}]' is not N or N-M with decimal numbers")
        low = int(low_text)
        high = int(high_text) if dash else low
        if low > high:
            raise _error(noderange, f"range {part!r} has its first number greater than its second")
        total += high - low + 1
        if total > MAX_HOSTS:
            raise _error(noderange, f"'[{inner}]' stands for more than {MAX_HOSTS} numbers")
        spans.append((low, high, len(low_text), part))
    ordered = sorted(spans)
    for (_, prev_high, _, prev_part), (low, _, _, part) in itertools.pairwise(ordered):
        if low <= prev_high:
            raise _error(noderange, f"number {low} is repeated in '[{inner}]' ({prev_part!r} and {part!r})")
    out: list[str] = []
    for low, high, width, part in spans:
        if width == 1 or part[0] != "0":
            out.extend(map(str, range(low, high + 1)))  # no padding: every number is at least as wide
        else:
            out.extend([str(number).zfill(width) for number in range(low, high + 1)])
    return out


def _count(segments: list[list[str]]) -> int:
    total = 1
    for alternatives in segments:
        total *= len(alternatives)
    return total


def _expand_item(noderange: str, item: str) -> list[str]:
    segments = _parse_item(noderange, item)
    if _count(segments) > MAX_HOSTS:
        raise _error(noderange, f"{item!r} stands for more than {MAX_HOSTS} host names")
    names = segments[0]
    for alternatives in segments[1:]:  # cheaper than itertools.product + join for the usual 1-3 segments
        if len(alternatives) == 1:
            text = alternatives[0]
            names = [name + text for name in names]
        else:
            names = [name + alt for name in names for alt in alternatives]
    return names


# --- compress ----------------------------------------------------------------------------------------------


def _number_order(digits: str) -> tuple[int, int]:
    """Numbers as numbers; for equal numbers the less padded string first (`1` before `01`)."""
    return (int(digits), len(digits))


def _natural_key(name: str) -> tuple[object, ...]:
    """`c2` < `c10`: even positions hold texts, odd ones (number, length) pairs, so types never mix."""
    parts = _DIGIT_RUNS.split(name)
    return tuple(part if i % 2 == 0 else _number_order(part) for i, part in enumerate(parts))


def _interleave(texts: tuple[str, ...], fields: list[str]) -> str:
    out = [texts[0]]
    for field, text in zip(fields, texts[1:], strict=True):
        out.append(field)
        out.append(text)
    return "".join(out)


def _layers(values: set[str]) -> list[frozenset[str]]:
    """Split digit strings into sets without a repeated number (`1` and `01` cannot share a bracket group).

    Layer k takes the k-th least padded spelling of every number, so the split depends only on `values`.
    """
    spellings: dict[int, list[str]] = defaultdict(list)
    for value in values:
        spellings[int(value)].append(value)
    depth = max(len(group) for group in spellings.values())
    if depth == 1:
        return [frozenset(values)]
    layers: list[set[str]] = [set() for _ in range(depth)]
    for group in spellings.values():
        group.sort(key=len)
        for k, value in enumerate(group):
            layers[k].add(value)
    return [frozenset(layer) for layer in layers if layer]


def _fold_dimension(boxes: set[_Box], dim: int) -> set[_Box]:
    """Merge boxes that agree on every dimension but `dim`: A x {x} x C and A x {y} x C -> A x {x, y} x C."""
    groups: dict[_Box, set[str]] = defaultdict(set)
    for box in boxes:
        groups[box[:dim] + box[dim + 1 :]] |= box[dim]
    out: set[_Box] = set()
    for rest, values in groups.items():
        for layer in _layers(values):
            out.add((*rest[:dim], layer, *rest[dim:]))
    return out


def _fold(boxes: set[_Box], dims: int) -> set[_Box]:
    """Fold along the last digit run first, then the earlier ones, until a whole pass merges nothing.

    Every step is a function of the current set of boxes only, hence so is the result.
    """
    if dims == 0:
        return boxes
    while True:
        before = len(boxes)
        for dim in reversed(range(dims)):
            boxes = _fold_dimension(boxes, dim)
        if len(boxes) >= before:
            return boxes


def _render_set(values: frozenset[str]) -> str:
    """`{"01","02","03","7"}` -> `[01-03,7]`; one value -> the value itself (no brackets)."""
    if len(values) == 1:
        return next(iter(values))
    ordered = sorted(values, key=_number_order)
    pieces: list[str] = []
    run = [ordered[0]]
    low_w, high_w = _widths(ordered[0])
    for value in ordered[1:]:
        v_low, v_high = _widths(value)
        if int(value) == int(run[-1]) + 1 and max(low_w, v_low) <= min(high_w, v_high):
            run.append(value)
            low_w, high_w = max(low_w, v_low), min(high_w, v_high)
        else:
            pieces.append(_render_run(run, low_w))
            run = [value]
            low_w, high_w = v_low, v_high
    pieces.append(_render_run(run, low_w))
    return "[" + ",".join(pieces) + "]"


def _widths(digits: str) -> tuple[int, int]:
    """The range widths `w` for which `str(int(digits)).zfill(w) == digits`.

    A padded spelling (`007`) needs exactly its own length; an unpadded one (`7`, `10`, `0`) fits any width
    up to its length.
    """
    if len(digits) > 1 and digits[0] == "0":
        return (len(digits), len(digits))
    return (1, len(digits))


def _render_run(run: list[str], width: int) -> str:
    if len(run) == 1:
        return run[0]
    return f"{int(run[0]):0{width}d}-{int(run[-1]):0{width}d}"
