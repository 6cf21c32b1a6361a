#!/usr/bin/env python3
"""Every relative link in the documentation resolves.

Reads README.md, ARCHITECTURE.md, docs/*.md and runbooks/*.md. Each link that is not a URL
(`[text](path)`, `![alt](path)`, `[text](path#anchor)`, `[text](#anchor)`, and reference
definitions `[name]: path`) must name a file or directory that exists, relative to the page;
where it has a `#anchor` and names a Markdown file, the anchor must be one of that file's
headings as GitHub makes them: the heading's text lowercased, spaces turned into `-`,
everything but letters, digits, `-` and `_` removed, and `-1`, `-2`, ... appended to repeats.
Links inside code (fenced blocks and inline spans) are not links and are skipped.

Prints each broken link as `file:line: ...` and exits 1 if there is any; Python 3.11 standard
library only. `./scripts/test` runs it.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent

# A link's destination: after `](`, optionally in <>, optionally followed by a "title".
INLINE_LINK = re.compile(r"\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:name|id)\s*=\s*\"([^\"]+)\"", re.IGNORECASE)
HTML_HREF = re.compile(r"<a\s[^>]*href\s*=\s*\"([^\"]+)\"", re.IGNORECASE)
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def pages() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "ARCHITECTURE.md"]
    found += sorted((ROOT / "docs").glob("*.md"))
    found += sorted((ROOT / "runbooks").glob("*.md"))
    return [p for p in found if p.is_file()]


def prose_lines(text: str) -> list[tuple[int, str, str]]:
    """The page's lines outside fenced code blocks: number (from 1), the line, and the line with
    its inline code blanked out."""
    out: list[tuple[int, str, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opening = FENCE.match(line)
        if fence is None:
            # A backtick fence's info string holds no backtick (else the line is inline code).
            if opening and not (opening.group(1)[0] == "`" and "`" in line[opening.end():]):
                fence = opening.group(1)
                continue
        else:
            # A fence closes with the same character, at least as long, and nothing after it.
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence) \
                    and line.strip() == line.strip()[0] * len(line.strip()):
                fence = None
            continue
        out.append((number, line, blank_inline_code(line)))
    return out


def blank_inline_code(line: str) -> str:
    """Replaces every inline code span (`x`, ``x``, ...) with spaces of the same length."""
    result = []
    i = 0
    while i < len(line):
        if line[i] == "`":
            run = len(line[i:]) - len(line[i:].lstrip("`"))
            ticks = "`" * run
            end = line.find(ticks, i + run)
            # A closing run of exactly that length; an unmatched run is literal text.
            while end != -1 and line[end + run:end + run + 1] == "`":
                end = line.find(ticks, end + run + 1)
            if end == -1:
                result.append(ticks)
                i += run
                continue
            result.append(" " * (end + run - i))
            i = end + run
        else:
            result.append(line[i])
            i += 1
    return "".join(result)


def heading_text(raw: str) -> str:
    """What GitHub shows of a heading: code spans' contents, links' text, no emphasis or HTML."""
    text = re.sub(r"(`+)(.*?)\1", lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(?<![\w\\])(_{1,2})(?=\S)(.+?)(?<=\S)\1(?!\w)", r"\2", text)
    return text.strip()


def slug(text: str) -> str:
    """GitHub's anchor for a heading's text (before repeats are numbered)."""
    out = []
    for char in text.lower():
        if char == " ":
            out.append("-")
        elif char in "-_" or unicodedata.category(char)[0] in "LNM":
            out.append(char)
    return "".join(out)


def anchors(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    if path in cache:
        return cache[path]
    found: set[str] = set()
    seen: dict[str, int] = {}
    previous: tuple[int, str] | None = None
    for number, raw, line in prose_lines(path.read_text(encoding="utf-8")):
        # A heading's text is read from the raw line: its inline code is part of the anchor.
        heading = None
        atx = ATX_HEADING.match(raw)
        if atx:
            heading = atx.group(2) or ""
        elif previous is not None and previous[0] == number - 1 and previous[1].strip() \
                and SETEXT_UNDERLINE.match(raw) and not ATX_HEADING.match(previous[1]):
            heading = previous[1]
        if heading is not None:
            base = slug(heading_text(heading))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
        found.update(HTML_ANCHOR.findall(line))
        previous = (number, raw)
    cache[path] = found
    return found


def destinations(line: str) -> list[str]:
    found = [m.group(1) for m in INLINE_LINK.finditer(line)]
    definition = REFERENCE_DEFINITION.match(line)
    if definition:
        found.append(definition.group(1))
    found += HTML_HREF.findall(line)
    return [d[1:-1] if d.startswith("<") and d.endswith(">") else d for d in found]


def check(page: Path, cache: dict[Path, set[str]]) -> list[str]:
    problems = []
    where = page.relative_to(ROOT)
    for number, _, line in prose_lines(page.read_text(encoding="utf-8")):
        for destination in destinations(line):
            if SCHEME.match(destination) or destination.startswith("//"):
                continue  # a URL (https:, mailto:, ...): not a file of this repository
            target, _, anchor = destination.partition("#")
            target = unquote(target.split("?", 1)[0])
            if target.startswith("/"):
                path = ROOT / target.lstrip("/")
            elif target:
                path = page.parent / target
            else:
                path = page
            if not path.exists():
                problems.append(f"{where}:{number}: broken link {destination!r}: {target} does not exist")
                continue
            if anchor and path.is_file() and path.suffix.lower() == ".md":
                if unquote(anchor).lower() not in anchors(path.resolve(), cache):
                    problems.append(
                        f"{where}:{number}: broken link {destination!r}: "
                        f"{path.resolve().relative_to(ROOT)} has no heading #{anchor}"
                    )
    return problems


def main() -> int:
    if sys.version_info < (3, 11):
        print("scripts/check_docs.py needs Python 3.11 or later", file=sys.stderr)
        return 1
    cache: dict[Path, set[str]] = {}
    checked = pages()
    problems = [problem for page in checked for problem in check(page, cache)]
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} broken link(s) in the documentation", file=sys.stderr)
        return 1
    print(f"documentation links: every relative link in {len(checked)} pages resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
