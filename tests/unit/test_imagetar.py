"""The push step's reading of kaniko's image tarball: what it accepts, and every hostile tarball it refuses.

A build step runs as root beside the path kaniko writes the tarball to, so the tarball is untrusted: each
refusal here is a clear one-line termination message and exit code 1, never a traceback, and happens
before a byte is sent (the destination is a closed loopback port: any connection attempt would fail
differently). The pushes themselves, against a real registry, are in tests/integration/test_imagepush.py.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from sless_operator import imagepush, imagetar, podstep
from tests.support.imagetarball import ImageTarball, config_for, layer

NOWHERE = "127.0.0.1:9/sless/ns/fn:tag"  # discard port: nothing listens


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tarball: Path, *extra: str) -> tuple[int, str]:
    """imagepush's command line as the push step runs it; its exit code and termination message."""
    term = tmp_path / "termination-log"
    monkeypatch.setattr(podstep, "TERMINATION_LOG", term)
    code = imagepush.main([f"--tarball={tarball}", f"--destination={NOWHERE}", "--insecure", "--timeout=5", *extra])
    return code, term.read_text() if term.exists() else ""


def load(path: Path) -> imagetar.Image:
    with open(path, "rb") as handle:
        return imagetar.load_image(handle, os.fstat(handle.fileno()).st_size)


def test_a_tarball_in_kanikos_layout_gives_its_config_and_layers_with_dockers_media_types(tmp_path: Path) -> None:
    one, two = layer({"app/a.txt": b"a"}), layer({"app/b.txt": b"b" * 5000})
    spec = ImageTarball([one, two, one])  # the same layer twice: listed twice, stored once
    image = load(spec.write(tmp_path / "image.tar"))
    assert image.config.digest == spec.config_name and image.config.size == len(spec.config)
    assert [b.digest for b in image.layers] == [f"sha256:{n.removesuffix('.tar.gz')}" for n in spec.layer_names()]
    assert [b.size for b in image.layers] == [len(one), len(two), len(one)]
    assert image.manifest_type == imagetar.DOCKER_MANIFEST
    assert {b.media_type for b in image.layers} == {imagetar.DOCKER_GZIP_LAYER}
    manifest = json.loads(imagetar.manifest_bytes(image))
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == imagetar.DOCKER_MANIFEST
    assert manifest["config"] == {"mediaType": imagetar.DOCKER_CONFIG, "size": len(spec.config),
                                  "digest": spec.config_name}  # fmt: skip
    assert len(manifest["layers"]) == 3


def test_a_layer_that_is_not_gzip_makes_it_an_oci_image(tmp_path: Path) -> None:
    plain = gzip.decompress(layer({"x": b"x"}))  # an uncompressed tar layer
    spec = ImageTarball([plain], config=json.dumps({"rootfs": {"type": "layers", "diff_ids": ["sha256:" + "0" * 64]}})
                        .encode())  # fmt: skip
    image = load(spec.write(tmp_path / "image.tar"))
    assert image.manifest_type == imagetar.OCI_MANIFEST
    assert image.config.media_type == imagetar.OCI_CONFIG
    assert image.layers[0].media_type == imagetar.OCI_LAYERS["tar"]


def _spoiled(tmp_path: Path) -> dict[str, Path]:
    """One tarball per way a build step could spoil it."""
    good = ImageTarball([layer({"a": b"a"})])
    out: dict[str, Path] = {}

    def put(name: str, spec: ImageTarball) -> None:
        out[name] = spec.write(tmp_path / f"{name}.tar")

    put("no manifest", ImageTarball([layer({"a": b"a"})], manifest=b""))
    with tarfile.open(tmp_path / "no-manifest.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(good.config_name)
        info.size = len(good.config)
        tar.addfile(info, io.BytesIO(good.config))
    out["no manifest"] = tmp_path / "no-manifest.tar"
    put("manifest not JSON", ImageTarball([layer({"a": b"a"})], manifest=b"[{"))
    put("two images", ImageTarball([layer({"a": b"a"})], manifest=json.dumps([{}, {}]).encode()))
    huge = b"[" + b" " * (imagetar.MAX_MANIFEST_BYTES + 1) + b"]"
    put("huge manifest", ImageTarball([layer({"a": b"a"})], manifest=huge))
    deep = b"[" * 100_000 + b"]" * 100_000
    put("deep manifest", ImageTarball([layer({"a": b"a"})], manifest=deep))
    out["altered layer"] = _renamed_layer(tmp_path, good, layer({"a": b"evil"}))
    put("config names other layers", ImageTarball([layer({"a": b"a"})], config=config_for([])))
    put("foreign layers", ImageTarball([layer({"a": b"a"})], manifest=json.dumps([{
        "Config": good.config_name, "Layers": good.layer_names(), "LayerSources": {"x": {}}}]).encode()))
    put("layer outside the tarball", ImageTarball([layer({"a": b"a"})], manifest=json.dumps([{
        "Config": good.config_name, "Layers": ["../../etc/passwd"]}]).encode()))
    put("missing layer", ImageTarball([layer({"a": b"a"})], manifest=json.dumps([{
        "Config": good.config_name, "Layers": ["ab" * 32 + ".tar.gz"]}]).encode()))
    with tarfile.open(tmp_path / "link.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/run/sless/registry/config.json"
        tar.addfile(info)
    out["symlink entry"] = tmp_path / "link.tar"
    with tarfile.open(tmp_path / "path.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("../manifest.json")
        tar.addfile(info, io.BytesIO(b""))
    out["path entry"] = tmp_path / "path.tar"
    whole = good.write(tmp_path / "whole.tar").read_bytes()
    (tmp_path / "cut.tar").write_bytes(whole[: whole.index(b"manifest.json\0") + imagetar.BLOCK + 3])
    out["cut short"] = tmp_path / "cut.tar"
    damaged = bytearray(whole)
    damaged[0] ^= 0xFF  # the first header's name, so its checksum no longer matches
    (tmp_path / "damaged.tar").write_bytes(bytes(damaged))
    out["damaged header"] = tmp_path / "damaged.tar"
    (tmp_path / "garbage.tar").write_bytes(os.urandom(4096))
    out["garbage"] = tmp_path / "garbage.tar"
    (tmp_path / "empty.tar").write_bytes(b"")
    out["empty file"] = tmp_path / "empty.tar"
    return out


def _renamed_layer(tmp_path: Path, good: ImageTarball, content: bytes) -> Path:
    """GOOD's tarball with CONTENT stored under its layer's name (a layer that does not match its digest)."""
    path = tmp_path / "altered.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in ((good.config_name, good.config), (good.layer_names()[0], content),
                           ("manifest.json", good.manifest_json())):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


EXPECTED = {
    "no manifest": "no manifest.json",
    "manifest not JSON": "manifest.json is not JSON",
    "two images": "exactly one image",
    "huge manifest": "larger than",
    "deep manifest": "manifest.json is not JSON",
    "altered layer": "does not match its digest",
    "config names other layers": "does not list its 1 layers",
    "foreign layers": "foreign",
    "layer outside the tarball": "not <sha256 hex>.tar.gz",
    "missing layer": "lacks",
    "symlink entry": "not a regular file",
    "path entry": "unexpected path",
    "cut short": "runs past the end",
    "damaged header": "damaged header",
    "garbage": "damaged header",
    "empty file": "cut short",
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_a_spoiled_tarball_is_refused_with_a_clear_message_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    code, message = run(tmp_path, monkeypatch, _spoiled(tmp_path)[case])
    assert code == 1, message
    assert message.startswith(f"image push to {NOWHERE}: "), message
    assert EXPECTED[case] in message, message
    assert "Traceback" not in capsys.readouterr().err and len(message) < 1000


def test_a_link_or_a_fifo_at_the_tarball_path_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build step could leave a link to the push step's own credential where the tarball belongs."""
    secret = tmp_path / "config.json"
    secret.write_text(json.dumps({"auths": {"127.0.0.1:9": {"auth": "c2VjcmV0OnNlY3JldA=="}}}))
    link = tmp_path / "image.tar"
    link.symlink_to(secret)
    code, message = run(tmp_path, monkeypatch, link, f"--docker-config={secret}")
    assert code == 1 and "cannot open the image tarball" in message, message
    assert "c2VjcmV0" not in message and "secret" not in message.split(":", 1)[1].replace(str(tmp_path), "")
    fifo = tmp_path / "fifo.tar"
    os.mkfifo(fifo)
    code, message = run(tmp_path, monkeypatch, fifo)
    assert code == 1 and "not a regular file" in message, message


def test_a_tarball_over_the_size_limit_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ImageTarball([layer({"big": os.urandom(20_000)})]).write(tmp_path / "image.tar")
    code, message = run(tmp_path, monkeypatch, path, "--max-bytes=10000")
    assert code == 1 and "more than the limit of 10000" in message, message


def test_more_entries_than_the_bound_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ImageTarball([layer({"a": b"a"})], extra={f"junk{i}": b"" for i in range(imagetar.MAX_ENTRIES)})
    code, message = run(tmp_path, monkeypatch, spec.write(tmp_path / "image.tar"))
    assert code == 1 and f"more than {imagetar.MAX_ENTRIES} entries" in message, message


@pytest.mark.parametrize("destination", ["registry.test/repo", "registry.test/Repo:tag", "registry.test/r:t@sha256:1",
                                         "registry.test/r:bad/tag"])  # fmt: skip
def test_a_destination_that_is_not_repository_and_tag_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, destination: str
) -> None:
    path = ImageTarball([layer({"a": b"a"})]).write(tmp_path / "image.tar")
    term = tmp_path / "termination-log"
    monkeypatch.setattr(podstep, "TERMINATION_LOG", term)
    assert imagepush.main([f"--tarball={path}", f"--destination={destination}"]) == 1
    assert "--destination" in term.read_text()


def test_credentials_are_found_by_registry_host_in_every_spelling_docker_writes() -> None:
    basic = {"auth": "dXNlcjpwYXNz"}  # user:pass
    for key in ("registry.test:5000", "https://registry.test:5000", "http://registry.test:5000/v1/"):
        found = imagepush.credential_for({"auths": {key: basic}}, "registry.test:5000")
        assert found == imagepush.Credential("user", "pass"), key
    assert imagepush.credential_for({"auths": {"other.test:5000": basic}}, "registry.test:5000") is None
    assert imagepush.credential_for({}, "registry.test:5000") is None
    hub = imagepush.credential_for({"auths": {"https://index.docker.io/v1/": basic}}, "registry-1.docker.io")
    assert hub == imagepush.Credential("user", "pass")
    fields = imagepush.credential_for({"auths": {"r.test": {"username": "u", "password": "p",
                                                           "identitytoken": "i"}}}, "r.test")  # fmt: skip
    assert fields == imagepush.Credential("u", "p", "i")
    with pytest.raises(imagepush.PushError, match="not base64"):
        imagepush.credential_for({"auths": {"r.test": {"auth": "%%%"}}}, "r.test")
    with pytest.raises(imagepush.PushError, match="credential helper"):
        imagepush.credential_for({"credHelpers": {"r.test": "ecr-login"}}, "r.test")


def test_an_unreadable_credential_file_is_named_without_its_content(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"auths": {"r.test": {"auth": "c2VjcmV0"')  # cut short
    with pytest.raises(imagepush.PushError) as caught:
        imagepush.read_docker_config(path)
    assert "c2VjcmV0" not in str(caught.value) and "not a readable Docker config.json" in str(caught.value)
    assert imagepush.read_docker_config(tmp_path / "absent.json") == {}


def test_references_split_like_distributions_grammar() -> None:
    ref = imagepush.Reference.parse("10.199.0.1:5000/sless/sless-0123456789abcdef/deps:" + "a" * 32)
    assert (ref.registry, ref.repository, ref.tag) == ("10.199.0.1:5000", "sless/sless-0123456789abcdef/deps",
                                                       "a" * 32)  # fmt: skip
    assert imagepush.Reference.parse("localhost/x:1").registry == "localhost"
    assert imagepush.Reference.parse("busybox:1").repository == "library/busybox"
