"""The Kubernetes backend: custom resources written by the API, reconciled by the operator."""

from sless_api.kube.platform import KubernetesPlatform
from sless_api.kube.settings import KubeSettings

__all__ = ["KubeSettings", "KubernetesPlatform"]
