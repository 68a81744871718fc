"""The Kubernetes backend: custom resources written by the API, reconciled by the operator."""
