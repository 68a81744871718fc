"""Tenant and object naming: deterministic, so every component derives the same name for the same thing."""

from __future__ import annotations

import hashlib
import re

from sless_core.errors import ValidationError

TENANT_PREFIX = "sless-"
# Patterns are used with fullmatch: "$" alone would accept a trailing newline.
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_MAX = 63
# Our own child objects append suffixes ("-build-<hash>", "-cron"), so user names keep room for them.
NAME_MAX = 40
NAMESPACE_PATTERN = re.compile(r"sless-[0-9a-f]{16}")


def tenant_namespace(sub: str) -> str:
    """The namespace of the tenant whose token carries ``sub``: first 8 bytes of SHA-256, hex."""
    if not sub:
        raise ValidationError("token has no subject", field="sub")
    return TENANT_PREFIX + hashlib.sha256(sub.encode("utf-8")).hexdigest()[:16]


def validate_name(value: object, field: str = "name") -> str:
    """A DNS-1123 label short enough for our suffixed child names."""
    if not isinstance(value, str) or not value:
        raise ValidationError(f"{field} is required and must be a string", field=field)
    if len(value) > NAME_MAX:
        raise ValidationError(f"{field} must be at most {NAME_MAX} characters", field=field)
    if not DNS1123_LABEL.fullmatch(value):
        raise ValidationError(
            f"{field} must be a DNS-1123 label: lower-case letters, digits and '-', "
            "starting and ending with a letter or digit",
            field=field,
        )
    return value


def is_function_name(value: object) -> bool:
    """Whether VALUE is a name ``validate_name`` accepts (for callers that answer 404, not 400)."""
    return isinstance(value, str) and len(value) <= NAME_MAX and DNS1123_LABEL.fullmatch(value) is not None


def is_tenant_namespace(value: object) -> bool:
    """Whether VALUE is a tenant namespace: ``sless-`` + 16 lowercase hex digits, nothing else."""
    return isinstance(value, str) and NAMESPACE_PATTERN.fullmatch(value) is not None


def validate_namespace(value: object, field: str = "namespace") -> str:
    """A tenant namespace, for everyone (admins too): ``kube-system``, ``default`` or ``..`` never are."""
    if not is_tenant_namespace(value):
        raise ValidationError(f"{field} must be a tenant namespace: 'sless-' and 16 lower-case hex digits",
                              field=field)
    assert isinstance(value, str)
    return value


def secret_object_name(name: str) -> str:
    """The Kubernetes Secret holding the tenant secret NAME (validated first): a prefix of the platform's
    own, so no tenant name can collide with another Secret in the namespace."""
    return f"sless-secret-{validate_name(name)}"
