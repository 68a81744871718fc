"""Object keys: the layout of code archives in the store, and the rules every key obeys.

Keys are relative, slash-separated paths. The same rules hold for the local directory
and for S3 so code moves between backends unchanged, and so a key built from a tenant's
input can never address anything outside the store's root (``..``, absolute paths,
backslashes, hidden segments and control characters are refused).
"""

from __future__ import annotations

import re

#: One path segment: no slash, backslash, NUL or other control character, not hidden.
_BAD_CHARS = re.compile(r"[\\\x00-\x1f\x7f]")
MAX_KEY_LENGTH = 1024


class StorageError(Exception):
    """A code store operation failed."""


class InvalidKeyError(StorageError, ValueError):
    """A key or prefix breaks the key rules (it could escape the store's root)."""


class ObjectNotFoundError(StorageError, LookupError):
    """No object is stored under the key."""


def _check_segments(value: str, segments: list[str], what: str) -> None:
    for segment in segments:
        if segment in ("", ".", ".."):
            raise InvalidKeyError(f"{what} {value!r} has an empty, '.' or '..' segment")
        if segment.startswith("."):
            raise InvalidKeyError(f"{what} {value!r} has a hidden segment {segment!r}")


def validate_key(key: str) -> str:
    """Return KEY unchanged if it is a safe object key, else raise InvalidKeyError."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError("an object key must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(f"object key longer than {MAX_KEY_LENGTH} characters")
    if _BAD_CHARS.search(key):
        raise InvalidKeyError(f"object key {key!r} contains a backslash or control character")
    if key.startswith("/") or key.endswith("/"):
        raise InvalidKeyError(f"object key {key!r} must be relative and name an object, not a folder")
    _check_segments(key, key.split("/"), "object key")
    return key


def validate_prefix(prefix: str) -> str:
    """Return PREFIX if it is a safe listing prefix ("" means everything).

    A prefix is matched as a string, S3-style (``functions/ns/fn/`` or ``functions/ns/f``),
    so only its complete segments are checked; the last, partial segment must merely not
    be a traversal.
    """
    if not isinstance(prefix, str):
        raise InvalidKeyError("a prefix must be a string")
    if prefix == "":
        return prefix
    if len(prefix) > MAX_KEY_LENGTH or _BAD_CHARS.search(prefix) or prefix.startswith("/"):
        raise InvalidKeyError(f"prefix {prefix!r} is absolute, too long or has a backslash/control character")
    *complete, last = prefix.split("/")
    _check_segments(prefix, complete, "prefix")
    if last in (".", "..") or last.startswith(".."):
        raise InvalidKeyError(f"prefix {prefix!r} ends in a traversal")
    return prefix


def _segment(value: str, what: str) -> str:
    text = str(value)
    if not text or "/" in text:
        raise InvalidKeyError(f"{what} {text!r} must be a non-empty name without '/'")
    return text


def zip_key(namespace: str, name: str, ts: int | str) -> str:
    """``functions/{ns}/{name}/{ts}.zip``: the uploaded archive, exactly as received."""
    parts = (_segment(namespace, "namespace"), _segment(name, "name"), _segment(str(ts), "timestamp"))
    return validate_key("functions/{}/{}/{}.zip".format(*parts))


def context_key(namespace: str, name: str, ts: int | str) -> str:
    """``contexts/{ns}/{name}/{ts}.tar.gz``: the build context (user files + Dockerfile)."""
    parts = (_segment(namespace, "namespace"), _segment(name, "name"), _segment(str(ts), "timestamp"))
    return validate_key("contexts/{}/{}/{}.tar.gz".format(*parts))


def code_key(namespace: str, name: str, ts: int | str) -> str:
    """``code/{ns}/{name}/{ts}.tar.gz``: the code alone, as a function pod fetches it at start."""
    parts = (_segment(namespace, "namespace"), _segment(name, "name"), _segment(str(ts), "timestamp"))
    return validate_key("code/{}/{}/{}.tar.gz".format(*parts))


def function_prefixes(namespace: str, name: str) -> tuple[str, str, str, str]:
    """The prefixes holding everything stored for one function (to delete it with the function).

    ``binaries/{ns}/{fn}/{stamp}-{digest}.tar.gz`` are a Go function's compiled binaries, written by its
    compile Job through a URL the operator signs (``sless_operator.manifests.binary_key``); their names
    sort like the code they were compiled from, so pruning keeps the binaries of the versions it keeps.
    """
    ns, fn = _segment(namespace, "namespace"), _segment(name, "name")
    return (validate_prefix(f"functions/{ns}/{fn}/"), validate_prefix(f"contexts/{ns}/{fn}/"),
            validate_prefix(f"code/{ns}/{fn}/"), validate_prefix(f"binaries/{ns}/{fn}/"))
