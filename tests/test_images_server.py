"""`recursa serve` with images: `image_url` data URLs (and image files) go into the context;
http(s) image URLs are refused in OpenAI's error shape."""

from __future__ import annotations

import base64
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
PIL = pytest.importorskip("PIL")

from helpers_images import quadrants  # noqa: E402
from helpers_server import Scripted, code, make_server  # noqa: E402
from recursa.base.images import Image  # noqa: E402
from recursa.core.config import RLMConfig  # noqa: E402
from recursa.server.common import RequestError  # noqa: E402
from recursa.server.openai_app import ServerConfig, parse_chat  # noqa: E402

CFG = ServerConfig(rlm=RLMConfig.build(model="replay:"))


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def test_image_parts_and_image_files_become_context_images() -> None:
    r = parse_chat({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in these?"},
        image_part(data_url(quadrants(10, 8))),
        image_part(data_url(quadrants(6, 4, "JPEG"), "image/jpeg")),
        image_part(data_url(quadrants(3, 3))),
        {"type": "file", "file": {"filename": "scan.gif",
                                  "file_data": base64.b64encode(quadrants(5, 5, "GIF")).decode()}},
        {"type": "file", "file": {"filename": "a.txt",
                                  "file_data": base64.b64encode(b"text").decode()}}]}]}, CFG)
    assert r.query == "What is in these?"
    assert r.context["files"] == {"a.txt": "text"}
    imgs = r.context["images"]
    assert list(imgs) == ["image.png", "image.jpg", "image-2.png", "scan.gif"]
    assert all(isinstance(v, Image) for v in imgs.values())
    assert [v.size for v in imgs.values()] == [(10, 8), (6, 4), (3, 3), (5, 5)]


@pytest.mark.parametrize("url, code_, needle", [
    ("https://example.com/cat.png", "image_url_not_supported", "does not fetch images"),
    ("data:image/png;base64,aGVsbG8=", "invalid_image", "is not an image"),
    ("data:image/png;base64,%%%", "invalid_image", "not valid base64"),
])
def test_bad_image_urls_are_refused(url: str, code_: str, needle: str) -> None:
    with pytest.raises(RequestError, match=needle) as e:
        parse_chat({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "q"}, image_part(url)]}]}, CFG)
    assert e.value.code == code_ and e.value.param == "messages"


def test_served_run_crops_an_image_and_sends_it_to_the_sub_model() -> None:
    seen: list[tuple[int, int]] = []

    def sub(messages: list[dict[str, Any]]) -> str:
        for p in messages[-1]["content"]:
            if isinstance(p, dict) and p.get("type") == "image_url":
                im = Image.from_data_url(p["image_url"]["url"])
                seen.append(im.size)
        return f"saw {len(seen)}"

    root = code("found = list_images()\n"
                "crop = found[0][1].crop((0, 0, 16, 12))\n"
                "FINAL(f'{len(found)} {type(context).__name__} ' + "
                "llm_query('what?', images=[crop]))")
    with make_server(Scripted(lambda m: root, sub)) as srv:
        c = srv.client()
        resp = c.chat.completions.create(model="recursa", messages=[{"role": "user", "content": [
            {"type": "text", "text": "Describe the picture."},
            image_part(data_url(quadrants(64, 48)))]}])
        assert resp.choices[0].message.content == "1 dict saw 1"
        assert seen == [(16, 12)]
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="recursa", messages=[{"role": "user", "content": [
                {"type": "text", "text": "q"}, image_part("http://example.com/x.png")]}])
    err = e.value.body
    assert e.value.status_code == 400 and err["code"] == "image_url_not_supported"
    assert err["type"] == "invalid_request_error" and "data:image/png;base64" in err["message"]

