"""kwok Stages that decide how pods end: the test bed runs no containers, so a Stage plays a pod's outcome.

Shared by the operator's tests (tests/k8s) and the contract tests' kubernetes backend, which fail builds and
function starts the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
STAGE_TEMPLATE = ROOT / "tests" / "testbed" / "stages" / "sless-pod-outcome.yaml"


def render_stage(
    name: str,
    *,
    labels: dict[str, str],
    namespace: str,
    succeed: bool,
    message: str,
    exit_code: int | None = None,
    reason: str | None = None,
    delay_ms: int = 200,
) -> dict[str, Any]:
    """The Stage template with its placeholders filled and the selector narrowed to LABELS in NAMESPACE."""
    code = exit_code if exit_code is not None else (0 if succeed else 1)
    text = STAGE_TEMPLATE.read_text()
    for key, value in {
        "__NAME__": name,
        "__PHASE__": "Succeeded" if succeed else "Failed",
        "__EXIT_CODE__": str(code),
        "__REASON__": json.dumps(reason or ("Completed" if succeed else "Error")),
        "__MESSAGE__": json.dumps(message),
        "__DELAY_MS__": str(delay_ms),
    }.items():
        text = text.replace(key, value)
    stage: dict[str, Any] = yaml.safe_load(text)
    expressions = stage["spec"]["selector"]["matchExpressions"]
    expressions.append({"key": ".metadata.namespace", "operator": "In", "values": [namespace]})
    for key, value in labels.items():
        expressions.append({"key": f'.metadata.labels["{key}"]', "operator": "In", "values": [value]})
    return stage

# a Pending pod that could not fetch its code: its init container ended with an error, its app container never
# started; without an init container (a Python or Node runtime fetches its own code), the app container exited 3
FETCH_FAILED = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Ready
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  state:
    terminated:
      exitCode: 1
      reason: Error
      message: %(message)s
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  state:
{{ if $.spec.initContainers }}
    waiting:
      reason: PodInitializing
{{ else }}
    terminated:
      exitCode: 3
      reason: Error
      message: %(message)s
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
{{ end }}
phase: Failed
"""
