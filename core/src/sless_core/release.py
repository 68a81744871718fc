"""The platform's version, from one source: the ``version`` of ``pyproject.toml``, as installed.

The API's ``/health``, ``sless --version`` and the operator's start-up line all read it here, so a rolling
upgrade can be followed pod by pod (and a mixed-version moment is visible), and the chart's ``appVersion``
(its image tag) is held to the same string by a test. How a release is cut and recorded: ``RELEASES`` and
``scripts/release.sh``.
"""

from __future__ import annotations

from importlib import metadata

#: What a process reports when the package's metadata cannot be read (run from a source tree not installed).
UNKNOWN = "0+unknown"


def platform_version() -> str:
    """The installed ``sless`` distribution's version (PEP 440, e.g. ``0.2.0.dev0``)."""
    try:
        return metadata.version("sless")
    except metadata.PackageNotFoundError:
        return UNKNOWN


def semver(pep440: str) -> str:
    """The chart's spelling of a PEP 440 version: ``0.2.0.dev0`` -> ``0.2.0-dev.0``, ``0.2.0rc1`` ->
    ``0.2.0-rc.1``, a final release unchanged (Helm wants SemVer 2; Python packaging wants PEP 440)."""
    for marker, label in ((".dev", "dev"), ("rc", "rc"), ("b", "beta"), ("a", "alpha")):
        base, sep, number = pep440.partition(marker)
        if sep and base and number.isdigit() and base[-1].isdigit():
            return f"{base}-{label}.{number}"
    return pep440
