"""A real ``sless-scaler`` process on a free loopback port: for its own tests and for the scaling tests that feed
it from an API process and let a real KEDA read it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from tests.support.poll import until
from tests.support.services import free_port

TOKEN = "scaler-test-token-0123456789"
SCALER = Path(sys.executable).with_name("sless-scaler")


@dataclass
class Scaler:
    address: str
    proc: subprocess.Popen[bytes]
    log: Path

    def lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]


def serving(address: str) -> bool:
    """Whether the scaler's gRPC health service says SERVING."""
    async def check() -> bool:
        async with grpc.aio.insecure_channel(address) as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                        response_deserializer=health_pb2.HealthCheckResponse.FromString)
            try:
                answer = await check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.aio.AioRpcError:
                return False
            return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    return asyncio.run(check())


def _up(proc: subprocess.Popen[bytes], address: str) -> bool:
    """Serving, or exited (then the caller looks why)."""
    return proc.poll() is not None or serving(address)


def start(log_dir: Path, name: str = "scaler", **env: str) -> Scaler:
    """``sless-scaler`` on a free loopback port with extra env vars, serving; stop it with :func:`stop`."""
    for attempt in range(3):  # a free port can be taken between free_port() and the bind
        address = f"127.0.0.1:{free_port()}"
        log = log_dir / f"{name}-{attempt}.log"
        full = {**os.environ, "SLESS_SCALER_LISTEN": address, "SLESS_SCALER_TOKEN": TOKEN,
                "SLESS_LOG_FORMAT": "json", "SLESS_LOG_LEVEL": "DEBUG", **env}  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen([str(SCALER)], env=full, stdout=out, stderr=subprocess.STDOUT)
        until(f"sless-scaler serving on {address}", functools.partial(_up, proc, address), 30)
        if proc.poll() is None:
            return Scaler(address, proc, log)
    raise AssertionError(f"sless-scaler did not start: {log.read_text()[-2000:]}")


def stop(scaler: Scaler) -> None:
    if scaler.proc.poll() is None:
        scaler.proc.send_signal(signal.SIGTERM)
        try:
            scaler.proc.wait(15)
        except subprocess.TimeoutExpired:
            scaler.proc.kill()
            scaler.proc.wait()


@contextlib.contextmanager
def running(log_dir: Path, **env: str) -> Iterator[Scaler]:
    scaler = start(log_dir, **env)
    try:
        yield scaler
    finally:
        stop(scaler)
