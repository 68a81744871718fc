#!/usr/bin/python
"""The platform bucket's objects (code archives, build contexts, binaries) into a backup folder and back."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sless_backup_files import (
    CHUNK,
    BackupError,
    inside,
    open_private,
    private_folder,
    read_json,
    relative,
    write_json,
)

DOCUMENTATION = r"""
---
module: sless_backup_s3
short_description: Copy the sless bucket's objects into a backup folder, or back into the bucket
description:
  - V(save) writes every object of O(bucket) to O(path)C(/objects/<key>) (0600) and their list with sizes,
    SHA-256 and content types to O(path)C(/index.json).
  - V(restore) checks every key of the index and every file against its checksum first (a key that could leave
    the folder, or a file that differs, fails the task before anything is written), creates the bucket when it is
    missing and writes each object whose bytes the bucket does not already hold. Objects the bucket holds and the
    backup does not are left alone. Check mode checks and counts only.
options:
  mode:
    description: V(save) (bucket to folder) or V(restore) (folder to bucket).
    type: str
    choices: [save, restore]
    required: true
  path:
    description: The backup's S3 folder.
    type: path
    required: true
  endpoint:
    description: The S3 server, C(host:port) (plain HTTP) or a URL whose scheme chooses HTTP or HTTPS.
    type: str
    required: true
  bucket:
    description: The platform's bucket.
    type: str
    required: true
  access_key:
    description: The S3 access key.
    type: str
    required: true
  secret_key:
    description: The S3 secret key.
    type: str
    required: true
  region:
    description: The S3 region, when the server needs one.
    type: str
    default: ""
"""

RETURN = r"""
objects:
  description: How many objects the backup holds.
  returned: always
  type: int
written:
  description: V(restore), how many objects were written (the others were there with the same bytes).
  returned: always
  type: int
bytes:
  description: Their size in all.
  returned: always
  type: int
"""

INDEX = "index.json"
OBJECTS = "objects"


def client(endpoint: str, access_key: str, secret_key: str, region: str) -> Any:
    from minio import Minio

    secure = endpoint.startswith("https://")
    host = endpoint.removeprefix("https://").removeprefix("http://").rstrip("/")
    return Minio(host, access_key=access_key, secret_key=secret_key, secure=secure, region=region or None)


def save(s3: Any, bucket: str, folder: Path) -> tuple[int, int]:
    private_folder(folder / OBJECTS)
    index = []
    if s3.bucket_exists(bucket):
        for obj in s3.list_objects(bucket, recursive=True):
            if obj.is_dir or not obj.object_name:
                continue
            key = relative(str(obj.object_name), "object key")
            digest, size = hashlib.sha256(), 0
            response = s3.get_object(bucket, key)
            try:
                with open_private(inside(folder / OBJECTS, key, "object key")) as out:
                    for chunk in response.stream(CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
                content_type = response.headers.get("Content-Type") or "application/octet-stream"
            finally:
                response.close()
                response.release_conn()
            index.append({"key": key, "size": size, "sha256": digest.hexdigest(), "content_type": content_type})
    write_json(folder / INDEX, {"bucket": bucket, "objects": index})
    return len(index), sum(entry["size"] for entry in index)


def checked(folder: Path) -> list[dict[str, Any]]:
    """The index's entries, each key checked and each file's bytes matched to its checksum."""
    index = read_json(folder / INDEX, "the S3 index")
    entries = index.get("objects") if isinstance(index, dict) else None
    if not isinstance(entries, list):
        raise BackupError(f"{folder / INDEX} lists no objects")
    out, seen = [], set()
    for entry in entries:
        if not isinstance(entry, dict):
            raise BackupError(f"{folder / INDEX} holds an entry that is not an object")
        key = relative(entry.get("key"), "object key")
        if key in seen:
            raise BackupError(f"object key {key!r} is listed twice")
        seen.add(key)
        path = inside(folder / OBJECTS, key, "object key")
        sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
        try:
            with path.open("rb") as src:
                while chunk := src.read(CHUNK):
                    sha.update(chunk)
                    md5.update(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            raise BackupError(f"object {key!r}: its file is missing") from None
        if (sha.hexdigest(), size) != (entry.get("sha256"), entry.get("size")):
            raise BackupError(f"object {key!r}: its file differs from the index")
        content_type = entry.get("content_type")
        out.append({"key": key, "path": path, "size": size, "md5": md5.hexdigest(),
                    "content_type": content_type if isinstance(content_type, str) and content_type else None})
    return out


def restore(s3: Any, bucket: str, entries: list[dict[str, Any]]) -> tuple[int, int]:
    from minio.error import S3Error

    if not s3.bucket_exists(bucket):
        try:
            s3.make_bucket(bucket)
        except S3Error as exc:
            if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
    written = size = 0
    for entry in entries:
        try:
            there = s3.stat_object(bucket, entry["key"])
            if there.size == entry["size"] and (there.etag or "").strip('"') == entry["md5"]:
                continue
        except S3Error as exc:
            if exc.code not in ("NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound"):
                raise
        s3.fput_object(bucket, entry["key"], str(entry["path"]),
                       content_type=entry["content_type"] or "application/octet-stream")
        written += 1
        size += entry["size"]
    return written, size


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["save", "restore"], "required": True},
            "path": {"type": "path", "required": True},
            "endpoint": {"type": "str", "required": True},
            "bucket": {"type": "str", "required": True},
            "access_key": {"type": "str", "required": True, "no_log": True},
            "secret_key": {"type": "str", "required": True, "no_log": True},
            "region": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    folder = Path(p["path"])
    try:
        s3 = client(p["endpoint"], p["access_key"], p["secret_key"], p["region"])
        if p["mode"] == "save":
            if module.check_mode:
                module.exit_json(changed=True, objects=0, written=0, bytes=0)
            count, size = save(s3, p["bucket"], folder)
            module.exit_json(changed=True, objects=count, written=0, bytes=size)
        entries = checked(folder)
        if module.check_mode:
            module.exit_json(changed=bool(entries), objects=len(entries), written=0,
                             bytes=sum(e["size"] for e in entries))
        written, size = restore(s3, p["bucket"], entries)
        module.exit_json(changed=written > 0, objects=len(entries), written=written, bytes=size)
    except BackupError as exc:
        module.fail_json(msg=f"sless backup, S3: {exc}")
    except Exception as exc:  # minio's and urllib3's errors: named, no credentials in them
        module.fail_json(msg=f"sless backup, S3 at {p['endpoint']} bucket {p['bucket']}: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
