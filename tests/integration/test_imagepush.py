"""The build's push step against a real registry: the distribution registry the real node's test bed builds.

Each test starts ``registry serve`` on loopback with its own storage: without authentication (the test
bed's registry), with ``auth: htpasswd`` (bcrypt hashes, Basic auth) and with ``auth: token`` (a token
server in the test issuing JWTs the registry verifies against its root certificate: the Bearer challenge
of ``WWW-Authenticate``). ``imagepush`` runs as the push step does, as a command line; what it pushed is
read back over the registry's API. The binary comes from the test bed's cache
(``tests/testbed/build-realnode.sh --check``); without it these tests skip.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import http.server
import json
import os
import socket
import struct
import subprocess
import threading
import time
import urllib.parse
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from sless_operator import imagepush, podstep
from tests.support.imagetarball import ImageTarball, layer
from tests.support.services import free_port

ROOT = Path(__file__).resolve().parents[2]
ACCEPT = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                    "application/vnd.oci.image.manifest.v1+json"])  # fmt: skip
USER, PASSWORD = "pusher", "correct horse battery staple"


@pytest.fixture(scope="module")
def registry_bin() -> Path:
    found = subprocess.run(["bash", str(ROOT / "tests/testbed/build-realnode.sh"), "--check"], capture_output=True,
                           text=True, check=False, timeout=60)  # fmt: skip
    if found.returncode != 0:
        pytest.skip("the real node's registry binary is not built (tests/testbed/testbed build --real-node)")
    return Path(found.stdout.strip()) / "registry"


@dataclass
class Registry:
    """A running registry: its address and how to read it back."""

    addr: str
    auth: tuple[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def get(self, path: str, **headers: str) -> requests.Response:
        return requests.get(f"http://{self.addr}{path}", auth=self.auth, headers=self.headers | headers, timeout=10)


@contextlib.contextmanager
def registry(registry_bin: Path, work: Path, auth: str = "") -> Iterator[str]:
    """``registry serve`` on 127.0.0.1 with AUTH (a YAML ``auth:`` block, or none); yields host:port."""
    port = free_port()
    storage = work / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    config = work / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\n"
                      f"storage:\n  filesystem:\n    rootdirectory: {storage}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n{auth}")  # fmt: skip
    env = os.environ | {"OTEL_TRACES_EXPORTER": "none", "OTEL_SDK_DISABLED": "true"}
    log = work / "registry.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(registry_bin), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                if requests.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code in (200, 401):
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def push(tmp_path: Path, tarball: Path, destination: str, *extra: str, config: dict[str, Any] | None = None
         ) -> tuple[int, dict[str, Any] | str]:  # fmt: skip
    """imagepush's command line as the push step runs it: exit code and the termination message (parsed on 0)."""
    term = tmp_path / f"termination-{time.monotonic_ns()}"
    args = [f"--tarball={tarball}", f"--destination={destination}", "--insecure", "--timeout=30", *extra]
    if config is not None:
        docker = tmp_path / "config.json"
        docker.write_text(json.dumps(config))
        args.append(f"--docker-config={docker}")
    saved = podstep.TERMINATION_LOG
    podstep.TERMINATION_LOG = term
    try:
        code = imagepush.main(args)
    finally:
        podstep.TERMINATION_LOG = saved
    text = term.read_text()
    return code, json.loads(text) if code == 0 else text


def check_pushed(reg: Registry, repository: str, tag: str, spec: ImageTarball, result: dict[str, Any]) -> None:
    """The registry serves the manifest the push reported, and every blob with the tarball's bytes."""
    resp = reg.get(f"/v2/{repository}/manifests/{tag}", Accept=ACCEPT)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Docker-Content-Digest"] == result["digest"]
    assert "sha256:" + hashlib.sha256(resp.content).hexdigest() == result["digest"]
    manifest = resp.json()
    assert manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert manifest["config"]["digest"] == spec.config_name
    assert reg.get(f"/v2/{repository}/blobs/{spec.config_name}").content == spec.config
    assert [d["digest"] for d in manifest["layers"]] == [f"sha256:{n[:64]}" for n in spec.layer_names()]
    for described, data in zip(manifest["layers"], spec.layers, strict=True):
        assert described["size"] == len(data)
        assert reg.get(f"/v2/{repository}/blobs/{described['digest']}").content == data


def test_an_image_goes_to_an_open_registry_in_one_put_or_in_chunks_and_again_uploads_nothing(
    registry_bin: Path, tmp_path: Path
) -> None:
    small, big = layer({"app/handler.py": b"def handle(e):\n    return e\n"}), layer({"blob": os.urandom(300_000)})
    spec = ImageTarball([small, big])
    tarball = spec.write(tmp_path / "image.tar")
    with registry(registry_bin, tmp_path / "reg") as addr:
        reg = Registry(addr)
        # a chunk size below the big layer: it goes up in PATCHes of 64 KiB, the rest in one PUT each
        code, result = push(tmp_path, tarball, f"{addr}/sless/sless-0123456789abcdef/deps:one", "--chunk-bytes=65536")
        assert code == 0, result
        assert isinstance(result, dict) and (result["uploaded"], result["mounted"], result["existing"]) == (3, 0, 0)
        assert result["image"] == f"{addr}/sless/sless-0123456789abcdef/deps:one"
        check_pushed(reg, "sless/sless-0123456789abcdef/deps", "one", spec, result)
        # the same image under another tag: every blob is there already
        code, again = push(tmp_path, tarball, f"{addr}/sless/sless-0123456789abcdef/deps:two")
        assert code == 0 and isinstance(again, dict), again
        assert (again["uploaded"], again["existing"], again["digest"]) == (0, 3, result["digest"])
        # another repository mounts the blobs from the first instead of uploading them
        code, mounted = push(tmp_path, tarball, f"{addr}/sless/other/fn:1",
                             "--mount-from=sless/sless-0123456789abcdef/deps")  # fmt: skip
        assert code == 0 and isinstance(mounted, dict), mounted
        assert (mounted["uploaded"], mounted["mounted"], mounted["existing"]) == (0, 3, 0), mounted
        check_pushed(reg, "sless/other/fn", "1", spec, mounted)


def test_the_push_goes_where_the_operator_says_not_where_the_tarball_says(registry_bin: Path, tmp_path: Path) -> None:
    with registry(registry_bin, tmp_path / "reg") as addr:
        spec = ImageTarball([layer({"x": b"x"})], tag=f"{addr}/sless/platform:latest")  # a hostile RepoTags
        code, result = push(tmp_path, spec.write(tmp_path / "image.tar"), f"{addr}/sless/tenant/fn:1")
        assert code == 0, result
        reg = Registry(addr)
        assert reg.get("/v2/sless/tenant/fn/manifests/1", Accept=ACCEPT).status_code == 200
        assert reg.get("/v2/sless/platform/manifests/latest", Accept=ACCEPT).status_code == 404


def _htpasswd(path: Path) -> None:
    with warnings.catch_warnings():  # the standard library's crypt: libxcrypt's bcrypt ($2b$), no extra package
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    hashed = crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))
    if not hashed or not hashed.startswith("$2"):
        pytest.skip("this libcrypt makes no bcrypt hashes")
    path.write_text(f"{USER}:{hashed}\n")


def test_a_registry_with_htpasswd_takes_the_push_with_the_basic_credential_and_refuses_it_without(
    registry_bin: Path, tmp_path: Path
) -> None:
    htpasswd = tmp_path / "htpasswd"
    _htpasswd(htpasswd)
    spec = ImageTarball([layer({"a": b"a" * 1000}), layer({"b": os.urandom(100_000)})])
    tarball = spec.write(tmp_path / "image.tar")
    auth = f"auth:\n  htpasswd:\n    realm: sless-test\n    path: {htpasswd}\n"
    with registry(registry_bin, tmp_path / "reg", auth) as addr:
        dest = f"{addr}/sless/sless-0123456789abcdef/hello:abc"
        code, message = push(tmp_path, tarball, dest)
        assert code == 1 and "asks for a login and the push credential holds none" in str(message), message
        wrong = {"auths": {addr: {"auth": base64.b64encode(f"{USER}:wrong".encode()).decode()}}}
        code, message = push(tmp_path, tarball, dest, config=wrong)
        assert code == 1 and "HTTP 401" in str(message), message
        assert "wrong" not in str(message) and base64.b64encode(b"pusher:wrong").decode() not in str(message)
        right = {"auths": {f"http://{addr}": {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}
        code, result = push(tmp_path, tarball, dest, "--chunk-bytes=40000", config=right)
        assert code == 0 and isinstance(result, dict), result
        check_pushed(Registry(addr, auth=(USER, PASSWORD)), "sless/sless-0123456789abcdef/hello", "abc", spec, result)
        assert Registry(addr).get("/v2/sless/sless-0123456789abcdef/hello/manifests/abc").status_code == 401
        # username and password fields instead of auth: the same
        fields = {"auths": {addr: {"username": USER, "password": PASSWORD}}}
        code, again = push(tmp_path, tarball, f"{addr}/sless/sless-0123456789abcdef/hello:def", config=fields)
        assert code == 0 and isinstance(again, dict) and again["existing"] == 3, again


@dataclass
class TokenServer:
    """A token server as distribution's ``auth: token`` expects: Basic login in, an RS256 JWT out.

    The JWT carries its certificate in ``x5c``; the registry trusts it through ``rootcertbundle``. Each
    request's scopes are kept, so a test can see what the push asked for.
    """

    key: Any
    cert_der: bytes
    port: int = 0
    scopes: list[list[str]] = field(default_factory=list)
    ttl: int = 300

    def token(self, scopes: list[str]) -> str:
        import jwt

        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {"iss": "sless-test-issuer", "sub": USER, "aud": "sless-test", "exp": now + self.ttl,
                  "nbf": now - 5, "iat": now, "jti": os.urandom(8).hex(), "access": access}  # fmt: skip
        headers = {"x5c": [base64.b64encode(self.cert_der).decode()]}
        return str(jwt.encode(claims, self.key, algorithm="RS256", headers=headers))


@contextlib.contextmanager
def token_server(work: Path) -> Iterator[tuple[TokenServer, Path]]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sless-test-token")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))  # fmt: skip
    bundle = work / "token-root.pem"
    bundle.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    server_state = TokenServer(key, cert.public_bytes(serialization.Encoding.DER))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            login = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            if self.headers.get("Authorization") != f"Basic {login}":
                self.send_response(401)
                self.end_headers()
                return
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            scopes = query.get("scope", [])
            server_state.scopes.append(scopes)
            body = json.dumps({"token": server_state.token(scopes), "expires_in": server_state.ttl}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_state, bundle
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_registry_behind_a_token_server_takes_a_token_scoped_to_the_one_repository(
    registry_bin: Path, tmp_path: Path
) -> None:
    spec = ImageTarball([layer({"t": os.urandom(50_000)})])
    tarball = spec.write(tmp_path / "image.tar")
    with token_server(tmp_path) as (tokens, bundle):
        auth = (f"auth:\n  token:\n    realm: http://127.0.0.1:{tokens.port}/token\n    service: sless-test\n"
                f"    issuer: sless-test-issuer\n    rootcertbundle: {bundle}\n")  # fmt: skip
        with registry(registry_bin, tmp_path / "reg", auth) as addr:
            dest = f"{addr}/sless/sless-0123456789abcdef/deps:tok"
            login = {"auths": {addr: {"username": USER, "password": PASSWORD}}}
            code, result = push(tmp_path, tarball, dest, config=login)
            assert code == 0 and isinstance(result, dict), result
            assert tokens.scopes == [["repository:sless/sless-0123456789abcdef/deps:pull,push"]]
            reader = Registry(addr, headers={"Authorization": "Bearer " + tokens.token(
                ["repository:sless/sless-0123456789abcdef/deps:pull"])})  # fmt: skip
            check_pushed(reader, "sless/sless-0123456789abcdef/deps", "tok", spec, result)
            # a wrong login: the token server's refusal is the message
            bad = {"auths": {addr: {"username": USER, "password": "nope"}}}
            code, message = push(tmp_path, tarball, dest, config=bad)
            assert code == 1 and "token server refused the push credential: HTTP 401" in str(message), message
            # a token the registry refuses: one fresh token is asked for, then the refusal is the message (no loop)
            tokens.ttl = -61  # already past distribution's 60 s leeway when issued
            asked = len(tokens.scopes)
            code, message = push(tmp_path, tarball, f"{addr}/sless/sless-0123456789abcdef/deps:late", config=login)
            assert code == 1 and "HTTP 401" in str(message), message
            assert len(tokens.scopes) - asked == 2, tokens.scopes


@contextlib.contextmanager
def flaky_proxy(upstream: str, reset_at_once: set[int], cut_once_after: int | None = None) -> Iterator[str]:
    """A TCP proxy on loopback to UPSTREAM whose Nth connection (1-based) is reset at once when N is in
    RESET_AT_ONCE; the first connection on which the client sends more than CUT_ONCE_AFTER bytes is reset
    there (once); yields its host:port."""
    host, port = upstream.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    count = 0
    stop = threading.Event()
    cut = threading.Event()

    def reset(*socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()

    def pump(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if limit is not None and sent + len(data) > limit and not cut.is_set():
                    cut.set()
                    reset(src, dst)
                    return
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        nonlocal count
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            count += 1
            if count in reset_at_once:
                reset(client)
                continue
            server = socket.create_connection((host, int(port)))
            threading.Thread(target=pump, args=(client, server, cut_once_after), daemon=True).start()
            threading.Thread(target=pump, args=(server, client, None), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def test_a_connection_refused_or_cut_mid_upload_is_tried_again_and_the_image_arrives_whole(
    registry_bin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What kaniko's --push-retry did: the first plain-HTTP connection is reset, a later one is cut 100 kB into
    the large layer's upload; the push starts that blob over and ends with every byte in place."""
    spec = ImageTarball([layer({"small": b"s"}), layer({"large": os.urandom(400_000)})])
    tarball = spec.write(tmp_path / "image.tar")
    with registry(registry_bin, tmp_path / "reg") as addr:
        # --insecure tries TLS first (connection 1), then plain HTTP: connection 2 is reset
        with flaky_proxy(addr, reset_at_once={2}, cut_once_after=100_000) as flaky:
            code, result = push(tmp_path, tarball, f"{flaky}/sless/ns/flaky:1")
        assert code == 0 and isinstance(result, dict), result
        assert (result["uploaded"], result["existing"]) == (3, 0), result
        err = capsys.readouterr().err
        assert err.count("trying again (1 of 3)") == 2, err
        check_pushed(Registry(addr), "sless/ns/flaky", "1", spec, result)
        # never more than --retries: a registry that stays away fails with the last reason
        with flaky_proxy(addr, reset_at_once=set(range(1, 100))) as gone:
            code, message = push(tmp_path, tarball, f"{gone}/sless/ns/flaky:2", "--retries=1")
        assert code == 1 and "cannot reach the registry" in str(message), message
