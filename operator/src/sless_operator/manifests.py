"""Pure builders of every object the operator creates; no I/O, so they are unit-tested alone.

Names are deterministic (a retried or restarted reconcile finds what an earlier one made), and
each object carries a ``sless.dev/spec-hash`` annotation of what we asked for, so a reconcile
compares hashes instead of diffing against fields the apiserver defaulted.

Where things run:
- build Jobs (kaniko) in the platform's build namespace: kaniko needs root, which the tenant
  namespaces' ``restricted`` Pod Security level forbids, and the S3 and registry credentials
  stay out of tenant namespaces. Such a Job cannot carry an owner reference to a Function in
  another namespace; labels name its Function and the operator's finalizer deletes it. Its
  ``fetch-context`` init container alone gets the S3 credentials (``fetch_container``).
- Deployments, Services, run Jobs and CronJobs in the tenant namespace, owned by their
  Function, FunctionJob or Trigger (garbage collection removes them with it); so are a scaled
  Function's KEDA ScaledObject and a PodDisruptionBudget for a Deployment of 2 or more pods.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from sless_core import contract, crd
from sless_core.crcodec import FunctionResource
from sless_core.models import FunctionSpec, ScaleSpec
from sless_core.naming import secret_object_name
from sless_operator.config import OperatorConfig

PORT = 8080
HEALTH_PATH = "/_/health"
CONTAINER = "function"
SPEC_HASH = "sless.dev/spec-hash"
LABEL_CODE = "sless.dev/code-hash"
ANNOTATION_IMAGE = "sless.dev/image"
#: On a Deployment whose replicas its ScaledObject owns (the operator leaves them alone)
ANNOTATION_AUTOSCALED = "sless.dev/autoscaled"
#: KEDA holds a paused ScaledObject's target at this many replicas
ANNOTATION_PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"
#: Annotations the operator sets and takes away again (a merge patch only removes what it names as null)
OWNED_ANNOTATIONS = (ANNOTATION_AUTOSCALED, ANNOTATION_PAUSED_REPLICAS)
SCALE_POLLING_SEC = 10
SCALE_DOWN_WINDOW_MAX_SEC = 300
TERMINATION_LOG = "/dev/termination-log"
#: Where a function finds the secrets it references as files ($SLESS_SECRETS_DIR; the standalone path too).
SECRETS_DIR = "/run/sless/secrets"
SECRETS_VOLUME = "secrets"
# Seconds a runner gets beyond the function's timeout (image pull, start-up) before the Job stops it.
RUN_MARGIN_SEC = 60
PROGRESS_DEADLINE_SEC = 300
MAX_GRACE_SEC = 900
#: A function's pod keeps serving this long after Kubernetes tells it to stop, before its SIGTERM. The pod
#: leaves its Service's endpoints at that same moment and kube-proxy's rules follow within about a second
#: (its minimum sync period), so new connections keep reaching it meanwhile: had it stopped listening, a
#: rollout would answer them 502 (the proxy's one retry of a refused connection covers the rest). Kept short:
#: a keep-alive connection to the old pod serves the old code until SIGTERM closes it, so every second here
#: is a second more of old code after a deploy. The `sleep` hook needs no binary in the image (Go's run image
#: has none); Kubernetes 1.30+.
PRESTOP_SLEEP_SEC = 1

# Build pods: the init container unpacks the context into an emptyDir that kaniko reads.
BUILD_CONTAINER = "kaniko"
FETCH_CONTAINER = "fetch-context"
BUILD_CONTEXT_VOLUME = "context"
BUILD_WORKSPACE = "/workspace"
BUILD_CONTEXT_DIR = "/workspace/context"
# the archive and its unpacked files both sit in the emptyDir for a moment, then the image tarball beside them
BUILD_CONTEXT_MAX_BYTES = 512 * 1024 * 1024
BUILD_WORKSPACE_SIZE = "5376Mi"  # 1280Mi for the context, 4Gi for the image tarball (IMAGE_TARBALL_MAX_BYTES)
FETCH_UID = 10001  # the platform image's user (Dockerfile)

# Function pods with fetched code, Go's and those on a dependency image: ``fetch-code`` unpacks the archive into
# an emptyDir, which the function container mounts read-only where the runtime looks for code.
FETCH_CODE_CONTAINER = "fetch-code"
CODE_VOLUME = "code"
CODE_WORKSPACE = "/workspace"
CODE_SUBDIR = "function"
CODE_DIR = "/app/function"  # SLESS_CODE_DIR of the runtime images
CODE_MAX_BYTES = 256 * 1024 * 1024
CODE_VOLUME_SIZE = "640Mi"
CODE_URL_ENV = "SLESS_CODE_URL"
CODE_URL_KEY = "url"
# The Python and Node runtimes fetch their own code (runtimes/*/sless_fetch.py, sless-fetch.js): a container
# start less on every cold start. They read these variables, unpack into the code volume mounted (writable)
# at CODE_DIR, and exit FETCH_EXIT_CODE with the reason as their termination message when they cannot.
SELF_FETCH_RUNTIMES = ("python3.11", "nodejs20")
FETCH_EXIT_CODE = 3
CODE_KEY_ENV = "SLESS_CODE_KEY"
CODE_SHA256_ENV = "SLESS_CODE_SHA256"
CODE_MAX_BYTES_ENV = "SLESS_CODE_MAX_BYTES"
CODE_REPORT_ENV = "SLESS_CODE_REPORT_FILE"
ANNOTATION_EXPIRES = "sless.dev/expires"
LABEL_DEPS = "sless.dev/deps-hash"

# Go: a compile Job in the tenant namespace turns fetched code into a binary on the dependency image
# (toolchain, modules, compiled standard library); its pods fetch the binary like code, on SLESS_GO_RUN_IMAGE.
GO = "go1.23"
COMPILE_CONTAINER = "compile"
UPLOAD_CONTAINER = "upload-binary"
COMPILE_SRC = "/workspace/function"
COMPILE_OUT = "/workspace/out"
COMPILE_SCRIPT = "/app/runtime/build.sh"  # runtimes/go1.23/build.sh in the Go runtime image
COMPILE_UID = 1000  # the Go runtime image's user: its build cache (GOCACHE) is this user's
COMPILE_TMP_SIZE = "2Gi"
PUT_URL_ENV = "SLESS_PUT_URL"
BINARY_MAX_BYTES = 256 * 1024 * 1024
GO_BIN_DIR = "/app/bin"
GO_RUN_UID = 65532  # distroless' nonroot

COMPONENT_FUNCTION = "function"
COMPONENT_BUILD = "build"
COMPONENT_COMPILE = "compile"
COMPONENT_RUN = "run"
COMPONENT_CRON = "cron"


@dataclass(frozen=True)
class Runtime:
    """How a runtime image is run: the runner command (the server is the image's CMD)."""

    runner: tuple[str, ...]
    read_only_root: bool = True


# Paths from runtimes/*/Dockerfile and the generated function Dockerfile (sless_core.buildcontext).
RUNTIMES: dict[str, Runtime] = {
    "python3.11": Runtime(runner=("python3", "/app/runtime/runner.py")),
    "nodejs20": Runtime(runner=("node", "/app/runtime/runner.js")),
    "go1.23": Runtime(runner=("/app/bin/runner",)),
}


@dataclass(frozen=True)
class Owner:
    """An owner reference target: the custom resource a child belongs to."""

    api_version: str
    kind: str
    name: str
    uid: str

    @classmethod
    def of(cls, body: dict[str, Any]) -> Owner:
        meta = body["metadata"]
        return cls(body["apiVersion"], body["kind"], meta["name"], meta["uid"])

    def reference(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}  # fmt: skip


@dataclass(frozen=True)
class FunctionRef:
    """What the builders need to know about one Function."""

    namespace: str
    name: str
    spec: FunctionSpec
    code_hash: str
    context_key: str
    owner: Owner
    # SHA-256 of the build context archive, when the Function states it (spec.contextSha256)
    context_sha256: str = ""
    # hash of the referenced secrets' revisions (spec.secretsVersion, set by the API): on the pod template,
    # so a written secret rolls the pods (env values from Secrets are read only when a container starts)
    secrets_version: str = ""
    # code fetched at pod start (spec.codeKey, spec.codeSha256); empty: the code is in the image
    code_key: str = ""
    code_sha256: str = ""
    # the dependency key (sless_core.rebuild); empty: the runtime image runs the code as it is
    deps_hash: str = ""
    # spec.replicas: what the Deployment runs while the function is not switched off (observe.desired_replicas)
    replicas: int = 1
    # a Go function's compiled binary (status.binary: key and SHA-256 of its archive), fetched at pod start
    binary_key: str = ""
    binary_sha256: str = ""
    # the newest recorded version (what the image and code above are): a run Job names it for its record
    version: int | None = None

    @classmethod
    def of(cls, body: dict[str, Any]) -> FunctionRef:
        """What the builders need of the Function BODY, decoded by the one codec (raises ``InvalidResource``)."""
        fn = FunctionResource.from_cr(body)
        code = fn.code
        ref = cls(namespace=fn.meta.namespace, name=fn.meta.name, spec=fn.spec, code_hash=code.code_hash,
                  context_key=code.context_key, owner=Owner(crd.API_VERSION, "Function", fn.meta.name, fn.meta.uid),
                  context_sha256=code.context_sha256, secrets_version=fn.secrets_version, code_key=code.code_key,
                  code_sha256=code.code_sha256, deps_hash=code.deps_hash, replicas=fn.replicas,
                  version=fn.current_version)  # fmt: skip
        # the binary that serves (the last one compiled), which run and cron pods fetch as well
        binary = (body.get("status") or {}).get("binary")
        if ref.compiled and isinstance(binary, dict):
            key, sha256 = str(binary.get("key") or ""), str(binary.get("sha256") or "")
            if key.startswith(f"binaries/{ref.namespace}/{ref.name}/") and len(sha256) == 64:
                ref = replace(ref, binary_key=key, binary_sha256=sha256)
        return ref

    @property
    def fetched(self) -> bool:
        """The pods fetch the code at start (Python, Node; Go its binary): a code change builds no image."""
        return bool(self.code_key)

    @property
    def compiled(self) -> bool:
        """Fetched Go code: a compile Job turns it into a binary, which the pods fetch (``sless_core.rebuild``)."""
        return self.fetched and self.spec.runtime == GO

    @property
    def fetches_itself(self) -> bool:
        """Its pods' runtime container fetches the code (no ``fetch-code`` init container): Python and Node code
        on the runtime's own image. Not Go (its run image is a bare base image), nor a dependency image: one
        built from an older runtime image may not know how (its key names the manifests, not the runtime)."""
        return self.fetched and self.spec.runtime in SELF_FETCH_RUNTIMES and not self.deps_hash

    @property
    def fetch_key(self) -> str:
        """What the function's pods fetch at start: the code archive, or a Go function's binary."""
        return self.binary_key if self.compiled else self.code_key

    @property
    def fetch_sha256(self) -> str:
        return self.binary_sha256 if self.compiled else self.code_sha256


# -- names and labels -------------------------------------------------------------------------


def image_ref(config: OperatorConfig, namespace: str, name: str, code_hash: str) -> str:
    """Every code hash gets its own tag, so new code never runs from a stale image."""
    return f"{config.registry}/{namespace}/{name}:{code_hash[:16]}"


def runtime_image(config: OperatorConfig, runtime: str) -> str:
    """The runtime's own image: what a function without dependencies runs, its code fetched at start."""
    return f"{config.runtime_image_prefix}/{runtime}:{config.runtime_image_tag}"


def deps_image_ref(config: OperatorConfig, namespace: str, deps_hash: str) -> str:
    """One dependency image per tenant and dependency key: the tenant's functions with the same manifest
    share it. Not across tenants: installing runs the tenant's own code (setup.py, npm scripts)."""
    return f"{config.registry}/{namespace}/deps:{deps_hash[:32]}"


def deps_job_name(namespace: str, deps_hash: str) -> str:
    digest = hashlib.sha256(f"{namespace}/deps/{deps_hash}".encode()).hexdigest()[:16]
    return f"deps-build-{digest}"


def binary_key(fn: FunctionRef, builder_image: str) -> str:
    """``binaries/<ns>/<fn>/<code stamp>-<digest>.tar.gz``: the object the compile Job writes. Named after
    what it is compiled from (code archive, entrypoint, the image it compiles on), so the same inputs find
    the same binary, and sorted like the code (the API prunes both alike, ``sless_api.stores.code.keys``)."""
    stamp = fn.code_key.rsplit("/", 1)[-1].removesuffix(".tar.gz")
    source = "\0".join([fn.spec.runtime, fn.spec.entrypoint, builder_image, fn.code_key, fn.code_sha256])
    return f"binaries/{fn.namespace}/{fn.name}/{stamp}-{hashlib.sha256(source.encode()).hexdigest()[:16]}.tar.gz"


#: How many compiled binaries ``status.binaries`` remembers (as many versions as the API keeps).
KEEP_BINARIES = 10


def known_binaries(status: dict[str, Any]) -> dict[str, str]:
    """``status.binaries``: binary key -> SHA-256 of the Go binaries compiled for the Function, oldest first."""
    found = status.get("binaries")
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str) and len(v) == 64}


def remember_binary(known: dict[str, str], key: str, sha256: str) -> dict[str, str]:
    """KNOWN with KEY added as the newest, the oldest beyond ``KEEP_BINARIES`` left out."""
    kept = {k: v for k, v in known.items() if k != key}
    kept[key] = sha256
    return dict(list(kept.items())[-KEEP_BINARIES:])


def compile_job_name(fn: FunctionRef, key: str) -> str:
    return f"{fn.name}-compile-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def code_secret_name(function: str) -> str:
    return f"sless-code-{function}"


def build_job_name(namespace: str, name: str, code_hash: str, context_key: str = "") -> str:
    """``<fn>-build-<10 hex>``: the digest covers namespace, name and code hash, because every
    tenant's builds share the build namespace (two tenants may upload the same code), and the build
    context: a failed build is remembered by its Job, and uploading the same code again (a new context)
    builds again, the platform's rule for a Failed function (``sless_core.contract.upload_builds``)."""
    source = f"{namespace}/{name}/{code_hash}" + (f"/{context_key}" if context_key else "")
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    return f"{name}-build-{digest}"


def run_job_name(job: str, run_id: int) -> str:
    return f"{job}-run-{run_id}"


#: The Job controller labels each pod with its Job's name (Kubernetes 1.27+).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def cron_job_name(trigger: str) -> str:
    return f"{trigger}-cron"


def base_labels(function: str, component: str) -> dict[str, str]:
    return {
        crd.LABEL_MANAGED: crd.MANAGED_BY,
        "app.kubernetes.io/name": function,
        crd.LABEL_FUNCTION: function,
        crd.LABEL_COMPONENT: component,
    }


def selector_labels(function: str) -> dict[str, str]:
    """The Deployment's (immutable) selector and the Service's."""
    return {crd.LABEL_FUNCTION: function, crd.LABEL_COMPONENT: COMPONENT_FUNCTION}


def spec_hash(obj: dict[str, Any]) -> str:
    """Hash of an object as we build it, without the hash annotation itself and without replicas
    (triggers scale the Deployment separately, which must not count as drift)."""
    clean = json.loads(json.dumps(obj))
    clean.get("metadata", {}).get("annotations", {}).pop(SPEC_HASH, None)
    clean.get("spec", {}).pop("replicas", None)
    return hashlib.sha256(json.dumps(clean, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _stamp(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].setdefault("annotations", {})[SPEC_HASH] = spec_hash(obj)
    return obj


# -- shared pod pieces --------------------------------------------------------------------------


def function_env(fn: FunctionRef, extra: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """User variables, secret references and the runtime's SLESS_* contract, sorted by name so an
    unchanged spec always renders the same list (no needless rollouts)."""
    spec = fn.spec
    values: dict[str, str] = dict(spec.env_vars)
    values.update({
        "HOME": "/tmp",  # noqa: S108  (the pod's own emptyDir: the root filesystem is read-only)
        "PORT": str(PORT),
        "SLESS_ENTRYPOINT": spec.entrypoint,
        "SLESS_FUNCTION": fn.name,
        "SLESS_NAMESPACE": fn.namespace,
        "SLESS_RUNTIME": spec.runtime,
        "SLESS_TIMEOUT_SEC": str(spec.timeout_sec),
    })  # fmt: skip
    if any(ref.file is not None for ref in spec.secrets):
        values["SLESS_SECRETS_DIR"] = SECRETS_DIR
    values.update(extra or {})
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    for ref in spec.secrets:
        if ref.env is not None:
            source = {"name": secret_object_name(ref.name), "key": ref.key}
            env.append({"name": ref.env, "valueFrom": {"secretKeyRef": source}})
    env.sort(key=lambda item: str(item["name"]))
    return env


def secrets_volume(fn: FunctionRef) -> dict[str, Any] | None:
    """The secrets referenced as files, one projected volume (read-only, 0440 to the pod's group), or None."""
    sources: dict[str, list[dict[str, str]]] = {}
    for ref in fn.spec.secrets:
        if ref.file is not None:
            sources.setdefault(secret_object_name(ref.name), []).append({"key": ref.key, "path": ref.file})
    if not sources:
        return None
    projected: list[dict[str, Any]] = [{"secret": {"name": name, "items": sorted(items, key=lambda i: i["path"])}}
                                       for name, items in sorted(sources.items())]
    return {"name": SECRETS_VOLUME, "projected": {"sources": projected, "defaultMode": 0o444}}


def pod_annotations(fn: FunctionRef) -> dict[str, str]:
    return {crd.ANNOTATION_SECRETS: fn.secrets_version} if fn.secrets_version else {}


def function_resources(memory_mb: int) -> dict[str, Any]:
    """Memory request = limit = memoryMb (no overcommit of the one thing that kills pods); CPU is
    requested in proportion (1/8 core per GiB, at least 50m) and not limited, so no throttling."""
    cpu = max(50, memory_mb // 8)
    return {"requests": {"cpu": f"{cpu}m", "memory": f"{memory_mb}Mi"}, "limits": {"memory": f"{memory_mb}Mi"}}


def restricted_pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def restricted_container_security(read_only_root: bool) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
    }


def fetch_code_container(config: OperatorConfig, fn: FunctionRef) -> dict[str, Any]:
    """The init container that downloads the function's code archive through its signed URL (a Secret
    key: renewing it restarts nothing) and unpacks it after checking its SHA-256; no S3 credential."""
    what = "binary" if fn.compiled else "code archive"
    args = [f"--url-env={CODE_URL_ENV}", f"--key={fn.fetch_key}", f"--sha256={fn.fetch_sha256}",
            f"--dest={CODE_WORKSPACE}/{CODE_SUBDIR}", f"--max-bytes={CODE_MAX_BYTES}", f"--what={what}"]
    return {
        "name": FETCH_CODE_CONTAINER,
        "image": config.build_fetch_image,
        "command": ["python", "-m", "sless_operator.contextfetch"],
        "args": args,
        "env": [code_url_env(fn)],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {**restricted_container_security(True), "runAsUser": FETCH_UID, "runAsGroup": FETCH_UID},
        "volumeMounts": [{"name": CODE_VOLUME, "mountPath": CODE_WORKSPACE}],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }  # fmt: skip


def code_url_env(fn: FunctionRef) -> dict[str, Any]:
    """The signed URL, from the function's Secret: read when a container starts, so renewing it restarts nothing."""
    source = {"name": code_secret_name(fn.name), "key": CODE_URL_KEY}
    return {"name": CODE_URL_ENV, "valueFrom": {"secretKeyRef": source}}


def self_fetch_env(fn: FunctionRef) -> list[dict[str, Any]]:
    """What the runtime container needs to fetch its own code (``FunctionRef.fetches_itself``); the runtime
    takes the URL out of its environment before the handler loads."""
    values = {CODE_KEY_ENV: fn.fetch_key, CODE_SHA256_ENV: fn.fetch_sha256, CODE_MAX_BYTES_ENV: str(CODE_MAX_BYTES),
              CODE_REPORT_ENV: TERMINATION_LOG}  # fmt: skip
    return [code_url_env(fn), *({"name": k, "value": v} for k, v in values.items())]


def code_secret(fn: FunctionRef, url: str, expires: int) -> dict[str, Any]:
    """The signed URL of the function's current code archive, read by its pods at each start (the runtime
    container, or the ``fetch-code`` init container of Go and dependency-image pods)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": code_secret_name(fn.name), "namespace": fn.namespace,
                     "labels": base_labels(fn.name, COMPONENT_FUNCTION),
                     "annotations": {ANNOTATION_EXPIRES: str(expires)},
                     "ownerReferences": [fn.owner.reference()]},
        "stringData": {CODE_URL_KEY: url},
    }  # fmt: skip


def _function_pod(config: OperatorConfig, fn: FunctionRef, image: str, *, runner: bool,
                  extra_env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    runtime = RUNTIMES[fn.spec.runtime]
    # A server keeps accepting this long after its SIGTERM (answering without keep-alive): until kube-proxy's
    # next sync on every node drops the pod's endpoint, new connections to the Service may still be sent here,
    # and a listener closed at SIGTERM refused them (a rollout answered some calls 502). The preStop pause
    # covers the usual second; a busy node, or a sync the new pod has just caused, takes longer.
    drain_listen_sec = 3
    if runner:  # the result goes where the handler's own prints cannot reach (the termination message)
        extra_env = {**(extra_env or {}), "SLESS_RESULT_FILE": TERMINATION_LOG}
    else:
        extra_env = {"SLESS_DRAIN_LISTEN_SEC": str(drain_listen_sec), **(extra_env or {})}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "env": function_env(fn, extra_env),
        "resources": function_resources(fn.spec.memory_mb),
        "securityContext": restricted_container_security(runtime.read_only_root),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # noqa: S108
        # The runner's result or error: what it writes to the termination log, else the log's tail.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if runner:
        container["command"] = list(runtime.runner)
    elif fn.compiled:  # the Go run image is a bare base image: the fetched binary is the server
        container["command"] = [f"{GO_BIN_DIR}/server"]
    if fn.compiled:
        container["securityContext"].update(runAsUser=GO_RUN_UID, runAsGroup=GO_RUN_UID)
    if not runner:
        container["ports"] = [{"name": "http", "containerPort": PORT, "protocol": "TCP"}]
        probe = {"httpGet": {"path": HEALTH_PATH, "port": "http"}, "timeoutSeconds": 2}
        # every second: a new version takes traffic as soon as it answers (a rollout is how code changes)
        container["readinessProbe"] = {**probe, "periodSeconds": 1, "failureThreshold": 10}
        container["livenessProbe"] = {**probe, "initialDelaySeconds": 10, "periodSeconds": 10,
                                      "timeoutSeconds": 5, "failureThreshold": 6}  # fmt: skip
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SEC}}}
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": restricted_pod_security(),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
    }
    volume = secrets_volume(fn)
    if volume is not None:
        pod["volumes"].append(volume)
        container["volumeMounts"].append({"name": SECRETS_VOLUME, "mountPath": SECRETS_DIR, "readOnly": True})
    if config.require_sandbox or fn.spec.sandbox:  # gVisor: the only sandbox so far (models.SANDBOXES)
        pod["runtimeClassName"] = config.sandbox_runtime_class
    if runner:
        pod["restartPolicy"] = "Never"
    else:
        # SIGTERM (after the preStop pause, which the grace period includes) still accepts for a while, then
        # drains in-flight requests up to the function's timeout.
        grace = PRESTOP_SLEEP_SEC + drain_listen_sec + fn.spec.timeout_sec + 5
        pod["terminationGracePeriodSeconds"] = min(grace, MAX_GRACE_SEC)
    if fn.fetches_itself:  # the runtime unpacks into the volume itself, then makes the files read-only
        pod["volumes"].append({"name": CODE_VOLUME, "emptyDir": {"sizeLimit": CODE_VOLUME_SIZE}})
        container["env"] = sorted(container["env"] + self_fetch_env(fn), key=lambda item: str(item["name"]))
        container["volumeMounts"].append({"name": CODE_VOLUME, "mountPath": CODE_DIR})
    elif fn.fetched:
        pod["initContainers"] = [fetch_code_container(config, fn)]
        pod["volumes"].append({"name": CODE_VOLUME, "emptyDir": {"sizeLimit": CODE_VOLUME_SIZE}})
        mount_path = GO_BIN_DIR if fn.compiled else CODE_DIR
        container["volumeMounts"].append({"name": CODE_VOLUME, "mountPath": mount_path, "subPath": CODE_SUBDIR,
                                          "readOnly": True})  # fmt: skip
    if config.image_pull_secret:
        pod["imagePullSecrets"] = [{"name": config.image_pull_secret}]
    return pod


# -- Function children ----------------------------------------------------------------------------


def fetch_container(config: OperatorConfig, fn: FunctionRef) -> dict[str, Any]:
    """The init container that alone holds the S3 credentials: it unpacks the context into the emptyDir.

    The platform image (``SLESS_BUILD_FETCH_IMAGE``) runs ``sless_operator.contextfetch`` as
    non-root on a read-only root filesystem, with nothing but the Secret's two keys.
    """
    args = [f"--bucket={config.s3_bucket}", f"--key={fn.context_key}", f"--dest={BUILD_CONTEXT_DIR}",
            f"--region={config.s3_region}", f"--max-bytes={BUILD_CONTEXT_MAX_BYTES}"]  # fmt: skip
    if config.s3_endpoint:
        args.append(f"--endpoint={config.s3_endpoint}")
    if fn.context_sha256:
        args.append(f"--sha256={fn.context_sha256}")
    return {
        "name": FETCH_CONTAINER,
        "image": config.build_fetch_image,
        "command": ["python", "-m", "sless_operator.contextfetch"],
        "args": args,
        "envFrom": [{"secretRef": {"name": config.build_s3_secret}}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {**restricted_container_security(True), "runAsUser": FETCH_UID, "runAsGroup": FETCH_UID},
        "volumeMounts": [{"name": BUILD_CONTEXT_VOLUME, "mountPath": BUILD_WORKSPACE}],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


# A build's steps after fetch-context: kaniko builds into a tarball, push-image pushes it.
PUSH_CONTAINER = "push-image"
#: The build Job's init containers, in order; PUSH_CONTAINER runs after them.
BUILD_STEPS = (FETCH_CONTAINER, BUILD_CONTAINER)
IMAGE_TARBALL = f"{BUILD_WORKSPACE}/image.tar"
IMAGE_TARBALL_MAX_BYTES = 4 * 1024 * 1024 * 1024
PUSH_CONFIG_DIR = "/run/sless/registry"
KANIKO_CONFIG_DIR = "/kaniko/.docker"


def kaniko_cache(config: OperatorConfig) -> bool:
    """Whether kaniko uses the layer cache ``<registry>/cache``: it pushes cache layers while it builds.

    With a push credential (``SLESS_BUILD_REGISTRY_SECRET``) the registry wants one for that, and kaniko holds
    none: the cache is then on only when ``SLESS_BUILD_KANIKO_SECRET`` gives kaniko a credential of its own
    (which the tenant's build steps can read: scope it to the cache repository). A registry without
    credentials (nothing to steal) keeps ``SLESS_BUILD_CACHE`` as it is.
    """
    return config.build_cache and (not config.build_registry_secret or bool(config.build_kaniko_secret))


def _docker_config_volume(name: str, secret: str) -> dict[str, Any]:
    items = [{"key": ".dockerconfigjson", "path": "config.json"}]
    return {"name": name, "secret": {"secretName": secret, "items": items}}


def _mount_sources(config: OperatorConfig, fn: FunctionRef, image: str) -> list[str]:
    """Repositories of the destination's registry the build's base images come from: the push mounts their
    layers instead of uploading them again."""
    host = image.split("/", 1)[0]
    bases = [runtime_image(config, fn.spec.runtime)] + ([config.go_run_image] if fn.spec.runtime == "go1.23" else [])
    found = []
    for base in bases:
        registry, _, path = base.partition("/")
        repository = path.split("@", 1)[0].rsplit(":", 1)[0]
        if registry == host and repository and repository not in found:
            found.append(repository)
    return found


def push_container(config: OperatorConfig, fn: FunctionRef, image: str) -> dict[str, Any]:
    """The build's last step, the only one holding the push credential: ``sless_operator.imagepush`` on the
    platform image pushes the tarball kaniko left, as non-root on a read-only root, running no tenant code."""
    args = [f"--tarball={IMAGE_TARBALL}", f"--destination={image}", f"--max-bytes={IMAGE_TARBALL_MAX_BYTES}"]
    args += [f"--mount-from={repository}" for repository in _mount_sources(config, fn, image)]
    mounts: list[dict[str, Any]] = [{"name": BUILD_CONTEXT_VOLUME, "mountPath": BUILD_WORKSPACE, "readOnly": True}]
    if config.build_registry_secret:
        args.append(f"--docker-config={PUSH_CONFIG_DIR}/config.json")
        mounts.append({"name": "push-config", "mountPath": PUSH_CONFIG_DIR, "readOnly": True})
    if config.registry_insecure:
        args.append("--insecure")
    return {
        "name": PUSH_CONTAINER,
        "image": config.build_fetch_image,
        "command": ["python", "-m", "sless_operator.imagepush"],
        "args": args,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {**restricted_container_security(True), "runAsUser": FETCH_UID, "runAsGroup": FETCH_UID},
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def build_job(config: OperatorConfig, fn: FunctionRef) -> dict[str, Any]:
    """The build Job that turns ``s3://<bucket>/<contextKey>`` into the function's image.

    Three steps share an emptyDir: ``fetch-context`` (init) downloads and unpacks the context
    with the S3 credentials; kaniko (init) builds from ``dir://`` into an image tarball
    (``--no-push``) holding no credential at all, since it runs the tenant's Dockerfile steps
    (setup.py, npm install scripts) as root; then ``push-image`` pushes that tarball with the
    registry's push credential (``SLESS_BUILD_REGISTRY_SECRET``), running no tenant code. Only
    ``SLESS_BUILD_KANIKO_SECRET``, when set, is in kaniko's reach (see ``kaniko_cache``).
    """
    if fn.fetched:  # a dependency image, shared by the tenant's functions with the same manifest
        name = deps_job_name(fn.namespace, fn.deps_hash)
        image = deps_image_ref(config, fn.namespace, fn.deps_hash)
        # the function that asked first; every function with this key waits for the same Job
        labels = {**base_labels(fn.name, COMPONENT_BUILD), crd.LABEL_NAMESPACE: fn.namespace,
                  LABEL_DEPS: fn.deps_hash[:32]}  # fmt: skip
    else:
        name = build_job_name(fn.namespace, fn.name, fn.code_hash, fn.context_key)
        image = image_ref(config, fn.namespace, fn.name, fn.code_hash)
        labels = {**base_labels(fn.name, COMPONENT_BUILD), crd.LABEL_NAMESPACE: fn.namespace,
                  LABEL_CODE: fn.code_hash[:16]}  # fmt: skip
    args = [
        f"--context=dir://{BUILD_CONTEXT_DIR}",
        "--dockerfile=Dockerfile",
        f"--destination={image}",  # names the image in the tarball; push-image pushes it there
        "--no-push",
        f"--tar-path={IMAGE_TARBALL}",
        "--image-fs-extract-retry=3",
        "--verbosity=info",
    ]
    if kaniko_cache(config):
        args += ["--cache=true", f"--cache-repo={config.registry}/cache"]
    if config.registry_insecure:
        args += ["--insecure", "--skip-tls-verify"]
    args += config.kaniko_extra_args
    mounts: list[dict[str, Any]] = [{"name": BUILD_CONTEXT_VOLUME, "mountPath": BUILD_WORKSPACE}]
    volumes: list[dict[str, Any]] = [{"name": BUILD_CONTEXT_VOLUME, "emptyDir": {"sizeLimit": BUILD_WORKSPACE_SIZE}}]
    container: dict[str, Any] = {
        "name": BUILD_CONTAINER,
        "image": config.kaniko_image,
        "args": args,
        "resources": {
            "requests": {"cpu": "250m", "memory": f"{min(512, config.build_memory_mb)}Mi"},
            "limits": {"cpu": config.build_cpu, "memory": f"{config.build_memory_mb}Mi"},
        },
        "securityContext": {"allowPrivilegeEscalation": False},
        "volumeMounts": mounts,
        # kaniko writes no termination message: on failure the kubelet keeps the log's tail instead.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if config.build_kaniko_secret:  # readable by the tenant's build steps: cache and base-image pulls only
        mounts.append({"name": "kaniko-config", "mountPath": KANIKO_CONFIG_DIR, "readOnly": True})
        volumes.append(_docker_config_volume("kaniko-config", config.build_kaniko_secret))
    if config.build_registry_secret:  # mounted in push-image alone
        volumes.append(_docker_config_volume("push-config", config.build_registry_secret))
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [fetch_container(config, fn), container],
        "containers": [push_container(config, fn, image)],
        "volumes": volumes,
    }
    return _stamp({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": config.build_namespace, "labels": labels,
                     "annotations": {ANNOTATION_IMAGE: image}},
        "spec": {
            "backoffLimit": config.build_retries,
            "activeDeadlineSeconds": config.build_deadline_sec,
            "ttlSecondsAfterFinished": config.job_ttl_sec,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    })  # fmt: skip


def compile_job(config: OperatorConfig, fn: FunctionRef, builder_image: str, key: str, code_url: str,
                put_url: str) -> dict[str, Any]:  # fmt: skip
    """The Job that compiles a Go function's fetched code into ``key``, in the tenant namespace.

    Three steps share an emptyDir: ``fetch-code`` (the platform image) downloads the code archive through
    CODE_URL and checks its SHA-256; ``compile`` runs ``build.sh`` on BUILDER_IMAGE (the Go runtime image,
    or the tenant's dependency image of the function's go.mod: modules and compiled standard library
    inside, ``GOPROXY=off``: the build reaches no network); ``upload-binary`` (the platform image) writes
    the binary's archive through PUT_URL, a URL signed for exactly KEY, and leaves its SHA-256 as its
    termination message, which the operator puts into the function's pods. No S3 credential, no root:
    Pod Security ``restricted``. A compile error fails ``compile``, whose log tail the Function shows.
    """
    name = compile_job_name(fn, key)
    labels = {**base_labels(fn.name, COMPONENT_COMPILE), crd.LABEL_NAMESPACE: fn.namespace,
              LABEL_CODE: fn.code_hash[:16]}  # fmt: skip
    workspace = [{"name": CODE_VOLUME, "mountPath": CODE_WORKSPACE}]
    fetch_args = [f"--url-env={CODE_URL_ENV}", f"--key={fn.code_key}", f"--sha256={fn.code_sha256}",
                  f"--dest={COMPILE_SRC}", f"--max-bytes={CODE_MAX_BYTES}", "--what=code archive"]  # fmt: skip
    platform_security = {**restricted_container_security(True), "runAsUser": FETCH_UID, "runAsGroup": FETCH_UID}
    small = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    fetch = {
        "name": FETCH_CODE_CONTAINER, "image": config.build_fetch_image,
        "command": ["python", "-m", "sless_operator.contextfetch"], "args": fetch_args,
        "env": [{"name": CODE_URL_ENV, "value": code_url}], "resources": small,
        "securityContext": platform_security, "volumeMounts": workspace,
        "terminationMessagePath": TERMINATION_LOG, "terminationMessagePolicy": "FallbackToLogsOnError",
    }  # fmt: skip
    # Modules come only from the image's cache (no proxy), checked when the dependency image downloaded them:
    # a go.mod without its go.sum (or with requirements missing) compiles as it does with network.
    env = {"SLESS_ENTRYPOINT": fn.spec.entrypoint, "GOPROXY": "off", "GOSUMDB": "off", "HOME": "/tmp",  # noqa: S108
           "TMPDIR": "/tmp"}  # noqa: S108  (fmt: skip)
    compile_ = {
        "name": COMPILE_CONTAINER, "image": builder_image,
        "command": [COMPILE_SCRIPT, COMPILE_SRC, COMPILE_OUT],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": {"requests": {"cpu": "250m", "memory": f"{min(512, config.build_memory_mb)}Mi"},
                      "limits": {"cpu": config.build_cpu, "memory": f"{config.build_memory_mb}Mi"}},
        # the image's build cache (GOCACHE) is written to while compiling: a writable root
        "securityContext": {**restricted_container_security(False), "runAsUser": COMPILE_UID,
                            "runAsGroup": COMPILE_UID},
        "volumeMounts": [*workspace, {"name": "tmp", "mountPath": "/tmp"}],  # noqa: S108
        # build.sh writes the compiler's messages to stderr: the log's tail is the termination message
        "terminationMessagePath": TERMINATION_LOG, "terminationMessagePolicy": "FallbackToLogsOnError",
    }  # fmt: skip
    upload = {
        "name": UPLOAD_CONTAINER, "image": config.build_fetch_image,
        "command": ["python", "-m", "sless_operator.binaryupload"],
        "args": [f"--src={COMPILE_OUT}", f"--url-env={PUT_URL_ENV}", f"--key={key}",
                 f"--max-bytes={BINARY_MAX_BYTES}"],
        "env": [{"name": PUT_URL_ENV, "value": put_url}], "resources": small,
        "securityContext": platform_security, "volumeMounts": workspace,
        "terminationMessagePath": TERMINATION_LOG, "terminationMessagePolicy": "FallbackToLogsOnError",
    }  # fmt: skip
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": restricted_pod_security(),
        "initContainers": [fetch, compile_],
        "containers": [upload],
        "volumes": [{"name": CODE_VOLUME, "emptyDir": {"sizeLimit": CODE_VOLUME_SIZE}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": COMPILE_TMP_SIZE}}],
    }
    if config.image_pull_secret:
        pod["imagePullSecrets"] = [{"name": config.image_pull_secret}]
    return _stamp({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": fn.namespace, "labels": labels,
                     "annotations": {ANNOTATION_IMAGE: builder_image},
                     "ownerReferences": [fn.owner.reference()]},
        "spec": {
            "backoffLimit": 0,  # a compile error fails the same way again
            "activeDeadlineSeconds": config.build_deadline_sec,
            "ttlSecondsAfterFinished": config.job_ttl_sec,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    })  # fmt: skip


def many_replicas(fn: FunctionRef, autoscaled: bool) -> bool:
    """Can the function's Deployment run 2 or more pods (its scale's ``max``, else its fixed replicas)?"""
    if autoscaled and fn.spec.scale is not None:
        return fn.spec.scale.max >= 2
    return fn.replicas >= 2


def deployment(config: OperatorConfig, fn: FunctionRef, image: str, replicas: int | None) -> dict[str, Any]:
    """The function's Deployment; REPLICAS None: its ScaledObject (KEDA, the HPA) owns them.

    Then the object leaves ``spec.replicas`` out (an update never writes them; ``children.ensure``
    creates it with a first count) and carries ``sless.dev/autoscaled``. A Deployment that can run 2 or
    more pods spreads them over nodes (``topologySpreadConstraints``; ``pod_disruption_budget``
    keeps a drain from taking them all at once).
    """
    labels = base_labels(fn.name, COMPONENT_FUNCTION)
    pod_labels = {**labels, LABEL_CODE: fn.code_hash[:16]} if fn.fetched else labels
    annotations = {ANNOTATION_IMAGE: image}
    if replicas is None:
        annotations[ANNOTATION_AUTOSCALED] = "true"
    pod = _function_pod(config, fn, image, runner=False)
    if many_replicas(fn, replicas is None):
        pod["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector_labels(fn.name)},
        }]  # fmt: skip
    spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(fn.name)},
        "revisionHistoryLimit": 2,
        "progressDeadlineSeconds": PROGRESS_DEADLINE_SEC,
        # a new version is up and ready before an old pod stops: no gap in service
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {"metadata": {"labels": pod_labels, "annotations": pod_annotations(fn)}, "spec": pod},
    }
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    return _stamp({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": fn.name, "namespace": fn.namespace, "labels": labels, "annotations": annotations,
                     "ownerReferences": [fn.owner.reference()]},
        "spec": spec,
    })  # fmt: skip


def initial_replicas(scale: ScaleSpec, paused: bool) -> int:
    """What a scaled Deployment is created with: a pod at once (the first deploy proves one starts), none
    while the function is switched off; from then on its ScaledObject decides."""
    return 0 if paused else max(scale.min, 1)


def pod_disruption_budget(fn: FunctionRef) -> dict[str, Any]:
    """At most one of the function's pods evicted at a time (a node drain), for a Deployment of 2 or more."""
    return _stamp({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": fn.name, "namespace": fn.namespace, "labels": base_labels(fn.name, COMPONENT_FUNCTION),
                     "ownerReferences": [fn.owner.reference()]},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(fn.name)}},
    })  # fmt: skip


def scaled_object(config: OperatorConfig, fn: FunctionRef, paused: bool) -> dict[str, Any]:
    """KEDA's ScaledObject for a Function with ``scale``: it owns the Deployment's replicas.

    The metric is the function's calls in flight, pushed by the platform's external scaler
    (``SLESS_SCALER_ADDRESS``), ``target`` per pod. Scaling up is immediate; scaling down waits
    ``idle_sec`` (at most 5 minutes for the HPA's stabilisation); a new ScaledObject keeps its first
    pod ``idle_sec`` before it may go to zero. PAUSED (every http trigger disabled,
    ``observe.desired_replicas``): KEDA holds the Deployment at 0 (``paused-replicas``).
    """
    scale = fn.spec.scale
    assert scale is not None
    meta: dict[str, Any] = {"name": fn.name, "namespace": fn.namespace,
                            "labels": base_labels(fn.name, COMPONENT_FUNCTION),
                            "ownerReferences": [fn.owner.reference()]}  # fmt: skip
    if paused:
        meta["annotations"] = {ANNOTATION_PAUSED_REPLICAS: "0"}
    return _stamp({
        "apiVersion": config.keda_api_version,
        "kind": "ScaledObject",
        "metadata": meta,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": fn.name},
            "minReplicaCount": scale.min,
            "maxReplicaCount": scale.max,
            "cooldownPeriod": scale.idle_sec,
            "initialCooldownPeriod": scale.idle_sec,
            "pollingInterval": SCALE_POLLING_SEC,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {"stabilizationWindowSeconds": min(scale.idle_sec, SCALE_DOWN_WINDOW_MAX_SEC)},
            }}},
            "triggers": [{"type": "external-push", "metadata": {
                "scalerAddress": config.scaler_address, "function": fn.name, "target": str(scale.target)}}],
        },
    })  # fmt: skip


def service(fn: FunctionRef) -> dict[str, Any]:
    return _stamp({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": fn.name, "namespace": fn.namespace, "labels": base_labels(fn.name, COMPONENT_FUNCTION),
                     "ownerReferences": [fn.owner.reference()]},
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(fn.name),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    })  # fmt: skip


def run_deadline(config: OperatorConfig, timeout_sec: int) -> int:
    return (timeout_sec + RUN_MARGIN_SEC) * (config.job_retries + 1)


def _run_annotations(fn: FunctionRef) -> dict[str, str]:
    """A run Job's annotations: the function's version it runs, which its invocation record names."""
    return {crd.ANNOTATION_VERSION: str(fn.version)} if fn.version is not None else {}


def run_job(config: OperatorConfig, fn: FunctionRef, image: str, job: Owner, run_id: int,
            event: dict[str, Any], traceparent: str = "") -> dict[str, Any]:  # fmt: skip
    """One run of a FunctionJob: the function's image in runner mode with SLESS_EVENT, and TRACEPARENT (the
    OpenTelemetry environment carrier the runner reads) when the run is traced."""
    labels = {**base_labels(fn.name, COMPONENT_RUN), crd.LABEL_JOB: job.name, crd.LABEL_RUN: str(run_id)}
    extra = {"SLESS_EVENT": json.dumps(event), **({"TRACEPARENT": traceparent} if traceparent else {})}
    pod = _function_pod(config, fn, image, runner=True, extra_env=extra)
    return _stamp({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": run_job_name(job.name, run_id), "namespace": fn.namespace, "labels": labels,
                     "annotations": _run_annotations(fn), "ownerReferences": [job.reference()]},
        "spec": {
            "backoffLimit": config.job_retries,
            "activeDeadlineSeconds": run_deadline(config, fn.spec.timeout_sec),
            "ttlSecondsAfterFinished": config.job_ttl_sec,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    })  # fmt: skip


def cron_job(config: OperatorConfig, fn: FunctionRef, image: str, trigger: Owner, schedule: str,
             enabled: bool) -> dict[str, Any]:  # fmt: skip
    """A cron trigger: the function's runner on SCHEDULE (UTC), suspended while disabled.

    The runner, not an HTTP call to the Service: a scheduled run works while the function's
    http exposure is scaled to zero, has its own deadline, and needs no extra image or
    network allowance inside the tenant namespace.
    """
    labels = {**base_labels(fn.name, COMPONENT_CRON), crd.LABEL_TRIGGER: trigger.name}
    # The firing's event as sless up sends it; the runner adds ``scheduled_at`` from the Job's name
    # (<cronjob>-<minutes of the tick>), which the pod reads through the downward API.
    event = {"type": "cron", "trigger": trigger.name, "schedule": schedule}
    pod = _function_pod(config, fn, image, runner=True, extra_env={"SLESS_EVENT": json.dumps(event)})
    env = pod["containers"][0]["env"]
    job_name = {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_NAME_LABEL}']"}}
    env.append({"name": "SLESS_CRON_JOB", "valueFrom": job_name})
    env.sort(key=lambda item: str(item["name"]))
    return _stamp({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": cron_job_name(trigger.name), "namespace": fn.namespace, "labels": labels,
                     "ownerReferences": [trigger.reference()]},
        "spec": {
            "schedule": schedule,
            "timeZone": "Etc/UTC",
            "suspend": not enabled,
            # the platform's cron rules (sless_core.contract), the same as sless up's scheduler
            "concurrencyPolicy": "Allow" if contract.CRON_OVERLAP else "Forbid",
            "startingDeadlineSeconds": contract.CRON_START_DEADLINE_SEC,
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 1,
            "jobTemplate": {
                "metadata": {"labels": labels, "annotations": _run_annotations(fn)},
                "spec": {
                    "backoffLimit": config.job_retries,
                    "activeDeadlineSeconds": run_deadline(config, fn.spec.timeout_sec),
                    "ttlSecondsAfterFinished": config.job_ttl_sec,
                    "template": {"metadata": {"labels": labels}, "spec": pod},
                },
            },
        },
    })  # fmt: skip


# -- namespaces -----------------------------------------------------------------------------------



def build_namespace(config: OperatorConfig) -> dict[str, Any]:
    """The build namespace: ``baseline``, since kaniko unpacks images as root."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": config.build_namespace, "labels": {crd.POD_SECURITY_ENFORCE: "baseline",
                                                                crd.POD_SECURITY_WARN: "baseline",
                                                                crd.LABEL_MANAGED: crd.MANAGED_BY}},
    }  # fmt: skip


QUOTA_NAME = "sless-quota"
LIMITS_NAME = "sless-limits"
DENY_NAME = "sless-default-deny"
ALLOW_PLATFORM_NAME = "sless-allow-platform"
ALLOW_DNS_NAME = "sless-allow-dns"
ALLOW_EGRESS_NAME = "sless-allow-egress"
ALLOW_CODE_FETCH_NAME = "sless-allow-code-fetch"


def s3_address(config: OperatorConfig) -> tuple[str, int] | None:
    """The S3 endpoint as (IP, port) when its host is an address literal (a NetworkPolicy needs addresses);
    None for a name (allow it with ``SLESS_FUNCTION_EGRESS_CIDRS``) or AWS."""
    endpoint = config.s3_endpoint
    if not endpoint:
        return None
    secure = endpoint.startswith("https://")
    parts = urlsplit("//" + endpoint.removeprefix("https://").removeprefix("http://"))
    try:
        ip = ipaddress.ip_address(parts.hostname or "")
        port = parts.port or (443 if secure else 80)
    except ValueError:
        return None
    return str(ip), port


def tenant_quota(config: OperatorConfig) -> dict[str, str]:
    """The tenant namespace's ResourceQuota: compute, and object counts of what a tenant can make through
    the API (functions, triggers, jobs, secrets; the API answers a create beyond it with a 403 naming the
    quota), of pods, and of persistent storage (the platform makes none)."""
    return {
        "pods": str(config.tenant_quota_pods),
        "requests.cpu": config.tenant_quota_cpu,
        "requests.memory": config.tenant_quota_memory,
        "limits.memory": config.tenant_quota_memory,
        f"count/{crd.FUNCTION_PLURAL}.{crd.GROUP}": str(config.tenant_quota_functions),
        f"count/{crd.TRIGGER_PLURAL}.{crd.GROUP}": str(config.tenant_quota_triggers),
        f"count/{crd.JOB_PLURAL}.{crd.GROUP}": str(config.tenant_quota_jobs),
        "secrets": str(config.tenant_quota_secrets),
        "requests.storage": config.tenant_quota_storage,
    }


def dns_peers(config: OperatorConfig) -> list[dict[str, Any]]:
    """Where tenant pods may send DNS queries: the cluster DNS's pods (namespace and labels) and the
    listed addresses (a node-local cache, a DNS server outside the pods' network), never any resolver:
    a function resolves names only through the cluster DNS, which a query cannot bypass."""
    peers: list[dict[str, Any]] = [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.dns_namespace}},
        "podSelector": {"matchLabels": dict(config.dns_pod_labels)},
    }]  # fmt: skip
    peers.extend({"ipBlock": {"cidr": cidr}} for cidr in config.dns_cidrs)
    return peers


def tenant_objects(config: OperatorConfig, namespace: str) -> list[dict[str, Any]]:
    """ResourceQuota, LimitRange and NetworkPolicies of a tenant namespace.

    Traffic: everything denied, then ingress to the functions' port only from the platform's
    namespace (invoke proxy, event dispatcher), egress to the cluster DNS only (``dns_peers``),
    and egress to the configured CIDRs (e.g. a database) when the provider lists any.
    """
    labels = {crd.LABEL_MANAGED: crd.MANAGED_BY}

    def meta(name: str) -> dict[str, Any]:
        return {"name": name, "namespace": namespace, "labels": dict(labels)}

    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": meta(QUOTA_NAME),
         "spec": {"hard": tenant_quota(config)}},
        {"apiVersion": "v1", "kind": "LimitRange", "metadata": meta(LIMITS_NAME), "spec": {"limits": [{
            "type": "Container",
            "default": {"memory": "256Mi"},
            "defaultRequest": {"cpu": "50m", "memory": "128Mi"},
            "max": {"memory": "8Gi"},
        }]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(DENY_NAME),
         "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(ALLOW_PLATFORM_NAME),
         "spec": {
             "podSelector": {"matchLabels": {crd.LABEL_COMPONENT: COMPONENT_FUNCTION}},
             "policyTypes": ["Ingress"],
             "ingress": [{
                 "from": [{"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": config.platform_namespace}}}],
                 "ports": [{"protocol": "TCP", "port": PORT}],
             }],
         }},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(ALLOW_DNS_NAME),
         "spec": {
             "podSelector": {},
             "policyTypes": ["Egress"],
             "egress": [{"to": dns_peers(config),
                         "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}],
         }},
    ]  # fmt: skip
    address = s3_address(config)
    if address is not None:  # function pods fetch their code from S3 (the signed URL grants one object)
        ip, port = address
        cidr = f"{ip}/{32 if ipaddress.ip_address(ip).version == 4 else 128}"
        objects.append({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(ALLOW_CODE_FETCH_NAME),
            # every pod of the tenant: function, run and cron pods all fetch their code
            "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                     "egress": [{"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": port}]}]},
        })  # fmt: skip
    if config.function_egress_cidrs:
        objects.append({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(ALLOW_EGRESS_NAME),
            "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                     "egress": [{"to": [{"ipBlock": {"cidr": c}} for c in config.function_egress_cidrs]}]},
        })  # fmt: skip
    return [_stamp(obj) for obj in objects]


PLURALS = {
    "Job": "jobs",
    "CronJob": "cronjobs",
    "Deployment": "deployments",
    "Service": "services",
    "ResourceQuota": "resourcequotas",
    "LimitRange": "limitranges",
    "NetworkPolicy": "networkpolicies",
    "Namespace": "namespaces",
    "Secret": "secrets",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ScaledObject": "scaledobjects",
}
