"""Images: contexts that hold them, the sandbox's Image (list, crop), llm_query(images=...) in
each provider's wire format against local fake servers, and bad input."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image as PILImage  # noqa: E402

from helpers_images import quadrants  # noqa: E402
from openai_testserver import OpenAITestServer  # noqa: E402
from provider_fakes import ProviderFake  # noqa: E402
from recursa import RLM  # noqa: E402
from recursa.base import images  # noqa: E402
from recursa.base.images import Image, ImageError, content_text  # noqa: E402
from recursa.base.types import ContextError, ModelError  # noqa: E402
from recursa.core import context as ctx  # noqa: E402
from recursa.models import make_client  # noqa: E402
from recursa.models.replay import ReplayClient  # noqa: E402
from recursa.obs.trace import load_events  # noqa: E402


def decode_data_url(url: str) -> PILImage.Image:
    head, _, b64 = url.partition(",")
    assert head.startswith("data:image/") and head.endswith(";base64")
    return PILImage.open(io.BytesIO(base64.b64decode(b64)))


# ------------------------------------------------------------------ recognising images
@pytest.mark.parametrize("fmt, name", [("PNG", "png"), ("JPEG", "jpeg"), ("GIF", "gif"),
                                       ("WEBP", "webp")])
def test_formats_and_sizes_read_from_headers(fmt, name):
    img = Image.from_bytes(quadrants(37, 21, fmt), name=f"x.{name}")
    assert (img.format, img.size) == (name, (37, 21))
    assert img.media_type == f"image/{name}"
    assert "bytes" in repr(img) and "37x21" in repr(img)


def test_not_an_image_is_named(tmp_path):
    p = tmp_path / "cat.png"
    p.write_text("this is text, not a picture")
    with pytest.raises(ContextError, match=r"'cat.png' is not an image"):
        ctx.prepare(p, tmp_path / "w")


def test_truncated_image_is_corrupt(tmp_path):
    for fmt in ("PNG", "GIF", "JPEG", "WEBP"):
        data = quadrants(fmt=fmt)
        p = tmp_path / f"half.{fmt.lower()}"
        p.write_bytes(data[: len(data) // 2])
        with pytest.raises(ImageError, match=rf"half.{fmt.lower()}' is a corrupt {fmt} file"):
            ctx.prepare(p, tmp_path / "w")


def test_oversized_image_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "big.png"
    p.write_bytes(quadrants())
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(ImageError, match=r"'.*big.png' is 0.0 MB; images are limited to"):
        ctx.prepare(p, tmp_path / "w")
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 10**9)
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ImageError, match=r"64x48 pixels; images are limited to 1,000 pixels"):
        ctx.prepare(p, tmp_path / "w")


def test_context_forms_and_description(tmp_path):
    (tmp_path / "a.png").write_bytes(quadrants(10, 10))
    pil = PILImage.new("RGB", (7, 3))
    value = {"photo": Path(tmp_path / "a.png"), "raw": quadrants(20, 5, "GIF"), "pil": pil,
             "notes": "plain text", "more": [quadrants(4, 4, "JPEG")]}
    prep = ctx.prepare(value, tmp_path / "w")
    d = prep.description
    assert "images: 4 (2 png, 1 gif, 1 jpeg)" in d
    assert "['photo']: png 10x10 px" in d and "['raw']: gif 20x5 px" in d
    assert "['more'][0]: jpeg 4x4 px" in d
    assert base64.b64encode(quadrants(10, 10)).decode()[:40] not in d   # no bytes shown
    payload = json.loads(Path(prep.payload.path).read_text())
    assert payload["photo"][images.MARKER] == 1 and payload["notes"] == "plain text"


def test_directory_with_images_and_a_bad_one(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "readme.md").write_text("# hi")
    (d / "fig.webp").write_bytes(quadrants(30, 20, "WEBP"))
    (d / "broken.png").write_bytes(quadrants()[:40])
    prep = ctx.prepare(d, tmp_path / "w")
    assert "images: 1 (1 webp)" in prep.description
    assert any("broken.png: skipped" in n and "corrupt PNG" in n for n in prep.notes)


def test_a_path_in_a_list_is_read_and_must_exist(tmp_path):
    # a text or document file in a list is read like a --context file (recursa.documents)
    (tmp_path / "t.txt").write_text("x")
    prep = ctx.prepare([tmp_path / "t.txt"], tmp_path / "w")
    assert json.loads(Path(prep.payload.path).read_text()) == ["x"]
    with pytest.raises(ContextError, match=r"context path does not exist: .*nope.png"):
        ctx.prepare([tmp_path / "nope.png"], tmp_path / "w")


def test_http_urls_are_refused():
    with pytest.raises(ImageError, match="does not fetch images from the network"):
        Image.from_data_url("https://example.com/cat.png")
    img = Image.from_data_url("data:image/png;base64," + base64.b64encode(quadrants()).decode())
    assert img.size == (64, 48)


# ------------------------------------------------------------------ wire formats
MSG = [{"role": "system", "content": "look closely"},
       {"role": "user", "content": "what colour?"}]


def with_image(img: Image):
    return images.attach(MSG, [img])


async def test_openai_wire_format():
    img = Image.from_bytes(quadrants(), name="q.png")
    with OpenAITestServer() as srv:
        c = make_client("openai:gpt-4o-mini", base_url=srv.base_url)
        r = await c.complete(with_image(img))
        await c.aclose()
    assert r.text == "echo: what colour?"
    parts = srv.requests[-1]["messages"][-1]["content"]
    assert parts[0] == {"type": "text", "text": "what colour?"}
    assert parts[1]["type"] == "image_url"
    assert decode_data_url(parts[1]["image_url"]["url"]).size == (64, 48)


async def test_azure_wire_format(monkeypatch):
    monkeypatch.delenv("AZURE_OPENAI_ENDPOINT", raising=False)
    img = Image.from_bytes(quadrants(fmt="JPEG"))
    with ProviderFake() as fake:
        c = make_client("azure:vision", base_url=fake.url, api_key="k",
                        api_version="2024-10-21")
        await c.complete(with_image(img))
        await c.aclose()
    part = fake.requests[-1]["body"]["messages"][-1]["content"][1]
    assert part["image_url"]["url"].startswith("data:image/jpeg;base64,")


async def test_anthropic_wire_format():
    img = Image.from_bytes(quadrants(fmt="GIF"))
    with ProviderFake() as fake:
        c = make_client("anthropic:claude-sonnet-4-5", base_url=fake.url, api_key="k")
        r = await c.complete(with_image(img))
        await c.aclose()
    assert r.text == "echo: what colour?"
    body = fake.requests[-1]["body"]
    assert body["system"][0]["text"] == "look closely"
    blocks = body["messages"][-1]["content"]
    assert blocks[0] == {"type": "text", "text": "what colour?"}
    assert blocks[1]["type"] == "image"
    src = blocks[1]["source"]
    assert (src["type"], src["media_type"]) == ("base64", "image/gif")
    assert base64.b64decode(src["data"]) == img.data


async def test_bedrock_wire_format(monkeypatch, tmp_path):
    pytest.importorskip("botocore")
    for var in ("AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_BEARER_TOKEN_BEDROCK",
                "ANTHROPIC_BEDROCK_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    img = Image.from_bytes(quadrants())
    with ProviderFake() as fake:
        c = make_client("bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0", base_url=fake.url,
                        aws_region="us-west-2", aws_access_key="AKIDFAKE",
                        aws_secret_key="fake", retry_base_delay=0.01)
        await c.complete(with_image(img))
        await c.aclose()
    block = fake.requests[-1]["body"]["messages"][-1]["content"][1]
    assert block["type"] == "image" and block["source"]["media_type"] == "image/png"
    assert base64.b64decode(block["source"]["data"]) == img.data


async def test_gemini_wire_format(monkeypatch):
    pytest.importorskip("google.genai")
    img = Image.from_bytes(quadrants(fmt="WEBP"))
    with ProviderFake() as fake:
        c = make_client("gemini:gemini-2.5-flash", base_url=fake.url, api_key="k")
        r = await c.complete(with_image(img))
        await c.aclose()
    assert r.text == "echo: what colour?"
    parts = fake.requests[-1]["body"]["contents"][-1]["parts"]
    assert parts[0] == {"text": "what colour?"}
    blob = parts[1].get("inlineData") or parts[1].get("inline_data")
    # the SDK camel-cases the part but sends the blob's fields as given; the API takes both
    assert (blob.get("mimeType") or blob.get("mime_type")) == "image/webp"
    assert base64.urlsafe_b64decode(blob["data"]) == img.data     # the SDK's base64 flavour


async def test_local_model_says_it_cannot_see():
    c = make_client("local:qwen2.5-coder-1.5b")
    with pytest.raises(ModelError, match="is not a vision model: it cannot take images"):
        await c.complete(with_image(Image.from_bytes(quadrants())))


# ------------------------------------------------------------------ end to end
def _root(*codes: str):
    state = {"i": 0}

    def respond(messages):
        code = codes[min(state["i"], len(codes) - 1)]
        state["i"] += 1
        return f"```repl\n{code}\n```"
    return respond


def test_sandbox_lists_crops_and_sends_a_crop(tmp_path):
    """A PNG context; code in the real sandbox lists and crops it and sends the crop."""
    png = tmp_path / "quads.png"
    png.write_bytes(quadrants(64, 48))
    seen = []

    def vision(req):
        url = req["messages"][-1]["content"][1]["image_url"]["url"]
        im = decode_data_url(url)
        seen.append((im.format, im.size, im.convert("RGB").getpixel((1, 1))))
        return f"a {im.size[0]}x{im.size[1]} picture"

    code = ("found = list_images()\nprint(found)\n"
            "crop = context.crop((32, 24, 64, 48))\nprint(crop.size, crop.format)\n"
            "FINAL(llm_query('what colour is this?', images=[crop]))")
    with OpenAITestServer(responder=vision) as srv:
        sub = make_client("openai:vision-model", base_url=srv.base_url)
        rlm = RLM(model=ReplayClient(_root(code)), sub_model=sub, sandbox="local",
                  trace_dir=tmp_path / "traces")
        res = rlm.completion("What is in the bottom right?", context=png)
    assert res.status == "final", res.error
    assert res.answer == "a 32x24 picture"
    assert seen == [("PNG", (32, 24), (255, 255, 0))]      # the yellow bottom-right quadrant
    events = load_events(res.trace_path)
    start = next(e for e in events if e.kind == "subcall" and e.phase == "start")
    assert start.data["images"][0]["width"] == 32 and start.data["images"][0]["format"] == "png"
    assert "iVBOR" not in Path(res.trace_path).read_text()   # no PNG base64 in the trace
    run = next(e for e in events if e.kind == "run" and "description" in e.data)
    assert "type: Image, one png image, 64x48 pixels" in run.data["description"]


def test_batch_images_per_prompt_and_bad_images(tmp_path):
    got = []

    def sub(messages):
        content = messages[-1]["content"]
        n = sum(1 for p in content if p.get("type") == "image_url") \
            if isinstance(content, list) else 0
        got.append(n)
        return f"{n} images"

    code = ("a, b = context['a'], context['b']\n"
            "print(llm_batch(['p1', 'p2', 'p3'], images=[a, [a, b], None]))\n"
            "print(llm_query('bad', images=[b'not an image at all']))\n"
            "FINAL('done')")
    rlm = RLM(model=ReplayClient(_root(code)), sub_model=ReplayClient(sub),
              sandbox="inprocess")
    res = rlm.completion("q", context={"a": quadrants(), "b": quadrants(8, 8, "GIF")})
    assert res.status == "final"
    assert sorted(got) == [0, 1, 2]


def test_rlm_query_at_max_depth_sends_context_images_as_images():
    got = []

    def sub(messages):
        content = messages[-1]["content"]
        got.append((sum(p.get("type") == "image_url" for p in content), content_text(content)))
        return "seen"

    code = "FINAL(rlm_query('look', context=[context['a'], 'caption']))"
    res = RLM(model=ReplayClient(_root(code)), sub_model=ReplayClient(sub), sandbox="local",
              max_depth=0).completion("q", context={"a": quadrants()})
    assert res.answer == "seen", res.error
    (n, text), = got
    assert n == 1 and "caption" in text and "Image(" in text and len(text) < 200


def test_crop_without_pillow_is_a_clear_error(tmp_path):
    from recursa.sandbox.local import LocalSandbox

    def make():
        sb = LocalSandbox()
        sb.config = replace(sb.config, pillow=None)
        return sb

    code = "print(context.size)\ntry:\n    context.crop((0, 0, 5, 5))\nexcept RuntimeError as e:\n" \
        "    FINAL(str(e))"
    res = RLM(model=ReplayClient(_root(code)), sandbox=make).completion(
        "q", context=Image.from_bytes(quadrants()))
    assert res.status == "final"
    assert "Pillow is not available in this sandbox" in res.answer


@pytest.mark.parametrize("opts", [{}, {"zygote": False}, {"isolation": "limits"}],
                         ids=["zygote", "own-bwrap", "limits"])
def test_local_sandbox_shows_pillow_and_nothing_else_of_site_packages(opts):
    from recursa.sandbox.local import LocalSandbox
    code = ("import PIL\ntry:\n    import numpy\n    r = 'numpy visible'\n"
            "except ImportError:\n    r = 'only PIL'\nFINAL(r + ' ' + str(context.crop((0, 0, 2, 3)).size))")
    res = RLM(model=ReplayClient(_root(code)), sandbox=lambda: LocalSandbox(**opts)).completion(
        "q", context=Image.from_bytes(quadrants()))
    assert res.answer == "only PIL (2, 3)", res.error
