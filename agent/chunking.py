"""Split a long text into chunks a model can read one at a time, keeping its structure where it can.

Order of preference: Markdown headings (`#`, `##`, `###`) start a section, so a chunk can be named
after the section it starts with; a section too long for one chunk is cut at blank lines (paragraphs
packed together up to the limit), and a paragraph still too long is cut hard at the limit. Then
consecutive pieces are packed together up to the limit, so a text of many short sections gives a few
full chunks, not one tiny chunk per heading: every two neighbouring chunks hold more than `max_chars`,
so there are fewer than `2 * len(text) / max_chars + 1` of them.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

_HEADING = re.compile(r"^#{1,3}\s+(.+?)\s*#*\s*$")


class Chunk(BaseModel):
    model_config = ConfigDict(frozen=True)

    heading: str
    text: str
    sections: int = 1  # how many sections (or parts of one) it packs together

    @property
    def title(self) -> str:
        return self.heading if self.sections == 1 else f"{self.heading} (+{self.sections - 1} more)"


def split_into_chunks(text: str, *, max_chars: int) -> list[Chunk]:
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    chunks: list[Chunk] = []
    for heading, section in _sections(text):
        for piece in _pack(section, max_chars=max_chars):
            last = chunks[-1] if chunks else None
            if last is not None and len(last.text) + len(piece) <= max_chars:
                chunks[-1] = Chunk(heading=last.heading, text=last.text + piece, sections=last.sections + 1)
            else:
                chunks.append(Chunk(heading=heading, text=piece))
    return [
        chunk if chunk.heading else chunk.model_copy(update={"heading": f"Part {n}"})
        for n, chunk in enumerate(chunks)
    ]


def _sections(text: str) -> list[tuple[str, str]]:
    sections: list[tuple[str, list[str]]] = [("", [])]
    in_fence = False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line.rstrip("\n"))
        if match:
            sections.append((match.group(1), [line]))
        else:
            sections[-1][1].append(line)
    return [(heading, "".join(lines)) for heading, lines in sections if "".join(lines).strip()]


def _pack(section: str, *, max_chars: int) -> list[str]:
    if len(section) <= max_chars:
        return [section]
    pieces: list[str] = []
    current = ""
    for paragraph in re.split(r"(?<=\n)(?=[ \t]*\n)", section):
        if len(current) + len(paragraph) <= max_chars:
            current += paragraph
            continue
        if current:
            pieces.append(current)
        while len(paragraph) > max_chars:
            pieces.append(paragraph[:max_chars])
            paragraph = paragraph[max_chars:]
        current = paragraph
    if current:
        pieces.append(current)
    return [piece for piece in pieces if piece.strip()]
