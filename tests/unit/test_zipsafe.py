"""Uploaded zips: hostile archives are refused without leaving a trace, good ones land exactly as given."""

from __future__ import annotations

import base64
import io
import os
import stat
import struct
import unicodedata
import warnings
import zipfile
from pathlib import Path

import pytest

from sless_api.domain.zipsafe import (
    ByteBudget,
    ZipLimits,
    ZipRejected,
    copy_bounded,
    extract_zip,
    read_source_files,
)
from sless_core.errors import ValidationError

MIB = 1 << 20
Entry = tuple[str | zipfile.ZipInfo, bytes]


def build_zip(entries: list[Entry], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate names some tests need
        with zipfile.ZipFile(buf, "w", compression=compression) as zf:
            for name, data in entries:
                zf.writestr(name, data)
    return buf.getvalue()


def info(name: str, mode: int) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name)
    zi.create_system = 3  # unix, so external_attr's high half is a st_mode
    zi.external_attr = mode << 16
    zi.compress_type = zipfile.ZIP_DEFLATED
    return zi


def headers(data: bytes) -> list[tuple[int, bool]]:
    """(offset, is_central) of every local and central header."""
    found = []
    for sig, central in ((b"PK\x03\x04", False), (b"PK\x01\x02", True)):
        start = 0
        while (pos := data.find(sig, start)) >= 0:
            found.append((pos, central))
            start = pos + 4
    return found


def patch_headers(data: bytes, *, file_size: int | None = None, flag_or: int = 0, method: int | None = None) -> bytes:
    """Rewrite fields of every header, as a hostile client would (single-entry archives only)."""
    out = bytearray(data)
    for pos, central in headers(data):
        flag_at, method_at, size_at = (pos + 8, pos + 10, pos + 24) if central else (pos + 6, pos + 8, pos + 22)
        (flags,) = struct.unpack_from("<H", out, flag_at)
        struct.pack_into("<H", out, flag_at, flags | flag_or)
        if method is not None:
            struct.pack_into("<H", out, method_at, method)
        if file_size is not None:
            struct.pack_into("<I", out, size_at, file_size)
    return bytes(out)


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    """The folder that holds the destination, with a bystander file that must survive untouched."""
    p = tmp_path / "builds"
    p.mkdir()
    (p / "bystander.txt").write_text("keep me")
    return p


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def assert_rejected(data: bytes, parent: Path, match: str, limits: ZipLimits | None = None) -> ZipRejected:
    before = listing(parent.parent)
    dest = parent / "fn"
    with pytest.raises(ZipRejected, match=match) as exc:
        extract_zip(io.BytesIO(data), dest, limits)
    assert not dest.exists()
    assert listing(parent.parent) == before, "a rejected zip left something behind"
    assert exc.value.field == "code"
    assert isinstance(exc.value, ValidationError)
    return exc.value


# --- the good path ----------------------------------------------------------------------------------


def test_normal_zip_with_subfolders(parent: Path) -> None:
    data = build_zip(
        [
            ("handler.py", b"def handle(event):\n    return event\n"),
            ("lib/", b""),
            ("lib/util/helpers.py", b"X = 1\n"),
            ("requirements.txt", b"requests\n"),
            ("static/logo.png", b"\x89PNG\r\n\x1a\n\x00\x00"),
        ]
    )
    dest = parent / "fn"
    names = extract_zip(io.BytesIO(data), dest)
    assert names == ["handler.py", "lib/util/helpers.py", "requirements.txt", "static/logo.png"]
    assert (dest / "lib/util/helpers.py").read_bytes() == b"X = 1\n"
    assert (dest / "static/logo.png").read_bytes() == b"\x89PNG\r\n\x1a\n\x00\x00"
    for d in (dest, dest / "lib", dest / "lib/util", dest / "static"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755
    for f in names:
        assert stat.S_IMODE((dest / f).stat().st_mode) == 0o644
    assert sorted(p.name for p in parent.iterdir()) == ["bystander.txt", "fn"]


def test_paths_are_kept_as_given_not_flattened(parent: Path) -> None:
    data = build_zip([("myfn/handler.py", b"x"), ("myfn/lib.py", b"y")])
    assert extract_zip(io.BytesIO(data), parent / "fn") == ["myfn/handler.py", "myfn/lib.py"]
    assert (parent / "fn/myfn/handler.py").exists()


def test_source_may_be_a_path_and_dest_an_empty_dir(parent: Path, tmp_path: Path) -> None:
    path = tmp_path / "upload.zip"
    path.write_bytes(build_zip([("./handler.py", b"x"), ("a//b.py", b"y")]))
    dest = parent / "fn"
    dest.mkdir()
    assert extract_zip(path, dest) == ["a/b.py", "handler.py"]


def test_dest_with_content_is_refused(parent: Path) -> None:
    dest = parent / "fn"
    dest.mkdir()
    (dest / "old.py").write_text("old")
    with pytest.raises(FileExistsError):
        extract_zip(io.BytesIO(build_zip([("handler.py", b"x")])), dest)
    assert (dest / "old.py").read_text() == "old"


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (0o755, 0o755),
        (0o700, 0o755),
        (0o744, 0o755),
        (0o4755, 0o755),
        (0o644, 0o644),
        (0o600, 0o644),
        (0o666, 0o644),
    ],
)
def test_executable_bit(parent: Path, mode: int, expected: int) -> None:
    data = build_zip([(info("bin/tool", stat.S_IFREG | mode), b"#!/bin/sh\necho hi\n")])
    extract_zip(io.BytesIO(data), parent / "fn")
    assert stat.S_IMODE((parent / "fn/bin/tool").stat().st_mode) == expected


def test_zip_from_windows_without_unix_mode(parent: Path) -> None:
    zi = zipfile.ZipInfo("handler.py")
    zi.create_system = 0
    zi.external_attr = 0x20  # DOS "archive" attribute only
    extract_zip(io.BytesIO(build_zip([(zi, b"x")])), parent / "fn")
    assert stat.S_IMODE((parent / "fn/handler.py").stat().st_mode) == 0o644


# --- names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("../evil.py", r"'\.\.' component"),
        ("a/../../evil.py", r"'\.\.' component"),
        ("a/../evil.py", r"'\.\.' component"),
        ("..", r"'\.\.' component"),
        ("/etc/evil.py", "absolute path"),
        ("//server/share/evil.py", "absolute path"),
        ("..\\evil.py", "backslash"),
        ("a\\b.py", "backslash"),
        ("C:/evil.py", "drive letter"),
        ("c:evil.py", "drive letter"),
        ("a\nb.py", "control character"),
        ("./", "no usable name"),
        ("x" * 300 + ".py", "too long"),
        ("/".join(["d" * 200] * 6) + "/f.py", "too long"),
    ],
)
def test_bad_names(parent: Path, name: str, match: str) -> None:
    err = assert_rejected(build_zip([("ok.py", b"fine"), (name, b"evil")]), parent, match)
    assert repr(name)[:40].strip("'") in err.message or len(name) > 40
    assert not list(parent.parent.parent.rglob("evil.py"))


def test_nul_in_name(parent: Path) -> None:
    data = build_zip([("evilXpy.sh", b"x")]).replace(b"evilXpy.sh", b"evil\x00py.sh")
    assert_rejected(data, parent, "NUL")


def test_control_character_patched_into_the_headers(parent: Path) -> None:
    data = build_zip([("Q", b"x")])
    # A control byte in the raw name bytes, as a hand-crafted archive would carry it.
    assert_rejected(data.replace(b"Q", b"\x01"), parent, "control character")


@pytest.mark.parametrize(
    ("names", "match"),
    [
        (["handler.py", "handler.py"], "duplicates"),
        (["Handler.py", "handler.py"], "duplicates"),
        (["lib/x.py", "LIB/X.PY"], "duplicates"),
        (["a/b.py", "a//b.py"], "duplicates"),
        (["a/b.py", "./a/b.py"], "duplicates"),
        ([unicodedata.normalize("NFC", "café.py"), unicodedata.normalize("NFD", "café.py")], "duplicates"),
        (["a", "a/b.py"], "inside file"),
        (["A", "a/b.py"], "inside file"),
    ],
)
def test_duplicate_names(parent: Path, names: list[str], match: str) -> None:
    assert_rejected(build_zip([(n, b"x") for n in names]), parent, match)


def test_file_and_directory_of_the_same_name(parent: Path) -> None:
    assert_rejected(build_zip([("lib", b"x"), ("lib/", b"")]), parent, "clashes")
    assert_rejected(build_zip([("lib/", b""), ("lib", b"x")]), parent, "duplicates")


def test_unicode_names_are_fine(parent: Path) -> None:
    names = extract_zip(io.BytesIO(build_zip([("données/café.py", b"x"), ("日本.txt", b"y")])), parent / "fn")
    assert names == ["données/café.py", "日本.txt"]


# --- entry types ------------------------------------------------------------------------------------


def test_symlink(parent: Path) -> None:
    data = build_zip([("handler.py", b"x"), (info("link", stat.S_IFLNK | 0o777), b"/etc/passwd")])
    assert_rejected(data, parent, "'link' is a symbolic link")


@pytest.mark.parametrize("kind", [stat.S_IFIFO, stat.S_IFCHR, stat.S_IFBLK, stat.S_IFSOCK])
def test_special_files(parent: Path, kind: int) -> None:
    assert_rejected(build_zip([(info("dev", kind | 0o666), b"")]), parent, "special file")


def test_encrypted_entry(parent: Path) -> None:
    data = patch_headers(build_zip([("secret.py", b"x" * 100)]), flag_or=0x1)
    assert_rejected(data, parent, "'secret.py' is encrypted")


def test_unsupported_compression(parent: Path) -> None:
    data = patch_headers(build_zip([("odd.py", b"x" * 100)]), method=99)
    assert_rejected(data, parent, "odd.py")


def test_local_header_name_differs_from_directory(parent: Path) -> None:
    data = build_zip([("handler.py", b"x")])
    local = data.index(b"handler.py")  # the first occurrence is the local header
    data = data[:local] + b"../evil.p" + data[local + 9 :]
    assert_rejected(data, parent, "corrupt")
    assert not list(parent.parent.rglob("evil*"))  # this test's own tmp_path: other tests make "evil" files too


@pytest.mark.parametrize(
    "data",
    [b"", b"hello, world", b"PK\x03\x04" + b"\x00" * 100, build_zip([("handler.py", b"x" * 1000)])[:-30]],
)
def test_not_a_zip(parent: Path, data: bytes) -> None:
    assert_rejected(data, parent, "not a valid zip")


def test_zip_without_files(parent: Path) -> None:
    assert_rejected(build_zip([]), parent, "no files")
    assert_rejected(build_zip([("empty/", b"")]), parent, "no files")


# --- sizes and bombs --------------------------------------------------------------------------------


def test_too_many_entries(parent: Path) -> None:
    data = build_zip([(f"f{i}.py", b"x") for i in range(11)])
    assert_rejected(data, parent, "11 entries; at most 10", ZipLimits(max_entries=10))
    assert len(extract_zip(io.BytesIO(data), parent / "ok", ZipLimits(max_entries=11))) == 11


def test_total_size(parent: Path) -> None:
    data = build_zip([("a.bin", os.urandom(600)), ("b.bin", os.urandom(600))], zipfile.ZIP_STORED)
    assert_rejected(data, parent, "more than 1000 bytes.*'b.bin'", ZipLimits(max_total_bytes=1000))


def test_single_file_size(parent: Path) -> None:
    data = build_zip([("big.bin", os.urandom(2000))], zipfile.ZIP_STORED)
    assert_rejected(data, parent, "'big.bin' is 2000 bytes", ZipLimits(max_file_bytes=1000))


def test_high_ratio_entry_is_stopped(parent: Path) -> None:
    data = build_zip([("handler.py", b"x"), ("zeros.bin", bytes(8 * MIB))])
    assert len(data) < 100_000
    assert_rejected(data, parent, "'zeros.bin' compresses .*zip bomb")


def test_compressible_but_reasonable_files_pass(parent: Path) -> None:
    text = b"".join(b"line %d: some source code that repeats a bit\n" % i for i in range(60_000))
    assert len(text) > 2 * MIB
    assert extract_zip(io.BytesIO(build_zip([("big.js", text)])), parent / "fn") == ["big.js"]


def test_lying_size_header_is_stopped(parent: Path) -> None:
    """The headers claim 100 bytes; the deflate stream holds 3 MiB. It must not be written out."""
    honest = build_zip([("bomb.txt", b"A" * (3 * MIB))])
    lying = patch_headers(honest, file_size=100)
    with zipfile.ZipFile(io.BytesIO(lying)) as zf:
        assert zf.getinfo("bomb.txt").file_size == 100
    for limits in (None, ZipLimits(max_total_bytes=1000, max_file_bytes=1000)):
        assert_rejected(lying, parent, "'bomb.txt'", limits)


def test_byte_budget_counts_what_is_written() -> None:
    """The count that guards extraction does not look at headers at all."""
    limits = ZipLimits(max_total_bytes=150_000, max_file_bytes=100_000, max_ratio=1e9)

    single = io.BytesIO()
    with pytest.raises(ZipRejected, match="'b' expands beyond 100000"):
        copy_bounded(io.BytesIO(os.urandom(300_000)), single, "'b'", 300_000, ByteBudget(limits))
    assert len(single.getvalue()) <= limits.max_file_bytes

    budget = ByteBudget(limits)
    total = io.BytesIO()
    assert copy_bounded(io.BytesIO(os.urandom(90_000)), total, "'a'", 90_000, budget) == 90_000
    with pytest.raises(ZipRejected, match=r"more than 150000 bytes .*'c'"):
        copy_bounded(io.BytesIO(os.urandom(90_000)), total, "'c'", 90_000, budget)
    assert len(total.getvalue()) <= limits.max_total_bytes

    with pytest.raises(ZipRejected, match=r"'z' compresses .*zip bomb"):
        copy_bounded(io.BytesIO(bytes(2 * MIB)), io.BytesIO(), "'z'", 1000, ByteBudget(ZipLimits(max_ratio=10)))


def test_nested_zip_is_stored_not_extracted(parent: Path) -> None:
    """A 42.zip-style archive: the inner bomb stays a compressed file; nothing recurses into it."""
    inner = build_zip([(f"layer{i}.bin", bytes(4 * MIB)) for i in range(4)])
    middle = build_zip([(f"inner{i}.zip", inner) for i in range(4)])
    dest = parent / "fn"
    assert extract_zip(io.BytesIO(build_zip([("handler.py", b"x"), ("bomb.zip", middle)])), dest) == [
        "bomb.zip",
        "handler.py",
    ]
    assert (dest / "bomb.zip").read_bytes() == middle
    assert sum(f.stat().st_size for f in dest.rglob("*")) < 1 * MIB
    assert not list(dest.rglob("*.bin"))


# --- reading code back ------------------------------------------------------------------------------


def test_read_source_files(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "lib").mkdir(parents=True)
    (code / "handler.py").write_text("def handle(e):\n    return 'héllo'\n", encoding="utf-8")
    (code / "lib/util.py").write_text("X = 1\n")
    (code / "empty.txt").write_bytes(b"")
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
    (code / "logo.png").write_bytes(png)
    (code / "latin1.txt").write_bytes("café".encode("latin-1"))  # no NUL, but not UTF-8
    (code / "nul.txt").write_bytes(b"abc\x00def")
    (code / "link.py").symlink_to(code / "handler.py")
    (code / "lib" / "loop").symlink_to(code)
    files = read_source_files(code)
    assert [f["name"] for f in files] == [
        "empty.txt",
        "handler.py",
        "latin1.txt",
        "lib/util.py",
        "logo.png",
        "nul.txt",
    ]
    by_name = {f["name"]: f for f in files}
    assert by_name["handler.py"] == {
        "name": "handler.py",
        "content": "def handle(e):\n    return 'héllo'\n",
        "binary": False,
    }
    assert by_name["empty.txt"] == {"name": "empty.txt", "content": "", "binary": False}
    assert by_name["logo.png"]["binary"] is True
    assert base64.b64decode(by_name["logo.png"]["content"]) == png
    assert by_name["latin1.txt"]["binary"] is True
    assert base64.b64decode(by_name["nul.txt"]["content"]) == b"abc\x00def"
    assert read_source_files(code) == files


def test_read_source_files_after_extract(parent: Path) -> None:
    data = build_zip([("b.py", b"b"), ("a/z.py", b"z"), ("a/b/c.bin", b"\xff\x00")])
    extract_zip(io.BytesIO(data), parent / "fn")
    assert [(f["name"], f["binary"]) for f in read_source_files(parent / "fn")] == [
        ("a/b/c.bin", True),
        ("a/z.py", False),
        ("b.py", False),
    ]


def test_read_source_files_limits(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}.txt").write_text("x" * 100)
    assert len(read_source_files(tmp_path, max_files=5, max_bytes=500)) == 5
    with pytest.raises(ValidationError, match="more than 4 files"):
        read_source_files(tmp_path, max_files=4)
    with pytest.raises(ValidationError, match="larger than 499 bytes"):
        read_source_files(tmp_path, max_bytes=499)
