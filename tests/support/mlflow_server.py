"""A real `mlflow server --workers 1` on a loopback port over one SQLite file, for tests.

``app_name="basic-auth"`` starts it with MLflow's authentication: the admin user and its
password come from ``admin`` (written to an auth config in the server's directory), so a
client needs those credentials for every API call.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

STARTUP_DEADLINE_S = 120  # startup takes ~10-20 s on a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`mlflow server --workers 1` on a fixed loopback port over one SQLite file."""

    def __init__(self, root: Path, *, app_name: str | None = None,
                 admin: tuple[str, str] | None = None) -> None:
        self.root = root
        self.base = f"http://127.0.0.1:{_free_port()}"
        self.app_name = app_name
        self.admin = admin
        self.proc: subprocess.Popen | None = None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.admin is not None:
            ini = self.root / "basic_auth.ini"
            ini.write_text(f"[mlflow]\ndefault_permission = READ\n"
                           f"database_uri = sqlite:///{self.root / 'auth.db'}\n"
                           f"admin_username = {self.admin[0]}\nadmin_password = {self.admin[1]}\n"
                           "authorization_function = "
                           "mlflow.server.auth:authenticate_request_basic_auth\n")
            env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
        return env

    def start(self) -> None:
        port = self.base.rsplit(":", 1)[1]
        cmd = [str(Path(sys.executable).with_name("mlflow")), "server", "--workers", "1",
               "--host", "127.0.0.1", "--port", port,
               "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
               "--artifacts-destination", str(self.root / "server_artifacts")]
        if self.app_name:
            cmd += ["--app-name", self.app_name]
        log_path = self.root / "server.log"
        with open(log_path, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=self.root, env=self._env())
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while True:  # bounded wait for /health
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Terminate the server's process group (the CLI starts uvicorn as a child)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
