#!/usr/bin/env bash
# Installs the Ansible collections pinned in requirements.yml into .ansible/collections, and this
# repository's own collection sless.platform (ansible_collections/sless/platform) beside them.
# Ansible Galaxy first (when it answers); otherwise the collections are taken from the `ansible`
# community release on PyPI, which bundles these exact versions (checked below: a version
# mismatch fails instead of installing something else). Quick when everything is in place.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.ansible/collections
BUNDLE=${SLESS_ANSIBLE_BUNDLE:-12.3.0}   # `ansible` release whose collections match requirements.yml
CACHE=${SLESS_TOOLS_DIR:-/var/cache/sless-tools}/ansible-dist
PY=${SLESS_VENV:-.venv}/bin/python
log() { echo "[install-collections] $*" >&2; }

wanted() {  # "namespace.name version" per line, from requirements.yml
  "$PY" - <<'PYEOF'
import yaml
for item in yaml.safe_load(open("requirements.yml"))["collections"]:
    print(item["name"], item["version"])
PYEOF
}
installed_version() {  # version of collection $1 in $DEST, or nothing
  local manifest="$DEST/ansible_collections/${1/./\/}/MANIFEST.json"
  [ -f "$manifest" ] && "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["collection_info"]["version"])' "$manifest"
}

install_own() {  # this repository's collection (ansible_collections/sless/platform), from its folder: offline
  "${SLESS_VENV:-.venv}/bin/ansible-galaxy" collection install ansible_collections/sless/platform -p "$DEST" \
    --force >/dev/null
  log "sless.platform $(installed_version sless.platform) from ansible_collections/sless/platform"
}

missing=0
while read -r name version; do
  [ "$(installed_version "$name")" = "$version" ] || missing=1
done < <(wanted)
if [ "$missing" = 0 ]; then log "all collections of requirements.yml present in $DEST"; install_own; exit 0; fi

mkdir -p "$DEST"
if [ "${SLESS_COLLECTIONS_FROM:-auto}" != pypi ] && \
   "$PY" -c 'import urllib.request; urllib.request.urlopen("https://galaxy.ansible.com/api/", timeout=10)' 2>/dev/null; then
  log "installing from Ansible Galaxy"
  "${SLESS_VENV:-.venv}/bin/ansible-galaxy" collection install -r requirements.yml -p "$DEST" --force
else
  log "Ansible Galaxy does not answer: taking the collections from ansible==$BUNDLE (PyPI)"
  mkdir -p "$CACHE"
  wheel="$CACHE/ansible-$BUNDLE-py3-none-any.whl"
  [ -f "$wheel" ] || "$PY" -m pip download -q --disable-pip-version-check --no-deps "ansible==$BUNDLE" -d "$CACHE"
  "$PY" - "$wheel" "$DEST" <<'PYEOF'
import json, shutil, sys, tempfile, zipfile
from pathlib import Path
import yaml
wheel, dest = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(wheel) as zf:
    names = zf.namelist()
    for item in yaml.safe_load(open("requirements.yml"))["collections"]:
        ns, name = item["name"].split(".")
        prefix = f"ansible_collections/{ns}/{name}/"
        info = json.loads(zf.read(prefix + "MANIFEST.json"))["collection_info"]
        if info["version"] != str(item["version"]):
            sys.exit(f"{item['name']}: the bundle has {info['version']}, requirements.yml pins {item['version']}")
        target = dest / "ansible_collections" / ns / name
        with tempfile.TemporaryDirectory(dir=dest) as tmp:
            for member in (n for n in names if n.startswith(prefix)):
                zf.extract(member, tmp)
            shutil.rmtree(target, ignore_errors=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(Path(tmp) / prefix), target)
        print(f"[install-collections] {item['name']} {info['version']}", file=sys.stderr)
PYEOF
fi
while read -r name version; do
  got=$(installed_version "$name" || true)
  [ "$got" = "$version" ] || { log "$name: installed '${got}', wanted $version"; exit 1; }
done < <(wanted)
log "done: $(wanted | tr '\n' ' ')"
install_own
