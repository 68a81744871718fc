#!/usr/bin/python
"""Seal a backup folder with its manifest, or verify one before a restore."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sless_backup_files import (
    BackupError,
    fsync_folder,
    inside,
    read_json,
    relative,
    sha256_file,
    write_json,
)

DOCUMENTATION = r"""
---
module: sless_backup_manifest
short_description: Seal a sless backup folder with its manifest, or verify one
description:
  - V(sealed) lists every file of the folder being written (O(path)) with its size and SHA-256, writes
    C(manifest.json) (what the backup holds, counts, versions) and only then renames the folder to O(dest):
    a folder named like a backup always has a complete manifest, an interrupted backup stays a hidden
    C(.partial) folder.
  - V(verified) reads the manifest of the backup O(path) and fails, changing nothing, when it is missing,
    not complete JSON, not of this format, or when a file it lists is missing, of another size or checksum, or
    a file is there that it does not list.
options:
  state:
    description: V(sealed) writes the manifest and renames the folder; V(verified) checks a backup.
    type: str
    choices: [sealed, verified]
    required: true
  path:
    description: The folder being written (V(sealed)) or the backup to check (V(verified)).
    type: path
    required: true
  dest:
    description: V(sealed), the backup's final folder (must not exist).
    type: path
  contents:
    description: V(sealed), what the backup holds (counts by part), recorded in the manifest.
    type: dict
    default: {}
  info:
    description: V(sealed), further facts recorded as they are (versions, the settings the parts were read with).
    type: dict
    default: {}
"""

RETURN = r"""
manifest:
  description: The manifest without its file list (format, created, contents, info), and C(files), the number of files.
  returned: always
  type: dict
path:
  description: The backup folder (V(sealed), the renamed one).
  returned: always
  type: str
"""

FORMAT = "sless-backup/1"
MANIFEST = "manifest.json"


def listed_files(root: Path) -> dict[str, dict[str, Any]]:
    """Every regular file below ROOT but the manifest, by relative name, with size and SHA-256; a symlink or any
    other kind of file is refused (a backup holds nothing else)."""
    files: dict[str, dict[str, Any]] = {}
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise BackupError(f"{path} is neither a regular file nor a folder")
        for name in names:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if rel == MANIFEST:
                continue
            digest, size = sha256_file(path)
            files[relative(rel, "file")] = {"sha256": digest, "size": size}
    return files


def seal(path: Path, dest: Path, contents: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    if not path.is_dir():
        raise BackupError(f"{path} is not a folder")
    if dest.exists():
        raise BackupError(f"{dest} exists already")
    from sless_core.release import platform_version, semver

    files = listed_files(path)
    info = {**info, "platform_version": platform_version(), "platform_version_semver": semver(platform_version())}
    manifest = {"format": FORMAT, "complete": True,
                "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "contents": contents, "info": info, "files": files}  # fmt: skip
    write_json(path / MANIFEST, manifest)
    fsync_folder(path)
    os.rename(path, dest)
    fsync_folder(dest.parent)
    return manifest


def verify(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise BackupError(f"no backup at {path}: not a folder")
    manifest = read_json(path / MANIFEST, "the backup's manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("complete") is not True:
        raise BackupError(f"{path / MANIFEST} is not a complete {FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("contents"), dict):
        raise BackupError(f"{path / MANIFEST} lists no files or no contents")
    wrong = []
    for name, want in sorted(files.items()):
        target = inside(path, name, "file")
        if not isinstance(want, dict) or not target.is_file() or target.is_symlink():
            wrong.append(f"{name} (missing)")
            continue
        digest, size = sha256_file(target)
        if (digest, size) != (want.get("sha256"), want.get("size")):
            wrong.append(f"{name} (size or checksum differs)")
    extra = sorted(set(listed_files(path)) - set(files))
    wrong += [f"{name} (not in the manifest)" for name in extra]
    if wrong:
        raise BackupError(f"the backup {path} does not match its manifest: {', '.join(wrong[:20])}"
                          + (f" and {len(wrong) - 20} more" if len(wrong) > 20 else ""))  # fmt: skip
    return manifest


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["sealed", "verified"], "required": True},
            "path": {"type": "path", "required": True},
            "dest": {"type": "path"},
            "contents": {"type": "dict", "default": {}},
            "info": {"type": "dict", "default": {}},
        },
        required_if=[("state", "sealed", ["dest"])],
        supports_check_mode=True,
    )
    p = module.params
    path = Path(p["path"])
    try:
        if p["state"] == "verified":
            manifest = verify(path)
            changed, where = False, path
        elif module.check_mode:
            manifest = {"contents": p["contents"], "info": p["info"], "files": {}}
            changed, where = True, Path(p["dest"])
        else:
            manifest = seal(path, Path(p["dest"]), p["contents"], p["info"])
            changed, where = True, Path(p["dest"])
    except (BackupError, OSError) as exc:
        module.fail_json(msg=f"sless backup: {exc}")
    summary = {k: v for k, v in manifest.items() if k != "files"}
    summary["files"] = len(manifest.get("files") or {})
    module.exit_json(changed=changed, manifest=summary, path=str(where))


if __name__ == "__main__":
    main()
