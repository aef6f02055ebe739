"""Images in contexts and in sub-calls: recognising them, limits, and how they cross into the
sandbox and into a model call.

    from recursa import RLM, Image
    RLM(model=...).completion("What is in the red box?", context=Path("photo.png"))
    RLM(...).completion("...", context={"scan": Image.open("scan.jpg"), "notes": "..."})

The host never decodes pixels: it reads formats and sizes from the file headers (stdlib only)
and checks each file is whole (PNG/GIF/WebP/JPEG trailers), so a truncated download is refused
up front. Pixels are decoded only inside the sandbox, when model-written code crops (Pillow).

Inside a message an image is an OpenAI-style `image_url` content part with a data URL; that is
what OpenAI-compatible servers take as is, and each other provider's adapter converts it
(`image_of_part` reads one; recursa.models.anthropic_client.anthropic_content,
recursa.models.gemini_client.gemini_parts). Traces keep only `trace_info` (hash, size, format).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
import importlib.util
import io
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recursa.base.types import ContextError

MAX_IMAGE_BYTES = 20 * 1024 * 1024     # per image: OpenAI's limit (Anthropic's API takes 5 MB)
MAX_IMAGE_PIXELS = 64_000_000          # per image: guards the sandbox against decompression bombs
MAX_IMAGES_PER_CALL = 20               # per sub-call
MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif",
               "webp": "image/webp"}
SUFFIXES = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".gif": "gif", ".webp": "webp"}
MARKER = "__recursa_image__"           # key of an image's JSON form (payload, sandbox calls)


class ImageError(ContextError):
    """An image cannot be used: not an image, corrupt, over a limit, or a refused URL."""


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB"


# ============================================================ headers (stdlib only)
def _png(data: bytes) -> tuple[int, int]:
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise ValueError("no IHDR chunk")
    w, h = struct.unpack(">II", data[16:24])
    if zlib.crc32(data[12:29]) != struct.unpack(">I", data[29:33])[0]:
        raise ValueError("IHDR checksum mismatch")
    if not data[-64:].rstrip(b"\x00").endswith(b"IEND\xaeB`\x82"):
        raise ValueError("no IEND chunk at the end (truncated?)")
    return w, h


def _gif(data: bytes) -> tuple[int, int]:
    if len(data) < 14:
        raise ValueError("too short")
    if not data[-64:].rstrip(b"\x00").endswith(b";"):
        raise ValueError("no trailer byte (truncated?)")
    return struct.unpack("<HH", data[6:10])


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes) -> tuple[int, int]:
    i, n = 2, len(data)
    while i + 9 < n:
        if data[i] != 0xFF:
            raise ValueError(f"bad marker at byte {i}")
        marker = data[i + 1]
        if marker == 0xFF:              # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if marker in _SOF:
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            if b"\xff\xd9" not in data[-4096:]:
                raise ValueError("no end-of-image marker (truncated?)")
            return w, h
        if marker == 0xDA:              # scan data before any frame header
            break
        i += 2 + length
    raise ValueError("no frame header")


def _webp(data: bytes) -> tuple[int, int]:
    if len(data) < 30:
        raise ValueError("too short")
    (riff,) = struct.unpack("<I", data[4:8])
    if riff + 8 > len(data):
        raise ValueError(f"RIFF size {riff + 8} > file size {len(data)} (truncated?)")
    chunk = data[12:16]
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":
        (b,) = struct.unpack("<I", data[21:25])
        return 1 + (b & 0x3FFF), 1 + ((b >> 14) & 0x3FFF)
    if chunk == b"VP8X":
        return (1 + int.from_bytes(data[24:27], "little"),
                1 + int.from_bytes(data[27:30], "little"))
    raise ValueError(f"unknown WebP chunk {chunk!r}")


def sniff(data: bytes) -> str | None:
    """The image format the bytes start like ('png', 'jpeg', 'gif', 'webp'), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


# ============================================================ the image
@dataclass(frozen=True, repr=False)
class Image:
    """An image's bytes with its format and size (read from its header, not decoded).

    Build with `Image.open(path)`, `Image.from_bytes(data)` or `Image.from_pil(img)`; each
    checks the format (png/jpeg/gif/webp), that the file is whole, and the size limits."""

    data: bytes
    format: str
    width: int
    height: int
    name: str = ""
    sha256: str = field(default="", compare=False)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, name: str = "") -> Image:
        data = bytes(data)
        label = repr(name) if name else "image bytes"
        if len(data) > MAX_IMAGE_BYTES:
            raise ImageError(f"{label} is {_mb(len(data))}; images are limited to "
                             f"{_mb(MAX_IMAGE_BYTES)} each (recursa.base.images.MAX_IMAGE_BYTES)")
        fmt = sniff(data)
        if fmt is None:
            raise ImageError(f"{label} is not an image recursa can use (PNG, JPEG, GIF or WebP); "
                             f"it starts with {data[:8]!r}")
        try:
            w, h = {"png": _png, "jpeg": _jpeg, "gif": _gif, "webp": _webp}[fmt](data)
        except (ValueError, struct.error) as e:
            raise ImageError(f"{label} is a corrupt {fmt.upper()} file: {e}") from e
        if w <= 0 or h <= 0:
            raise ImageError(f"{label} is a corrupt {fmt.upper()} file: size {w}x{h}")
        if w * h > MAX_IMAGE_PIXELS:
            raise ImageError(f"{label} is {w}x{h} pixels; images are limited to "
                             f"{MAX_IMAGE_PIXELS:,} pixels (recursa.base.images.MAX_IMAGE_PIXELS)")
        return cls(data=data, format=fmt, width=w, height=h, name=name,
                   sha256=hashlib.sha256(data).hexdigest())

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Image:
        p = Path(path)
        try:
            size = p.stat().st_size
            if size > MAX_IMAGE_BYTES:
                raise ImageError(f"{str(p)!r} is {_mb(size)}; images are limited to "
                                 f"{_mb(MAX_IMAGE_BYTES)} each (recursa.base.images.MAX_IMAGE_BYTES)")
            data = p.read_bytes()
        except OSError as e:
            raise ImageError(f"cannot read image {str(p)!r}: {e.strerror or e}") from e
        return cls.from_bytes(data, name=p.name)

    @classmethod
    def from_pil(cls, img: Any, name: str = "") -> Image:
        """A Pillow image, saved in its own format when recursa knows it, else as PNG."""
        fmt = (getattr(img, "format", None) or "PNG").upper()
        fmt = fmt if fmt.lower() in ("png", "jpeg", "gif", "webp") else "PNG"
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        return cls.from_bytes(buf.getvalue(), name=name or str(getattr(img, "filename", "")
                                                                  or "").rsplit("/", 1)[-1])

    @classmethod
    def from_data_url(cls, url: str, name: str = "") -> Image:
        """`data:image/png;base64,...`. Other URLs are refused: recursa fetches nothing."""
        if not isinstance(url, str) or not url.startswith("data:"):
            shown = url[:80] if isinstance(url, str) else type(url).__name__
            raise ImageError(f"image URL {shown!r} is not a data: URL; recursa does not fetch "
                             "images from the network: send them inline as "
                             "data:image/png;base64,...")
        head, sep, payload = url.partition(",")
        if not sep or ";base64" not in head:
            raise ImageError("image data URL must be base64 (data:image/png;base64,...)")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ImageError(f"image data URL{' ' + repr(name) if name else ''} is not valid "
                             "base64") from e
        return cls.from_bytes(data, name=name)

    # -- views
    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]

    def b64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{self.b64()}"

    def __repr__(self) -> str:
        label = f"{self.name!r}, " if self.name else ""
        return f"Image({label}{self.format}, {self.width}x{self.height}, {self.nbytes:,} bytes)"

    __str__ = __repr__

    def trace_info(self) -> dict[str, Any]:
        """What a trace keeps of an image: never its bytes."""
        return {"sha256": self.sha256[:16], "bytes": self.nbytes, "format": self.format,
                "width": self.width, "height": self.height,
                **({"name": self.name} if self.name else {})}

    def wire(self) -> dict[str, Any]:
        """The JSON form the sandbox payload and sandbox calls use."""
        return {MARKER: 1, "name": self.name, "format": self.format, "width": self.width,
                "height": self.height, "b64": self.b64()}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Image:
        """Back from the JSON form; re-checked, since it may come from sandboxed code."""
        try:
            data = base64.b64decode(str(d.get("b64", "")), validate=True)
        except (binascii.Error, ValueError) as e:
            raise ImageError("an image from the sandbox is not valid base64") from e
        return cls.from_bytes(data, name=str(d.get("name") or ""))


# ============================================================ contexts
def _is_pil(obj: Any) -> bool:
    return type(obj).__module__.startswith("PIL.") and hasattr(obj, "save") and \
        hasattr(obj, "mode")


def as_image(obj: Any, name: str = "") -> Image | None:
    """`obj` as an Image if it is one in any form recursa takes, else None. A path with an
    image suffix, or bytes that start like an image, must then be a valid one (ImageError)."""
    if isinstance(obj, Image):
        return obj
    if isinstance(obj, dict) and obj.get(MARKER) == 1:
        return Image.from_wire(obj)
    if callable(getattr(obj, "_wire", None)) and type(obj).__name__ == "Image":
        return Image.from_wire(obj._wire())     # the sandbox's own Image (in-process sandbox)
    if _is_pil(obj):
        return Image.from_pil(obj, name=name)
    if isinstance(obj, bytes | bytearray | memoryview) and sniff(bytes(obj[:16])):
        return Image.from_bytes(obj, name=name)
    if isinstance(obj, os.PathLike) and Path(obj).suffix.lower() in SUFFIXES:
        return Image.open(obj)
    return None


def normalize(value: Any) -> tuple[Any, list[tuple[str, Image]]]:
    """Replace every image inside a context (list/dict nesting) by an Image; return the new
    value and [(where, image)] in order. A Path inside a list/dict must be an image file."""
    found: list[tuple[str, Image]] = []

    def walk(v: Any, where: str) -> Any:
        if isinstance(v, str | int | float | bool) or v is None:
            return v
        img = as_image(v, name=where.rsplit("[", 1)[-1].strip("]'\"") if where else "")
        if img is not None:
            found.append((where or "context", img))
            return img
        if isinstance(v, os.PathLike):
            raise ImageError(f"{where}: a path inside a list/dict context must be an image "
                             f"file ({', '.join(SUFFIXES)}), got {os.fspath(v)!r}; read text "
                             "files into str yourself")
        if isinstance(v, dict):
            return {k: walk(x, f"{where}[{k!r}]") for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x, f"{where}[{i}]") for i, x in enumerate(v)]
        return v

    return walk(value, ""), found


def json_default(obj: Any) -> Any:
    """`json.dumps(context, default=json_default)`: images as their JSON form."""
    if isinstance(obj, Image):
        return obj.wire()
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def describe_images(found: list[tuple[str, Image]], limit: int = 12) -> list[str]:
    """Description lines for the root model: how many images, their formats and sizes."""
    if not found:
        return []
    kinds: dict[str, int] = {}
    for _, im in found:
        kinds[im.format] = kinds.get(im.format, 0) + 1
    total = sum(im.nbytes for _, im in found)
    lines = [f"images: {len(found)} ({', '.join(f'{n} {k}' for k, n in kinds.items())}), "
             f"{total:,} bytes in all; each is an `Image` (.size, .format, .name, .data, "
             f".crop(box)); send them to a vision sub-model with llm_query(prompt, images=[...])"]
    for where, im in found[:limit]:
        lines.append(f"  {where}: {im.format} {im.width}x{im.height} px, {im.nbytes:,} bytes")
    if len(found) > limit:
        lines.append(f"  ... and {len(found) - limit} more images")
    return lines


# ============================================================ sub-calls
def images_from_call(raw: Any) -> list[Image]:
    """The `images` of a sandbox call (JSON forms) as checked Images; ImageError if bad."""
    if raw is None:
        return []
    items = raw if isinstance(raw, list) else [raw]
    if len(items) > MAX_IMAGES_PER_CALL:
        raise ImageError(f"{len(items)} images in one call; the limit is {MAX_IMAGES_PER_CALL}")
    out = []
    for i, item in enumerate(items):
        img = as_image(item)
        if img is None:
            raise ImageError(f"images[{i}] is a {type(item).__name__}, not an image")
        out.append(img)
    return out


def image_part(img: Image) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": img.data_url()}}


def attach(messages: list[dict[str, Any]], images: list[Image]) -> list[dict[str, Any]]:
    """The images appended to the last user message, as content parts after its text."""
    if not images:
        return messages
    out = [dict(m) for m in messages]
    idx = max((i for i, m in enumerate(out) if m.get("role") == "user"), default=None)
    if idx is None:
        out.append({"role": "user", "content": ""})
        idx = len(out) - 1
    content = out[idx].get("content")
    parts = content if isinstance(content, list) else \
        [{"type": "text", "text": str(content or "")}]
    out[idx]["content"] = [*parts, *(image_part(im) for im in images)]
    return out


def image_of_part(part: Any) -> Image | None:
    """The image of an OpenAI-style `image_url` content part (a data URL), None for any other
    part; ImageError for a bad one. What each provider's adapter converts images from."""
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return Image.from_data_url(str(url))
    return None


def has_images(messages: list[dict[str, Any]]) -> bool:
    return any(isinstance(m.get("content"), list) and any(
        isinstance(p, dict) and p.get("type") == "image_url" for p in m["content"])
        for m in messages)


def content_text(content: Any) -> str:
    """The text of a message's content, images left out."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content
                       if isinstance(p, dict) and p.get("type", "text") == "text")
    return "" if content is None else str(content)


def image_tokens(img: Image) -> int:
    """A generous estimate of what one image costs as input: providers scale big images down
    to ~1.2 megapixels, about 1,600 tokens (Anthropic: w*h/750; OpenAI: 170 a 512px tile)."""
    scale = min(1.0, (1_200_000 / max(1, img.width * img.height)) ** 0.5)
    return max(100, int(img.width * scale) * int(img.height * scale) // 750 + 85)


def content_tokens(content: Any, text_tokens: Callable[[str], int]) -> int:
    """Tokens of one message's content for budget reservations (base64 is not text)."""
    if not isinstance(content, list):
        return text_tokens(str(content if content is not None else ""))
    n = 0
    for p in content:
        if isinstance(p, dict) and p.get("type") == "image_url":
            try:
                img = image_of_part(p)
                n += image_tokens(img) if img else 0
            except ImageError:
                n += 1600
        else:
            n += text_tokens(str(p.get("text", "")) if isinstance(p, dict) else str(p))
    return n


# ============================================================ Pillow for the sandbox
@functools.cache
def pillow_site() -> str | None:
    """The directory holding the host's `PIL` package (and its `pillow.libs`), which the local
    sandbox shows its worker read-only so model code can crop; None without Pillow."""
    try:
        spec = importlib.util.find_spec("PIL")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))).resolve().parent)


def from_content_part(part: dict[str, Any], n: int | None = None) -> tuple[str, Image]:
    """An OpenAI `image_url` content part -> (a name like 'image.png' or 'image3.png', Image).
    Only data URLs: an http(s) URL is refused (ImageError), since recursa fetches nothing."""
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str) or not url:
        raise ImageError("an image_url content part needs image_url.url (a data: URL)")
    img = Image.from_data_url(url, name="image" if n is None else f"image {n}")
    name = f"image{'' if n is None else n}.{'jpg' if img.format == 'jpeg' else img.format}"
    return name, dataclasses.replace(img, name=name)
