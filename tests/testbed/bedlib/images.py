"""Container images for the real node, made without any public registry.

No Docker Hub, gcr.io or similar is reachable here, so every image starts from a Debian rootfs
made by debootstrap (from the same mirror apt uses) or from scratch:

- ``sless-testbed/debian``: bookworm minbase plus python3 (Debian's 3.11), pip and CA certs;
  the local stand-in for python:3.11-slim and the base of the other stand-ins;
- ``sless-testbed/node``: that base plus the host's Node 20 and npm (stand-in for node:20-slim);
- ``sless-testbed/golang``: that base plus the host's Go toolchain (stand-in for golang:1.23);
- ``sless-testbed/static``: scratch plus /etc/passwd and CA certs (stand-in for distroless);
- ``sless-testbed/pause``: the sandbox image, a tiny static binary;
- ``sless-testbed/kaniko-executor``: scratch plus kaniko's executor, CA bundle, nsswitch.conf;
- ``sless-testbed/python``: that base plus python3-venv and ``python`` (stand-in for python:3.11-slim);
- ``sless/platform``: the platform image, the repository's ``Dockerfile`` on that stand-in;
- ``sless/<runtime>``: the three runtime base images built from ``runtimes/*/Dockerfile``
  with their base-image build argument pointed at the stand-ins above, plus the host's CA bundle:
  a function's dependencies (pip, npm, ``go mod download`` in kaniko's RUN steps on this base)
  come from the package registries through this machine's network, which may re-sign TLS with a
  CA of its own, so the runtimes trust what the host trusts, as the kaniko and static images do.

buildah builds them (chroot isolation: no runc, no cgroups, no network namespace needed) into
its own storage under the cache, and pushes them into the test bed's registry, whose storage
directory is also kept in the cache. Each image has a key (hash of its recipe and inputs) in
``keys.json``; a warm run finds every key, the image locally and in the registry, and builds
nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("TESTBED_CACHE", "/var/cache/sless-testbed"))
IMAGES = CACHE / "realnode-images"
REGISTRY_STORAGE = IMAGES / "registry"
SUITE = "bookworm"
# python3 + pip: the python3.11 runtime and functions with requirements.txt; ca-certificates: HTTPS
INCLUDE = ("python3", "python3-pip", "ca-certificates")
RECIPE_VERSION = "1"  # bump to rebuild every image
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
))  # fmt: skip


def log(message: str) -> None:
    print(f"[testbed-images {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _sha(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _file_sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _tree_sha(folder: Path) -> str:
    """Hash of every file's relative path and content under FOLDER (a build context).

    Byte-code caches and node_modules are left out: tests create them, and no Dockerfile copies them.
    """
    skip = {"node_modules", "__pycache__"}
    parts: list[str] = []
    files = (p for p in folder.rglob("*") if p.is_file() and not skip & set(p.parts) and p.suffix != ".pyc")
    for path in sorted(files):
        parts.append(f"{path.relative_to(folder)}={_file_sha(path)}")
    return _sha(*parts)


def debian_mirror() -> str:
    """The Debian mirror apt already uses (deb822 .sources or one-line sources.list)."""
    candidates = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in candidates:
        text = path.read_text()
        for stanza in text.split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split() and "security" not in uris.group(1):
                return uris.group(1)
    listing = Path("/etc/apt/sources.list")
    for line in listing.read_text().splitlines() if listing.exists() else []:
        words = [w for w in line.split() if not w.startswith("[")]
        if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE and "security" not in words[1]:
            return words[1]
    raise RuntimeError("no Debian bookworm mirror found in apt's sources")


@dataclass
class Image:
    """One image: its repository:tag in the registry and how to build it."""

    ref: str
    key: str
    build: Callable[[str], None] = field(repr=False)  # builds into buildah storage under local name


class Builder:
    """buildah with private storage under the cache, and the images' recipes."""

    def __init__(self, bin_dir: Path, realnode_bin: Path, registry: str) -> None:
        self.bin_dir = bin_dir
        self.realnode_bin = realnode_bin
        self.registry = registry  # host:port the images are pushed to
        self.root = IMAGES / "buildah"
        self.work = IMAGES / "work"
        self.timings: dict[str, float] = {}
        self.conf = IMAGES / "containers.conf"

    # --- buildah --------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        # runc, capped ulimits: the VM refuses raising limits beyond its hard cap (setrlimit errors)
        self.conf.parent.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\n'
        )
        return os.environ | {"CONTAINERS_CONF": str(self.conf), "BUILDAH_ISOLATION": "chroot"}

    def buildah(self, *args: str, timeout: float = 1800) -> str:
        argv = ["buildah", "--root", str(self.root / "root"), "--runroot", str(self.root / "run"),
                "--storage-driver", "overlay", *args]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, env=self._env(), timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"buildah {' '.join(args[:3])} failed: {proc.stderr.strip()[-3000:]}")
        return proc.stdout

    def has_local(self, name: str) -> bool:
        try:
            self.buildah("inspect", "--type", "image", name, timeout=60)
        except RuntimeError:
            return False
        return True

    def bud(self, name: str, context: Path, dockerfile: str | None = None, *args: str) -> None:
        """Build CONTEXT (its Dockerfile, or the text DOCKERFILE) into the local image NAME."""
        extra: list[str] = []
        if dockerfile is not None:
            path = context / "Dockerfile.testbed"
            path.write_text(dockerfile)
            extra = ["-f", str(path)]
        self.buildah("bud", "--layers=false", "--pull=false", "--format", "oci", "-t", name, *extra, *args,
                     str(context))  # fmt: skip

    def push(self, name: str) -> None:
        self.buildah(
            "push", "--tls-verify=false", "--format", "oci", f"localhost/{name}", f"docker://{self.registry}/{name}"
        )

    # --- recipes --------------------------------------------------------------------------
    def rootfs_tar(self) -> Path:
        """debootstrap --variant=minbase, cleaned and tarred once per (suite, mirror, packages)."""
        mirror = debian_mirror()
        tar = IMAGES / f"rootfs-{SUITE}-{_sha(mirror, *INCLUDE, RECIPE_VERSION)}.tar"
        if tar.exists():
            return tar
        start = time.monotonic()
        IMAGES.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=IMAGES, prefix="debootstrap-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            log(f"debootstrap {SUITE} from {mirror} (+{', '.join(INCLUDE)})")
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(rootfs), mirror],
                capture_output=True, text=True, timeout=1800, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise RuntimeError(f"debootstrap failed: {(proc.stdout + proc.stderr)[-3000:]}")
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log", "tmp"):
                target = rootfs / junk
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir(parents=True, exist_ok=True)
            (rootfs / "tmp").chmod(0o1777)
            (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
            (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
            partial = tar.with_suffix(".partial")
            subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], check=True)
            partial.rename(tar)
        self.timings["debootstrap"] = round(time.monotonic() - start, 1)
        log(f"rootfs {tar.name} ({tar.stat().st_size >> 20} MB) in {self.timings['debootstrap']}s")
        return tar

    def _context(self, name: str) -> Path:
        ctx = self.work / name.replace("/", "_").replace(":", "_")
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir(parents=True)
        return ctx

    def images(self) -> list[Image]:
        """Every image, bases first; keys chain, so a changed base rebuilds what uses it."""
        mirror = debian_mirror()
        go_env = subprocess.run(["go", "env", "GOROOT", "GOVERSION"], capture_output=True, text=True, check=True)
        go_root, go_version = Path(go_env.stdout.split()[0]), go_env.stdout.split()[1]
        node = Path(shutil.which("node") or "/usr/bin/node").resolve()
        npm_cli = shutil.which("npm")  # <prefix>/lib/node_modules/npm/bin/npm-cli.js behind the link
        npm = Path(npm_cli).resolve().parents[1] if npm_cli else None
        npm_version = json.loads((npm / "package.json").read_text())["version"] if npm else "none"
        ca = Path("/etc/ssl/certs/ca-certificates.crt")
        pause = self.realnode_bin / "pause"
        executor = self.realnode_bin / "executor"

        debian = f"sless-testbed/debian:{SUITE}"
        debian_key = _sha(RECIPE_VERSION, "debian", mirror, *INCLUDE)

        def build_debian(name: str) -> None:
            ctx = self._context(name)
            os.link(self.rootfs_tar(), ctx / "rootfs.tar")
            self.bud(name, ctx, 'FROM scratch\nADD rootfs.tar /\nENV LANG=C.UTF-8\nCMD ["bash"]\n')

        def scratch_with(files: dict[str, Path], body: str) -> Callable[[str], None]:
            def build(name: str) -> None:
                ctx = self._context(name)
                for target, source in files.items():
                    shutil.copy2(source, ctx / target)
                self.bud(name, ctx, body)

            return build

        node_ref = "sless-testbed/node:20"
        node_key = _sha(RECIPE_VERSION, debian_key, _file_sha(node), "npm", npm_version)

        def build_node(name: str) -> None:
            """node:20-slim's layout: node in /usr/local/bin, npm (package.json dependencies) beside it."""
            ctx = self._context(name)
            shutil.copy2(node, ctx / "node")
            body = f"FROM localhost/{debian}\nCOPY node /usr/local/bin/node\n"
            if npm is not None:
                shutil.copytree(npm, ctx / "npm", symlinks=True)
                body += ("COPY npm /usr/local/lib/node_modules/npm\n"
                         "RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm\n")  # fmt: skip
            else:
                log("no npm on this machine: the node stand-in has none (functions with package.json cannot build)")
            self.bud(name, ctx, body)

        go_ref = f"sless-testbed/golang:{go_version.removeprefix('go')}"
        go_key = _sha(RECIPE_VERSION, debian_key, go_version)

        def build_go(name: str) -> None:
            ctx = self._context(name)
            shutil.copytree(go_root, ctx / "go", symlinks=True, ignore=shutil.ignore_patterns("pkg/obj", "test"))
            path = "/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            self.bud(name, ctx, f"FROM localhost/{debian}\nCOPY go /usr/local/go\nENV PATH={path}\n")

        static_ref = "sless-testbed/static:nonroot"
        passwd_dir = self.work / "static-files"
        passwd_dir.mkdir(parents=True, exist_ok=True)
        (passwd_dir / "passwd").write_text("root:x:0:0:root:/root:/sbin/nologin\n"
                                           "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")  # fmt: skip
        (passwd_dir / "group").write_text("root:x:0:\nnonroot:x:65532:\n")
        nsswitch = passwd_dir / "nsswitch.conf"
        nsswitch.write_text("hosts: files dns\n")
        static_key = _sha(RECIPE_VERSION, "static", _file_sha(ca))

        runtimes = ROOT / "runtimes"

        def runtime(folder: str, *args: str, env: str = "") -> Callable[[str], None]:
            def build(name: str) -> None:
                self.bud(name, runtimes / folder, None, *args)
                # the host's CA bundle on top (see the module's docstring); COPY runs as root whatever USER says
                ctx = self._context(name + "-ca")
                shutil.copy2(ca, ctx / "ca.crt")
                self.bud(name, ctx, f"FROM localhost/{name}\nCOPY ca.crt /etc/ssl/certs/ca-certificates.crt\n{env}")

            return build

        ca_key = _file_sha(ca)

        python_ref = "sless-testbed/python:3.11"
        python_key = _sha(RECIPE_VERSION, debian_key, "python3-venv")

        def build_python(name: str) -> None:
            """The stand-in for python:3.11-slim: `python` and a venv with pip, as the official image has."""
            ctx = self._context(name)
            self.bud(name, ctx, f"FROM localhost/{debian}\n"
                                "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                                "--no-install-recommends python3-venv >/dev/null && rm -rf /var/lib/apt/lists/* "
                                "/var/cache/apt/archives/*.deb && ln -sf python3 /usr/bin/python\n")  # fmt: skip

        platform_inputs = ("Dockerfile", "pyproject.toml", "README.md", "core", "api", "operator", "runtimes")

        def build_platform(name: str) -> None:
            """The repository's Dockerfile on the local python base; pip reaches PyPI trusting what the
            host trusts (its CA bundle mounted for the RUN steps only, never copied into the image)."""
            self.bud(name, ROOT, None, "--build-arg", f"BASE_IMAGE=localhost/{python_ref}",
                     "--volume", f"{ca}:/etc/ssl/certs/ca-certificates.crt:ro")  # fmt: skip

        kaniko_env = ("ENV HOME=/root USER=root PATH=/usr/local/bin:/kaniko SSL_CERT_DIR=/kaniko/ssl/certs "
                      "DOCKER_CONFIG=/kaniko/.docker/\n")  # fmt: skip
        return [
            Image(debian, debian_key, build_debian),
            Image("sless-testbed/pause:3.10", _sha(RECIPE_VERSION, "pause", _file_sha(pause)),
                  scratch_with({"pause": pause},
                               'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n')),
            Image("sless-testbed/kaniko-executor:v1.23.2",
                  _sha(RECIPE_VERSION, "kaniko", _file_sha(executor), _file_sha(ca)),
                  scratch_with({"executor": executor, "ca.crt": ca, "nsswitch.conf": nsswitch},
                               "FROM scratch\nCOPY executor /kaniko/executor\n"
                               "COPY ca.crt /kaniko/ssl/certs/ca-certificates.crt\n"
                               "COPY nsswitch.conf /etc/nsswitch.conf\n" + kaniko_env +
                               'WORKDIR /workspace\nENTRYPOINT ["/kaniko/executor"]\n')),
            Image(static_ref, static_key,
                  scratch_with({"passwd": passwd_dir / "passwd", "group": passwd_dir / "group", "ca.crt": ca},
                               "FROM scratch\nCOPY passwd group /etc/\n"
                               "COPY ca.crt /etc/ssl/certs/ca-certificates.crt\nUSER 65532:65532\n")),
            Image(node_ref, node_key, build_node),
            Image(go_ref, go_key, build_go),
            Image(python_ref, python_key, build_python),
            Image("sless/platform:testbed",
                  _sha(RECIPE_VERSION, python_key,
                       *(f"{p}={_tree_sha(ROOT / p) if (ROOT / p).is_dir() else _file_sha(ROOT / p)}"
                         for p in platform_inputs)),
                  build_platform),
            Image("sless/python3.11:testbed",
                  _sha(RECIPE_VERSION, debian_key, _tree_sha(runtimes / "python3.11"), ca_key),
                  runtime("python3.11", "--build-arg", f"BASE_IMAGE=localhost/{debian}")),
            # Node trusts its own roots unless told: npm (and a function's HTTPS calls) also the bundle's
            Image("sless/nodejs20:testbed",
                  _sha(RECIPE_VERSION, node_key, _tree_sha(runtimes / "nodejs20"), ca_key),
                  runtime("nodejs20", "--build-arg", f"BASE_IMAGE=localhost/{node_ref}",
                          env="ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt\n")),
            Image("sless/go1.23:testbed",
                  _sha(RECIPE_VERSION, go_key, static_key, _tree_sha(runtimes / "go1.23"), ca_key),
                  runtime("go1.23", "--target", "base", "--build-arg", f"GO_IMAGE=localhost/{go_ref}",
                          "--build-arg", f"RUN_IMAGE=localhost/{static_ref}")),
        ]  # fmt: skip


def registry_has(registry: str, ref: str) -> bool:
    """Whether the registry at REGISTRY serves REF's manifest (HEAD /v2/<repo>/manifests/<tag>)."""
    repo, tag = ref.rsplit(":", 1)
    request = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{tag}", method="HEAD",
                                     headers={"Accept": MANIFEST_TYPES})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def registry_digest(registry: str, ref: str) -> str | None:
    """The digest REGISTRY serves for REF's manifest (what a pull would resolve), or None."""
    repo, tag = ref.rsplit(":", 1)
    request = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{tag}", method="HEAD",
                                     headers={"Accept": MANIFEST_TYPES})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.headers.get("Docker-Content-Digest")
    except (urllib.error.URLError, OSError):
        return None


def ensure(bin_dir: Path, realnode_bin: Path, registry: str, only: set[str] | None = None) -> dict[str, float]:
    """Build what is missing or stale, push it to REGISTRY; returns seconds per built image.

    ONLY limits the work to those repositories (and nothing else): the base images must
    exist already for a runtime image. The key file is written after each push, so an
    interrupted run keeps what it finished.
    """
    builder = Builder(bin_dir, realnode_bin, registry)
    keys_file = IMAGES / "keys.json"
    IMAGES.mkdir(parents=True, exist_ok=True)
    keys: dict[str, str] = json.loads(keys_file.read_text()) if keys_file.exists() else {}
    built: dict[str, float] = {}
    for image in builder.images():
        if only is not None and image.ref.split(":")[0] not in only:
            continue
        local = f"localhost/{image.ref}"
        fresh = keys.get(image.ref) == image.key and builder.has_local(local)
        if fresh and registry_has(registry, image.ref):
            continue
        start = time.monotonic()
        if not fresh:
            log(f"building {image.ref}")
            image.build(image.ref)
            keys[image.ref] = image.key
        builder.push(image.ref)
        built[image.ref] = round(time.monotonic() - start, 1)
        log(f"{image.ref}: {'built and ' if not fresh else ''}pushed in {built[image.ref]}s")
        keys_file.write_text(json.dumps(keys, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(builder.work, ignore_errors=True)
    return built | builder.timings
