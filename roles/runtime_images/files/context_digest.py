"""Check each runtime's build context and print {name: {digest, dockerfile, from}} as JSON.

    context_digest.py SOURCE_DIR '[{"name": "python3.11", "target": ""}, ...]'

The digest covers every file of runtimes/<name>/ (paths and bytes, sorted; caches skipped), so
it changes exactly when a rebuild could produce a different image. The checks are the runtime
contract a base image must keep: a Dockerfile, port 8080, and a numeric non-root USER (Pod
Security "restricted" verifies runAsNonRoot only for numeric users).
"""

import hashlib
import json
import re
import sys
from pathlib import Path

SKIP = {"__pycache__", "node_modules", ".pytest_cache"}


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if SKIP & set(rel.parts) or path.suffix == ".pyc":
            continue
        h.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def check(name: str, folder: Path) -> dict[str, str]:
    dockerfile = folder / "Dockerfile"
    if not dockerfile.is_file():
        raise SystemExit(f"runtime {name}: {dockerfile} does not exist")
    text = dockerfile.read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    if not froms:
        raise SystemExit(f"runtime {name}: {dockerfile} has no FROM")
    if not re.search(r"^EXPOSE\s+8080\b", text, re.MULTILINE):
        raise SystemExit(f"runtime {name}: {dockerfile} does not EXPOSE 8080 (the runtime contract's port)")
    users = re.findall(r"^USER\s+(\d+)(?::\d+)?\s*$", text, re.MULTILINE)
    if not users or any(int(u) == 0 for u in users):
        raise SystemExit(f"runtime {name}: {dockerfile} needs a numeric non-root USER")
    return {"digest": digest(folder), "dockerfile": str(dockerfile), "from": froms[0]}


def main() -> None:
    source = Path(sys.argv[1]).resolve()
    runtimes = json.loads(sys.argv[2])
    print(json.dumps({r["name"]: check(r["name"], source / r["name"]) for r in runtimes}, sort_keys=True))


if __name__ == "__main__":
    main()
