"""Zip and tar archives: their members' sizes are checked from the archive's own index before
anything is extracted (a zip bomb is refused unopened), and again while reading. The same check
guards the zip inside an Office file or an EPUB before its library opens it (`check_container`),
and a compressed tar's members are checked against the size of the compressed file as each
header arrives."""

from __future__ import annotations

import tarfile
import zipfile
from collections.abc import Iterator

from recursa.documents import limits
from recursa.documents.errors import DocumentError
from recursa.documents.source import Source


def _refuse(src: Source, why: str, archive: bool = True) -> DocumentError:
    what = "archive refused before extraction" if archive else "refused before reading it"
    return DocumentError(f"{src.name}: {what}: {why} (recursa.documents.limits)")


def _read_capped(f: object, cap: int, src: Source, member: str) -> bytes:
    data = f.read(cap + 1)  # type: ignore[attr-defined]
    if len(data) > cap:
        raise _refuse(src, f"member {member!r} unpacks to more than it declares")
    return data


def check_zip(src: Source, z: zipfile.ZipFile, *, archive: bool = True) -> list[zipfile.ZipInfo]:
    """The files of `z`, or DocumentError if its index declares too many, too big, or an unpack
    ratio over the limits (each member and the whole, against the file's size)."""
    infos = [i for i in z.infolist() if not i.is_dir()]
    if len(infos) > limits.MAX_ARCHIVE_MEMBERS:
        raise _refuse(src, f"{len(infos):,} members (limit {limits.MAX_ARCHIVE_MEMBERS:,})",
                      archive)
    for i in infos:
        if i.file_size > limits.RATIO_FLOOR and \
                i.file_size > limits.MAX_RATIO * max(i.compress_size, 1):
            raise _refuse(src, f"member {i.filename!r} would unpack "
                          f"{i.file_size / max(i.compress_size, 1):,.0f} times its size "
                          f"({limits.mb(i.file_size)}; limit {limits.MAX_RATIO}x)", archive)
    why = limits.expansion(sum(i.file_size for i in infos), src.size, archive=archive)
    if why:
        raise _refuse(src, f"its members declare {why}", archive)
    return infos


def check_container(src: Source) -> None:
    """An Office file or EPUB (a zip) whose index promises a bomb is refused before its library
    reads it; one that is no zip at all is left for the library to name."""
    with src.open() as f:
        try:
            z = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return
        with z:
            check_zip(src, z, archive=False)


def zip_members(src: Source, notes: list[str]) -> Iterator[tuple[str, bytes]]:
    try:
        z = zipfile.ZipFile(src.open())
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise DocumentError(f"{src.name}: not a readable zip file (corrupt or truncated: "
                            f"{e})") from None
    with z:
        infos = check_zip(src, z)
        for i in infos:
            if i.file_size > limits.MAX_MEMBER_BYTES:
                notes.append(f"{i.filename}: skipped: {limits.mb(i.file_size)} is over the "
                             f"{limits.mb(limits.MAX_MEMBER_BYTES)} limit for one member")
                continue
            try:
                with z.open(i) as f:
                    data = _read_capped(f, i.file_size, src, i.filename)
            except RuntimeError as e:          # an encrypted member
                notes.append(f"{i.filename}: skipped: {e}")
                continue
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
                notes.append(f"{i.filename}: skipped: corrupt in the archive ({e})")
                continue
            yield i.filename, data


def tar_members(src: Source, notes: list[str]) -> Iterator[tuple[str, bytes]]:
    try:
        t = tarfile.open(fileobj=src.open(), mode="r|*")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DocumentError(f"{src.name}: not a readable tar archive (corrupt or truncated: "
                            f"{e})") from None
    total = count = loaded = 0
    packed = src.size
    with t:
        try:
            # streaming mode: each header is checked before its member's data is read
            for m in t:
                if not m.isreg():
                    continue
                count += 1
                total += m.size
                if count > limits.MAX_ARCHIVE_MEMBERS:
                    raise _refuse(src, f"over {limits.MAX_ARCHIVE_MEMBERS:,} members")
                # a compressed tar declares each member as it comes: the running total is
                # checked against the compressed file before the member is unpacked
                why = limits.expansion(total, packed)
                if why:
                    raise _refuse(src, f"its members declare {why}")
                if m.size > limits.MAX_MEMBER_BYTES:
                    notes.append(f"{m.name}: skipped: {limits.mb(m.size)} is over the "
                                 f"{limits.mb(limits.MAX_MEMBER_BYTES)} limit for one member")
                    continue
                f = t.extractfile(m)
                if f is None:
                    continue
                data = _read_capped(f, m.size, src, m.name)
                loaded += 1
                yield m.name, data
        except (tarfile.TarError, OSError, EOFError) as e:
            if not loaded:
                raise DocumentError(f"{src.name}: not a readable tar archive (corrupt or "
                                    f"truncated: {e})") from None
            # a cut-off archive keeps the members read before the cut
            notes.append(f"{src.name}: the archive ends early after {loaded} member(s) "
                         f"(truncated or corrupt: {e}); the rest is lost")
