"""Getting a candidate out of LLM text: a full module in a code fence, or SEARCH/REPLACE edits
applied to the parent. Anything else is a parse error that keeps the raw text."""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.S)
_DIFF = re.compile(r"<{5,}\s*SEARCH\s*\n(.*?)\n?={5,}\s*\n(.*?)\n?>{5,}\s*REPLACE", re.S)


class ParseError(ValueError):
    """The text holds no usable candidate; the message says why."""


@dataclass(frozen=True)
class Parsed:
    source: str
    kind: str  # "full" or "diff"
    edits: int = 0


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def diff_blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _DIFF.finditer(text)]


def _normalize(line: str) -> str:
    return " ".join(line.split())


def apply_edit(source: str, search: str, replace: str) -> str:
    """Replace the one exact occurrence of `search`; failing that, the one occurrence that matches
    line by line ignoring whitespace. Zero or several matches are errors naming the first line."""
    count = source.count(search) if search else 0
    if count == 1:
        return source.replace(search, replace, 1)
    first = next((ln for ln in search.splitlines() if ln.strip()), "")
    if count > 1:
        raise ParseError(f"SEARCH block matches {count} places (starts {first.strip()[:60]!r}); make it unique")
    lines, want = source.splitlines(keepends=True), [_normalize(ln) for ln in search.splitlines()]
    while want and not want[-1]:
        want.pop()
    if not want:
        raise ParseError("empty SEARCH block")
    hits = [i for i in range(len(lines) - len(want) + 1)
            if [_normalize(ln) for ln in lines[i:i + len(want)]] == want]
    if len(hits) != 1:
        what = "does not match the parent" if not hits else f"matches {len(hits)} places"
        raise ParseError(f"SEARCH block {what} (starts {first.strip()[:60]!r})")
    i = hits[0]
    tail = "\n" if replace and not replace.endswith("\n") else ""
    return "".join(lines[:i]) + replace + tail + "".join(lines[i + len(want):])


def parse_response(text: str, parent_source: str | None = None) -> Parsed:
    """A candidate module from an LLM reply. Edits need a parent; full modules must define ModelNew."""
    if not text or not text.strip():
        raise ParseError("empty response")
    edits = diff_blocks(text)
    if edits:
        if parent_source is None:
            raise ParseError("SEARCH/REPLACE edits but no parent to apply them to")
        source = parent_source
        for search, replace in edits:
            source = apply_edit(source, search, replace)
        return Parsed(source, "diff", len(edits))
    blocks = [body for lang, body in code_blocks(text) if lang in ("", "python", "py", "python3")]
    with_model = [b for b in blocks if re.search(r"^\s*class\s+ModelNew\b", b, re.M)]
    if with_model:
        return Parsed(max(with_model, key=len).strip() + "\n", "full")
    if re.search(r"^class\s+ModelNew\b", text, re.M) and "```" not in text:
        return Parsed(text.strip() + "\n", "full")
    if blocks:
        raise ParseError("code blocks found, but none defines class ModelNew")
    raise ParseError("no code block and no SEARCH/REPLACE edits in the response")
