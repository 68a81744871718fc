"""Session fixtures for real services, shared by every test folder.

Each marker's setup is automatic: a test that asks for ``pg_url``, ``s3_endpoint`` or ``k8s_testbed``
gets a real server started once per session; nothing is mocked. ``keda`` adds a real KEDA to the test bed.
``otlp_receiver`` is a real OTLP receiver (tests/support/otlp.py).
"""

import os

# Before anything imports gRPC: the scaler's tests start gRPC threads in the test process, and the sandbox tests
# later fork children from it (preexec_fn, then exec); gRPC's fork handlers have no business in those children.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from tests.support.keda import keda
from tests.support.otlp import otlp_receiver
from tests.support.rabbitmq import rabbitmq_broker, rabbitmq_url  # noqa: F401 - session fixtures
from tests.support.services import pg_server, pg_url, s3_endpoint
from tests.support.testbed import k8s_testbed

__all__ = ["k8s_testbed", "keda", "otlp_receiver", "pg_server", "pg_url", "s3_endpoint"]
