"""Helpers for the credential and outbox-confinement tests (tests/reliability).

A loopback HTTP server that demands credentials on every path (as a proxy in front of
`mlflow server` does), a tiny training config, a search of every file under a directory,
and the MLflow credential variables restored after a test that sets them.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                  "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_URI")
# A tiny model and run: two optimizer steps of d_model 32 on the CPU (seconds).
TINY_TRAIN = ["model.d_model=32", "model.n_heads=2", "model.loops=2", "data.seq_len=32",
              "train.total_steps=2", "train.global_batch_rows=4", "train.micro_batch_rows=4",
              "train.warmup_steps=1", "train.eval_interval=2", "train.eval_rows=4",
              "train.sample_tokens=2", "train.steps_per_segment=2", "experiment.device=cpu",
              "train.spike.warmup_steps=1"]


def free_port() -> int:
    """A loopback port nobody listens on (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def mlflow_env() -> Iterator[None]:
    """Restore MLflow's credential variables (and MLFLOW_TRACKING_URI) afterwards: the code
    under test sets them for its process, as it must."""
    saved = {name: os.environ.get(name) for name in CREDENTIAL_ENV}
    for name in CREDENTIAL_ENV:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class AuthServer:
    """An HTTP server on 127.0.0.1 that answers only requests with the expected
    ``Authorization`` header (basic auth ``user``/``password``, or a bearer ``token``),
    else 401, on every path. Alone it serves ``/health``; with ``upstream`` (a server's
    base URL) it is an authenticating reverse proxy in front of it; ``open_health`` leaves
    ``/health`` open, as MLflow's own ``basic-auth`` app does. Records every request's path,
    Host header and Authorization header."""

    def __init__(self, user: str = "", password: str = "", token: str = "",
                 upstream: str | None = None, open_health: bool = False) -> None:
        expected = set()
        if user:
            expected.add("Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        if token:
            expected.add(f"Bearer {token}")
        self.requests: list[tuple[str, str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                auth = self.headers.get("Authorization", "")
                outer.requests.append((self.path, self.headers.get("Host", ""), auth))
                if auth not in expected and not (open_health and self.path == "/health"):
                    self._reply(401, b"", {"WWW-Authenticate": 'Basic realm="mlflow"'})
                elif upstream is not None:
                    self._forward(upstream)
                else:
                    self._reply(200 if self.path == "/health" else 404, b"OK", {})

            def _forward(self, base: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() in ("content-type", "accept")}
                request = urllib.request.Request(base + self.path, data=body, headers=headers,
                                                 method=self.command)
                try:
                    with urllib.request.urlopen(request, timeout=60) as resp:
                        self._reply(resp.status, resp.read(),
                                    {"Content-Type": resp.headers.get("Content-Type", "")})
                except urllib.error.HTTPError as exc:
                    self._reply(exc.code, exc.read(),
                                {"Content-Type": exc.headers.get("Content-Type", "")})

            def _reply(self, code: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> AuthServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def files_containing(root: Path, needle: str) -> list[Path]:
    """Every regular file under ``root`` whose bytes contain ``needle`` (links not followed)."""
    hits = []
    data = needle.encode()
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink() and data in path.read_bytes():
                hits.append(path)
    return sorted(hits)


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None,
            timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``python -m pipeline_lib ARGS`` in a subprocess (one thread, these sources first);
    stdout and stderr together, as a job log holds them. MLflow credential variables of
    the test process are not passed on."""
    base = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_ENV}
    full_env = {**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PROJECT_ROOT / "src"),
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "pipeline_lib", *args], cwd=cwd, env=full_env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout_s, check=False)
