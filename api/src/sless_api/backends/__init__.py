"""The backends behind the REST API: ``standalone`` (``sless up``: one machine, sandboxed processes) and ``kube``
(custom resources the operator reconciles). Each implements ``sless_api.domain.ports``; nothing below this layer
knows which one runs."""
