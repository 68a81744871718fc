"""``python -m sless_operator.imagepush``: the last step of a build Job, the only one that holds the push credential.

kaniko runs the tenant's Dockerfile steps (``pip install``, ``npm install``: setup.py and install scripts) as
root in its own container, so whatever that container holds, a tenant can read. It therefore builds with
``--no-push`` into an image tarball on the Job's emptyDir and holds no credential; after it has exited (and
with it every process a build step left behind: it was its container's PID 1), this step, which runs no
tenant code, pushes the tarball to ``--destination`` with the registry credential (a Docker ``config.json``,
the ``SLESS_BUILD_REGISTRY_SECRET`` Secret) through the registry's HTTP API v2: a blob is uploaded only when
the repository lacks it (HEAD), in one PUT or, above ``--chunk-bytes``, in PATCHes, then the manifest is PUT.

The tarball is checked whole before anything is sent (``imagetar``). It is opened without following links:
a build step could have left a link to this container's credential there. Where the image goes comes from
the arguments only (the tarball's ``RepoTags`` is ignored), so a tenant's tarball reaches no other repository.
Messages never carry the credential or more than a short, quoted piece of what the tarball says.

Exit codes: 0 pushed (the termination message is ``{"image", "digest", "bytes", "uploaded", "mounted",
"existing"}``, blob counts),
1 refused or failed (the reason is the termination message, which the operator shows in the Function's
status), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import stat
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit

import requests

from sless_operator import podstep
from sless_operator.imagetar import CHUNK, Blob, Entry, TarballError, load_image, manifest_bytes, short

DEFAULT_MAX_BYTES = 1280 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 64 * 1024 * 1024
DEFAULT_RETRIES = 3
MAX_MANIFEST_BYTES = 1 << 20
#: Bound of any registry or token server answer that is read (errors, tokens): a hostile or broken server
#: cannot make the pusher hold more.
MAX_ANSWER_BYTES = 1 << 20

# distribution's reference grammar (path components and tag)
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_CHALLENGE_PARAM = re.compile(r'([A-Za-z]+)\s*=\s*"([^"]*)"')
T = TypeVar("T")


class PushError(Exception):
    """The image cannot be pushed: a refused tarball, a registry's refusal, no connection."""


class TransientError(PushError):
    """A failure that may pass: no connection, a connection cut, the registry's 5xx or 429. Tried again."""


def _failed(what: str, resp: requests.Response) -> PushError:
    """The error for an unexpected answer: transient for 5xx and 429, else final."""
    kind = TransientError if resp.status_code >= 500 or resp.status_code == 429 else PushError
    return kind(f"{what}: {_why(resp)}")


# -- the destination and its credentials -------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """``registry/repository:tag``, split as the distribution reference grammar does."""

    registry: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> Reference:
        name, _, tag = text.rpartition(":")
        if not name or "/" in tag or "@" in text:
            raise PushError(f"--destination {text!r} must be registry/repository:tag")
        first, sep, rest = name.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost"):
            registry, repository = first, rest
        else:  # Docker Hub's short names
            registry, repository = "registry-1.docker.io", name if sep else f"library/{name}"
        if not _REPOSITORY.fullmatch(repository) or not _TAG.fullmatch(tag):
            raise PushError(f"--destination {text!r} is not a valid repository and tag")
        return cls(registry, repository, tag)


@dataclass(frozen=True)
class Credential:
    """What a Docker config.json holds for one registry."""

    username: str = ""
    password: str = ""
    identity_token: str = ""
    registry_token: str = ""


_HUB_KEYS = {"registry-1.docker.io", "index.docker.io", "docker.io"}


def _config_key(key: str) -> str:
    """A config.json ``auths`` key (``https://host/v1/``, ``host:port``) as a bare ``host[:port]``."""
    if "://" not in key:
        key = "//" + key
    return (urlsplit(key).netloc or key).lower()


def credential_for(config: dict[str, Any], registry: str) -> Credential | None:
    """The credential config.json's ``auths`` holds for REGISTRY, or None (anonymous)."""
    auths = config.get("auths")
    auths = auths if isinstance(auths, dict) else {}
    wanted = {registry.lower()} | (_HUB_KEYS if registry in _HUB_KEYS else set())
    helpers = config.get("credHelpers")
    if config.get("credsStore") or (isinstance(helpers, dict) and wanted & {_config_key(str(k)) for k in helpers}):
        raise PushError(f"the registry credential for {registry} names a credential helper, which the push "
                        "step does not run: give it in 'auths'")  # fmt: skip
    for key, entry in auths.items():
        if not isinstance(key, str) or not isinstance(entry, dict) or _config_key(key) not in wanted:
            continue
        user, password = str(entry.get("username") or ""), str(entry.get("password") or "")
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(str(entry["auth"]), validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise PushError(f"the registry credential for {registry} has an 'auth' that is not "
                                "base64 of user:password") from None  # fmt: skip
        return Credential(user, password, str(entry.get("identitytoken") or ""),
                          str(entry.get("registrytoken") or ""))  # fmt: skip
    return None


def read_docker_config(path: Path | None) -> dict[str, Any]:
    """The Docker config.json at PATH ({} when not given or absent: push anonymously)."""
    if path is None or not path.exists():
        return {}
    try:
        raw = path.read_bytes()[:MAX_MANIFEST_BYTES + 1]
        if len(raw) > MAX_MANIFEST_BYTES:
            raise PushError(f"the registry credential file {path} is larger than {MAX_MANIFEST_BYTES} bytes")
        config = json.loads(raw)
    except (OSError, ValueError):  # never the content in a message: it is a credential
        raise PushError(f"the registry credential file {path} is not a readable Docker config.json") from None
    if not isinstance(config, dict):
        raise PushError(f"the registry credential file {path} is not a Docker config.json object")
    return config


# -- the registry ----------------------------------------------------------------------------------


def _read_bounded(resp: requests.Response, limit: int = MAX_ANSWER_BYTES) -> bytes:
    data = b""
    for chunk in resp.iter_content(65536):
        data += chunk
        if len(data) > limit:
            resp.close()
            raise PushError(f"{resp.url.split('?')[0]} answered more than {limit} bytes")
    return data


def _why(resp: requests.Response) -> str:
    """A registry error answer in one line: its status and the API's error codes and messages."""
    try:
        body = _read_bounded(resp, 64 * 1024)
        errors = json.loads(body).get("errors") or []
        told = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
    except (PushError, ValueError, AttributeError, requests.RequestException):
        told = ""
    return f"HTTP {resp.status_code}" + (f" ({short(told)})" if told else "")


class _Body:
    """A blob's bytes as a request body of known length, read from the tarball on demand."""

    def __init__(self, handle: IO[bytes], entry: Entry, start: int = 0, length: int | None = None) -> None:
        self._handle, self._pos = handle, entry.offset + start
        self._left = entry.size - start if length is None else length

    def __len__(self) -> int:
        return self._left

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        size = self._left if size is None or size < 0 else min(size, self._left)
        self._handle.seek(self._pos)
        data = self._handle.read(min(size, CHUNK))
        self._pos += len(data)
        self._left -= len(data)
        return data

    def __iter__(self) -> Iterator[bytes]:
        while data := self.read(CHUNK):
            yield data


@dataclass
class Registry:
    """One registry's HTTP API v2 for one repository, with the credential config.json gives it.

    Basic auth is sent as is; a Bearer challenge (``WWW-Authenticate``) is answered with a token for
    exactly the repositories this push touches (``repository:<name>:pull,push``, ``pull`` on mount
    sources), fetched again when it expires mid-push. The credential goes only to the registry's own
    host and its token server, never to a host an upload's ``Location`` points elsewhere.
    """

    reference: Reference
    credential: Credential | None
    insecure: bool = False
    timeout: float = 60.0
    mount_from: tuple[str, ...] = ()
    session: requests.Session = field(default_factory=requests.Session)
    base: str = ""
    _authorization: str = ""

    def __post_init__(self) -> None:
        self.session.trust_env = False  # no proxy or netrc credential from the environment
        self.session.headers["User-Agent"] = "sless-imagepush"

    # the connection and its authorization

    def connect(self) -> None:
        """Find the scheme (plain HTTP only when insecure and TLS fails) and answer the registry's challenge."""
        schemes = ("https", "http") if self.insecure else ("https",)
        last: Exception | None = None
        for scheme in schemes:
            url = f"{scheme}://{self.reference.registry}/v2/"
            try:
                resp = self.session.get(url, timeout=self.timeout, verify=not self.insecure, allow_redirects=False,
                                        stream=True)  # fmt: skip
                _read_bounded(resp)
            except requests.RequestException as exc:
                last = exc
                continue
            self.base = f"{scheme}://{self.reference.registry}"
            if resp.status_code == 401:
                self._authorize(resp)
                resp = self._send("GET", "/v2/")
            if resp.status_code != 200:
                raise _failed(f"{url} answered", resp)
            return
        raise TransientError(f"cannot reach the registry {self.reference.registry}: {short(str(last))}")

    def _authorize(self, challenge: requests.Response) -> None:
        header = challenge.headers.get("WWW-Authenticate", "")
        scheme = header.split(" ", 1)[0].lower()
        cred = self.credential
        if scheme == "basic":
            if cred is None or not cred.username:
                raise PushError(f"the registry {self.reference.registry} asks for a login and the push "
                                "credential holds none for it")  # fmt: skip
            pair = f"{cred.username}:{cred.password}".encode()
            self._authorization = "Basic " + base64.b64encode(pair).decode()
        elif scheme == "bearer":
            if cred is not None and cred.registry_token:
                self._authorization = f"Bearer {cred.registry_token}"
                return
            self._authorization = f"Bearer {self._token(dict(_CHALLENGE_PARAM.findall(header)))}"
        else:
            raise PushError(f"the registry {self.reference.registry} asks for an unknown authentication "
                            f"{short(header, 80)!r}")  # fmt: skip

    def _token(self, params: dict[str, str]) -> str:
        realm = params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise PushError(f"the registry {self.reference.registry} names no token server (realm)")
        if realm.startswith("http://") and not self.insecure:
            raise PushError(f"the registry's token server {realm} is plain HTTP; set SLESS_REGISTRY_INSECURE "
                            "to allow it")  # fmt: skip
        scopes = [f"repository:{self.reference.repository}:pull,push",
                  *(f"repository:{repo}:pull" for repo in self.mount_from)]  # fmt: skip
        query: list[tuple[str, str]] = [("scope", s) for s in scopes]
        if params.get("service"):
            query.insert(0, ("service", params["service"]))
        cred = self.credential
        try:
            if cred is not None and cred.identity_token:  # OAuth2 refresh token (docker login to some registries)
                form = dict(query[:1] if params.get("service") else [])
                form |= {"grant_type": "refresh_token", "refresh_token": cred.identity_token,
                         "client_id": "sless-imagepush", "scope": " ".join(scopes)}  # fmt: skip
                resp = self.session.post(realm, data=form, timeout=self.timeout, verify=not self.insecure,
                                         stream=True)  # fmt: skip
            else:
                auth = (cred.username, cred.password) if cred is not None and cred.username else None
                sep = "&" if "?" in realm else "?"
                resp = self.session.get(realm + sep + urlencode(query), auth=auth, timeout=self.timeout,
                                        verify=not self.insecure, stream=True)  # fmt: skip
        except requests.RequestException as exc:
            raise PushError(f"cannot reach the registry's token server: {short(str(exc))}") from None
        if resp.status_code != 200:
            raise PushError(f"the registry's token server refused the push credential: {_why(resp)}")
        try:
            answer = json.loads(_read_bounded(resp))
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise PushError("the registry's token server answered no token")
        return token

    def _url(self, path_or_url: str) -> str:
        return urljoin(self.base + "/", path_or_url)

    def _send(self, method: str, path_or_url: str, *, body: Any = None, headers: dict[str, str] | None = None,
              params: dict[str, str] | None = None, reauth: bool = True) -> requests.Response:  # fmt: skip
        """One request; a 401 (a token that expired mid-push) is answered once and the request sent again.

        BODY is bytes or a callable returning a fresh body (a blob read again for the repeat)."""
        url = self._url(path_or_url)
        if params:
            parts = urlsplit(url)
            url = urlunsplit(parts._replace(query="&".join(q for q in (parts.query, urlencode(params)) if q)))
        for attempt in (1, 2):
            sent = dict(headers or {})
            if self._authorization and urlsplit(url).netloc == urlsplit(self.base).netloc:
                sent["Authorization"] = self._authorization
            data = body() if callable(body) else body
            try:
                resp = self.session.request(method, url, data=data, headers=sent, timeout=self.timeout,
                                            verify=not self.insecure, allow_redirects=method == "HEAD",
                                            stream=True)  # fmt: skip
            except requests.RequestException as exc:
                raise TransientError(f"{method} {url.split('?')[0]}: {short(str(exc))}") from None
            if resp.status_code == 401 and reauth and attempt == 1:
                resp.close()
                self._authorize(resp)
                continue
            if resp.status_code < 400:  # read (bounded) so the connection serves the next request
                _read_bounded(resp)
            return resp
        return resp

    # blobs and manifests

    def has_blob(self, digest: str) -> bool:
        resp = self._send("HEAD", f"/v2/{self.reference.repository}/blobs/{digest}")
        if resp.status_code == 200:
            return True
        if resp.status_code == 404:
            return False
        raise _failed(f"checking blob {digest[:19]}", resp)

    def _start_upload(self, digest: str) -> str:
        """An upload session's URL, or "" when the blob was mounted from another repository instead."""
        path = f"/v2/{self.reference.repository}/blobs/uploads/"
        for source in self.mount_from:
            resp = self._send("POST", path, params={"mount": digest, "from": source})
            if resp.status_code == 201:
                return ""
            if resp.status_code == 202 and resp.headers.get("Location"):
                return self._url(resp.headers["Location"])  # not mounted: the upload goes on here
        resp = self._send("POST", path)
        if resp.status_code != 202 or not resp.headers.get("Location"):
            raise _failed(f"starting the upload of blob {digest[:19]}", resp)
        return self._url(resp.headers["Location"])

    def upload(self, handle: IO[bytes], blob: Blob, chunk_bytes: int) -> bool:
        """Upload BLOB: one PUT when it fits in CHUNK_BYTES, else PATCHes of CHUNK_BYTES and a closing PUT.

        Returns False when it was mounted from another repository instead (nothing sent)."""
        location = self._start_upload(blob.digest)
        if not location:
            return False
        octets = {"Content-Type": "application/octet-stream"}
        if blob.size <= chunk_bytes:
            resp = self._send("PUT", location, params={"digest": blob.digest}, headers=octets,
                              body=lambda: _Body(handle, blob.entry) if blob.size else b"")  # fmt: skip
        else:
            start = 0
            while start < blob.size:
                length = min(chunk_bytes, blob.size - start)
                ranged = octets | {"Content-Range": f"{start}-{start + length - 1}"}
                resp = self._send("PATCH", location, headers=ranged,
                                  body=lambda s=start, n=length: _Body(handle, blob.entry, s, n))  # fmt: skip
                if resp.status_code != 202 or not resp.headers.get("Location"):
                    raise _failed(f"uploading blob {blob.digest[:19]} (bytes {start}-)", resp)
                location = self._url(resp.headers["Location"])
                start += length
            resp = self._send("PUT", location, params={"digest": blob.digest}, headers={"Content-Length": "0"})
        if resp.status_code != 201:
            raise _failed(f"uploading blob {blob.digest[:19]}", resp)
        return True

    def put_manifest(self, manifest: bytes, media_type: str) -> str:
        """PUT the manifest under the tag; returns its digest."""
        resp = self._send("PUT", f"/v2/{self.reference.repository}/manifests/{self.reference.tag}",
                          body=manifest, headers={"Content-Type": media_type})  # fmt: skip
        if resp.status_code != 201:
            raise _failed(f"writing the manifest of {self.reference.repository}:{self.reference.tag}", resp)
        return "sha256:" + hashlib.sha256(manifest).hexdigest()


def retrying(step: Callable[[], T], retries: int, pause: float = 1.0) -> T:
    """STEP, tried again up to RETRIES times after a transient failure (pauses of PAUSE, doubled each time)."""
    for attempt in range(retries + 1):
        try:
            return step()
        except TransientError as exc:
            if attempt == retries:
                raise
            print(f"image push: {exc}; trying again ({attempt + 1} of {retries})", file=sys.stderr)
            time.sleep(pause * 2**attempt)
    raise AssertionError("unreachable")


def push(tarball: Path, registry: Registry, max_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
         retries: int = DEFAULT_RETRIES) -> dict[str, Any]:  # fmt: skip
    """Check TARBALL whole, then push its blobs (those the repository lacks) and its manifest; returns the result.

    Each step (connecting, one blob, the manifest) is tried again after a transient failure, as kaniko's
    ``--push-retry`` did: a blob's upload starts over in a new session."""
    try:
        fd = os.open(tarball, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:  # a link (ELOOP), missing, unreadable
        raise PushError(f"cannot open the image tarball {tarball}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise PushError(f"the image tarball {tarball} is not a regular file")
        if info.st_size > max_bytes:
            raise PushError(f"the image tarball is {info.st_size} bytes, more than the limit of {max_bytes}")
        image = load_image(handle, info.st_size)
        retrying(registry.connect, retries)
        counts = {"uploaded": 0, "mounted": 0, "existing": 0}
        done: set[str] = set()

        def sender(blob: Blob) -> Callable[[], str]:
            def send() -> str:
                if registry.has_blob(blob.digest):
                    return "existing"
                return "uploaded" if registry.upload(handle, blob, chunk_bytes) else "mounted"

            return send

        for blob in (*image.layers, image.config):
            if blob.digest not in done:
                done.add(blob.digest)
                counts[retrying(sender(blob), retries)] += 1
        digest = retrying(lambda: registry.put_manifest(manifest_bytes(image), image.manifest_type), retries)
    ref = registry.reference
    return {"image": f"{ref.registry}/{ref.repository}:{ref.tag}", "digest": digest,
            "bytes": sum(b.size for b in image.layers) + image.config.size, **counts}




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sless_operator.imagepush", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--tarball", required=True, type=Path, help="the image tarball kaniko wrote (--tar-path)")
    parser.add_argument("--destination", required=True, help="registry/repository:tag to push to")
    parser.add_argument("--docker-config", type=Path, help="Docker config.json with the push credential")
    parser.add_argument("--insecure", action="store_true", help="unverified TLS, else plain HTTP")
    parser.add_argument("--mount-from", action="append", default=[],
                        help="repository of the same registry to mount missing blobs from (the base image's)")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="size limit of the tarball")
    parser.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES,
                        help="blobs larger than this go up in PATCHes of this size")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    parser.add_argument("--retries", type=int, default=DEFAULT_RETRIES,
                        help="tries again of a step after a transient failure (no connection, 5xx, 429)")
    args = parser.parse_args(argv)
    if args.chunk_bytes < 1 or args.max_bytes < 1 or not 0 <= args.retries <= 10:
        podstep.report("image push: --chunk-bytes and --max-bytes must be positive, --retries 0..10")
        return 2
    try:
        reference = Reference.parse(args.destination)
        mounts = tuple(m for m in args.mount_from if _REPOSITORY.fullmatch(m) and m != reference.repository)
        credential = credential_for(read_docker_config(args.docker_config), reference.registry)
        registry = Registry(reference, credential, insecure=args.insecure, timeout=args.timeout, mount_from=mounts)
        result = push(args.tarball, registry, args.max_bytes, args.chunk_bytes, args.retries)
    except (PushError, TarballError) as exc:
        podstep.report(f"image push to {args.destination}: {exc}")
        return 1
    except Exception as exc:  # a message in the Function's status, not only a traceback
        traceback.print_exc()
        podstep.report(f"image push to {args.destination}: unexpected {type(exc).__name__}: {short(str(exc))}")
        return 1
    print(f"pushed {result['image']} ({result['digest']}, {result['uploaded']} blobs uploaded, "
          f"{result['mounted']} mounted, {result['existing']} already there)", file=sys.stderr)  # fmt: skip
    return podstep.succeed(result)


if __name__ == "__main__":
    sys.exit(main())
