"""Test images made with Pillow (importers skip first when it is missing)."""

from __future__ import annotations

import io

from PIL import Image as PILImage


def quadrants(w: int = 64, h: int = 48, fmt: str = "PNG") -> bytes:
    """An image with four coloured quadrants, so a crop's content shows where it was cut."""
    im = PILImage.new("RGB", (w, h), (255, 0, 0))
    im.paste((0, 255, 0), (w // 2, 0, w, h // 2))
    im.paste((0, 0, 255), (0, h // 2, w // 2, h))
    im.paste((255, 255, 0), (w // 2, h // 2, w, h))
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()
