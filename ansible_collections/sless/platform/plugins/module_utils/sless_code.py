# -*- coding: utf-8 -*-
"""A function's source folder as a zip that is the same bytes for the same content.

Entries in sorted order, a fixed timestamp (1980-01-01, the earliest a zip can hold), fixed modes (0644,
0755 for executables), no folders of tools (``.git``, ``__pycache__``, ``node_modules``): so the SHA-256
of the archive, which the API keeps as the function's ``code_hash``, changes only when a file does, and
an unchanged folder is no change.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import io
import os
import zipfile

SKIPPED_DIRS = (".git", "__pycache__", "node_modules", ".venv")
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def source_files(folder):
    """(relative POSIX name, absolute path) of every regular file below FOLDER, sorted by name."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            found.append((rel, path))
    return sorted(found)


def zip_folder(folder):
    """(zip bytes, their SHA-256 hex) of FOLDER; ValueError when it holds no file."""
    files = source_files(folder)
    if not files:
        raise ValueError("%s holds no files" % folder)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for rel, path in files:
            info = zipfile.ZipInfo(rel, FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            executable = os.access(path, os.X_OK)
            info.external_attr = ((0o100755 if executable else 0o100644) & 0xFFFF) << 16
            info.create_system = 3  # Unix, so the modes above are read back
            with open(path, "rb") as source:
                archive.writestr(info, source.read())
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()
