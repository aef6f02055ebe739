"""An image in the context: the code lists it, crops it and sends the crop to a vision model.

Offline by default: the root model is scripted and the "vision model" is a stand-in that says
what it received. With real models:

    .venv/bin/python examples/images.py --model openai:gpt-5-mini --vision openai:gpt-4o-mini
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import zlib
from pathlib import Path

from recursa import RLM, Image
from recursa.models.replay import ReplayClient

CODE = """```repl
print(list_images())
corner = context.crop((0, 0, context.size[0] // 2, context.size[1] // 2))
FINAL(llm_query("What colour fills this picture? One word.", images=[corner]))
```"""


def png(width: int, height: int, pixel) -> bytes:
    """A PNG written with the standard library: pixel(x, y) -> (r, g, b)."""
    rows = b"".join(b"\x00" + bytes(c for x in range(width) for c in pixel(x, y))
                    for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                               0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def stand_in_vision(messages) -> str:
    parts = messages[-1]["content"]
    seen = [Image.from_data_url(p["image_url"]["url"]) for p in parts
            if p.get("type") == "image_url"]
    return f"(stand-in) I was sent {', '.join(repr(i) for i in seen)}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="root model spec (default: scripted)")
    ap.add_argument("--vision", help="vision sub-model spec (default: a stand-in)")
    a = ap.parse_args()
    path = Path(tempfile.mkdtemp()) / "flag.png"
    path.write_bytes(png(80, 60, lambda x, y: (200, 30, 30) if x < 40 and y < 30
                         else (240, 240, 240)))
    rlm = RLM(model=a.model or ReplayClient([CODE]),
              sub_model=a.vision or ReplayClient(stand_in_vision))
    res = rlm.completion("What colour is the top-left quarter of the picture?", context=path)
    print(res.status, "->", res.answer)


if __name__ == "__main__":
    main()
