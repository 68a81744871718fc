"""A real JWKS server on loopback for token tests: key sets, outages, delays, a trickled answer."""

from __future__ import annotations

import json
import select
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

SUB = "019cc268-6c6a-781e-8613-4bed4ec7cd20"


class JwksServer:
    """A JWKS endpoint whose key set, status and delay the test changes; it counts the requests it gets."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.status = 200
        self.body: bytes | None = None  # overrides the JSON key set when set
        self.delay = 0.0
        # When set, the response (status line first) is written one byte per this many seconds.
        self.trickle_sec = 0.0
        self.disconnects: list[float] = []  # monotonic times at which a trickled client hung up
        self.requests = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with server._lock:
                    server.requests += 1
                    status, body, delay = server.status, server.body, server.delay
                    trickle = server.trickle_sec
                    payload = body if body is not None else json.dumps({"keys": server.keys}).encode()
                if trickle:
                    self._trickle(payload, trickle)
                    return
                if delay:
                    time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _trickle(self, payload: bytes, interval: float) -> None:
                head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
                for byte in head.encode() + payload:
                    readable, _, _ = select.select([self.connection], [], [], interval)
                    if readable and not self.connection.recv(1):
                        with server._lock:
                            server.disconnects.append(time.monotonic())
                        return
                    try:
                        self.connection.sendall(bytes([byte]))
                    except OSError:
                        with server._lock:
                            server.disconnects.append(time.monotonic())
                        return
                self.close_connection = True

            def log_message(self, fmt: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def publish(self, *jwks: dict[str, Any]) -> None:
        with self._lock:
            self.keys = list(jwks)

    def count(self) -> int:
        with self._lock:
            return self.requests

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def rsa_jwk(key: rsa.RSAPrivateKey, kid: str | None) -> dict[str, Any]:
    jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    jwk.update({"use": "sig", "alg": "RS256"})
    if kid is not None:
        jwk["kid"] = kid
    return jwk


def ec_jwk(key: ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    jwk = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    jwk["kid"] = kid
    return jwk


def token(key: Any, alg: str, kid: str | None, sub: str = SUB, ttl: int = 300) -> str:
    now = int(time.time())
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode({"sub": sub, "iat": now, "exp": now + ttl}, key, algorithm=alg, headers=headers)
