"""What a file is, from its bytes: the one place that decides whether a browser may show it as an image.

Only raster images are typed from their content (PNG, JPEG, GIF, WebP by their magic numbers), and only they are
ever shown inline; everything else is typed from its name's extension and is never a raster image (an `x.png`
holding HTML is `application/octet-stream`; an SVG is `image/svg+xml` and is downloaded, never shown).
"""

from __future__ import annotations

import mimetypes

RASTER = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def sniff(name: str, content: bytes) -> str:
    """A raster image's type from its magic number; otherwise the extension's type, never a raster image's."""
    if content.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if content.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if content[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return "image/webp"
    guessed, _ = mimetypes.guess_type(name, strict=False)
    if guessed is None or guessed in RASTER:
        return "application/octet-stream"
    return guessed
