"""Certificates and the admin kubeconfig of one test bed, made with the openssl CLI.

One private CA signs the apiserver's serving cert, the admin client cert (group system:masters)
and the kwok "kubelet" serving cert, so the apiserver can verify kwok when it proxies
`kubectl logs`. A second CA, the front proxy's, signs only the client cert the apiserver's
aggregator presents to extension API servers (KEDA's metrics adapter): they trust the
X-Remote-User/-Group headers of a client that CA vouches for, so it must not be the CA every
client cert of the bed comes from. Keys are ECDSA P-256 (fast to make); the service-account
signer is RSA because every token consumer understands RS256.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "30"


@dataclass(frozen=True)
class Pki:
    """Paths of every credential file of one test bed."""

    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def ca_crt(self) -> Path:
        return self.path("ca.crt")

    @property
    def front_proxy_ca_crt(self) -> Path:
        return self.path("front-proxy-ca.crt")

    @property
    def sa_key(self) -> Path:
        return self.path("sa.key")

    @property
    def sa_pub(self) -> Path:
        return self.path("sa.pub")


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def _ec_key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name, cwd=cwd)


def _leaf(name: str, subject: str, extensions: str, cwd: Path, ca: str = "ca") -> None:
    """Make NAME.key and NAME.crt signed by the CA CA.crt/CA.key in CWD, then drop the request."""
    _ec_key(f"{name}.key", cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-set_serial", str(secrets.randbits(63)), "-days", DAYS,
        "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=cwd,
    )  # fmt: skip
    (cwd / f"{name}.csr").unlink()
    (cwd / f"{name}.ext").unlink()
    (cwd / f"{name}.key").chmod(0o600)


def _ca(name: str, subject: str, cwd: Path) -> None:
    _ec_key(f"{name}.key", cwd)
    _openssl(
        "req", "-x509", "-new", "-key", f"{name}.key", "-subj", subject, "-days", DAYS,
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", f"{name}.crt", cwd=cwd,
    )  # fmt: skip


USAGE = "keyUsage=critical,digitalSignature,keyEncipherment"
FRONT_PROXY_CLIENT = "front-proxy-client"  # the CN extension API servers accept headers from


def serving_and_client_leaf(pki: Pki, name: str, subject: str, dns: tuple[str, ...], ips: tuple[str, ...]) -> Path:
    """NAME.crt/NAME.key in PKI's folder, signed by the bed's CA, good as server (DNS, IPS) and as client."""
    sans = ",".join([*(f"DNS:{n}" for n in dns), *(f"IP:{ip}" for ip in ips)])
    _leaf(name, subject, f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n{USAGE}", pki.dir)
    return pki.path(f"{name}.crt")


def make_pki(directory: Path, service_ip: str, apiserver_ips: tuple[str, ...] = ()) -> Pki:
    """Create the CA, serving, client and service-account keys in DIRECTORY.

    APISERVER_IPS: more addresses the apiserver serves on (the real node's bridge address,
    where pods reach it through the `kubernetes` Service).
    """
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", "/CN=sless-testbed-ca", directory)
    usage = USAGE
    names = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
    sans = ",".join([*(f"DNS:{n}" for n in names), "IP:127.0.0.1", f"IP:{service_ip}",
                     *(f"IP:{ip}" for ip in apiserver_ips)])  # fmt: skip
    _leaf(
        "apiserver",
        "/CN=kube-apiserver",
        f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n{usage}",
        directory,
    )
    _leaf(
        "admin",
        "/O=system:masters/CN=sless-testbed-admin",
        f"extendedKeyUsage=clientAuth\n{usage}",
        directory,
    )
    _leaf(
        "kwok",
        "/CN=kwok-node",
        f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n{usage}",
        directory,
    )
    # the aggregator's client cert (--proxy-client-cert-file), from a CA of its own (--requestheader-client-ca-file)
    _ca("front-proxy-ca", "/CN=sless-testbed-front-proxy-ca", directory)
    _leaf(FRONT_PROXY_CLIENT, f"/CN={FRONT_PROXY_CLIENT}", f"extendedKeyUsage=clientAuth\n{usage}", directory,
          ca="front-proxy-ca")  # fmt: skip
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=directory)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return Pki(directory)


def write_kubeconfig(path: Path, pki: Pki, server: str) -> None:
    """Write an admin kubeconfig that points at SERVER with file references into the PKI dir.

    JSON is valid YAML, and writing it needs no YAML library.
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "sless-testbed", "cluster": {"server": server, "certificate-authority": str(pki.ca_crt)}}
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate": str(pki.path("admin.crt")),
                    "client-key": str(pki.path("admin.key")),
                },
            }
        ],
        "contexts": [{"name": "sless-testbed", "context": {"cluster": "sless-testbed", "user": "admin"}}],
        "current-context": "sless-testbed",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
