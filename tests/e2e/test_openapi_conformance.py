"""schemathesis over the OpenAPI document against a real `sless up`: no server error, no answer outside its schema.

The generated requests use one tenant's token and namespace (another namespace is a 403 the walk in
test_sec_api.py covers), so they reach the resources; names are generated, plus the tenant's real ones.
Each operation runs as its own hypothesis test (derandomized: the same cases every run).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from tests.support.platform import SlessProcess, Tenant

pytestmark = pytest.mark.e2e
EXAMPLES = 25
# What the document promises: no 5xx, only documented status codes and content types, bodies that match
# their schema. (Whether every schema-valid request is accepted is not checked: the document states the
# shapes, not every cross-field rule such as a Go entrypoint's form or a cron expression's validity.)
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance, checks.response_headers_conformance]


def test_answers_conform_to_the_document(sless: SlessProcess) -> None:
    tenant = Tenant(sless.url, "schemathesis")
    tenant.deploy("fuzzed", "python3.11", {"handler.py": "def handle(event):\n    return 'ok'\n"})
    schema = schemathesis.openapi.from_url(f"{sless.url}/v1/openapi.json")
    headers = {"Authorization": f"Bearer {tenant.token}"}
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: schemathesis.Case) -> None:
            if case.path_parameters and "ns" in case.path_parameters:
                case.path_parameters["ns"] = tenant.ns
            case.call_and_validate(headers=headers, checks=CHECKS)

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # one operation's failure must not hide the others'
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:1500]}")
    assert operations >= 17
    assert not failures, "\n\n".join(failures)
