"""Open and close an AMQP connection with the URL in $SLESS_AMQP_URL; exit 1 saying why it failed.

Run by the rabbitmq role on the play's host: a real login to the platform's vhost with the
platform's own credentials, not just an open port.
"""

import os
import sys

import pika

url = os.environ["SLESS_AMQP_URL"]
params = pika.URLParameters(url)
params.socket_timeout = 10
params.blocked_connection_timeout = 10
try:
    connection = pika.BlockingConnection(params)
except Exception as exc:  # any failure is reported the same way: which vhost, which user, why
    sys.exit(f"cannot log in to vhost {params.virtual_host!r} as {params.credentials.username!r}: {exc!r}")
props = connection._impl.server_properties
version = props.get("version", b"")
connection.close()
print(
    f"{params.credentials.username}@{params.host}:{params.port} vhost {params.virtual_host!r} ok "
    f"(RabbitMQ {version.decode() if isinstance(version, bytes) else version})"
)
