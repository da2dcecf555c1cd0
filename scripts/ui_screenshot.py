"""Screenshots of the MLflow UI over a tracking store: the run list and the chart view.

    python scripts/ui_screenshot.py [--store results/mlflow.db] [--experiment NAME] [--out docs/ui]

(``make ui-screenshot`` runs it over the demo store.) It starts ``mlflow ui --workers 1`` on
a free 127.0.0.1 port over a *copy* of the store (the store itself is never touched), and
headless Chromium saves ``runs.png`` (the variants' parent runs: status, dataset, duration,
headline metrics) and ``charts.png`` (the chart view: one chart per headline metric, e.g.
``heff/final_loss`` against step = H_eff, one line per variant) into ``--out``.

Chromium reaches the UI as ``http://loopline-ui:PORT`` (mapped to 127.0.0.1 by
``--host-resolver-rules``; the server allows that host and origin): on a loopback host name
MLflow 3 opens its assistant side panel by itself, over a third of the page.
Without the store it says so and exits 0: run ``make demo`` first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

HOST = "loopline-ui"  # the name Chromium uses for 127.0.0.1
STARTUP_S = 120
SETTLE_MS = 60000  # Chromium's virtual time budget: the SPA loads and draws its charts within it
LIST_WINDOW = "1600,700"
CHART_WINDOW = "1600,1400"
PARENTS = "tags.`loopline.role` = 'parent'"
ORDER = "metrics.`heff/best_loss`"  # best variant first


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(port: int, endpoint: str, **query: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def start_ui(db: Path, port: int, log: Path) -> subprocess.Popen:
    """`mlflow ui` over ``db`` on 127.0.0.1:``port``, reachable as HOST; waits for /health."""
    origin = f"{HOST}:{port}"
    cmd = [str(Path(sys.executable).with_name("mlflow")), "ui", "--workers", "1",
           "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1", "--port", str(port),
           "--allowed-hosts", f"{origin},127.0.0.1:{port}",
           "--cors-allowed-origins", f"http://{origin}"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=db.parent,
                                start_new_session=True)
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    stop(proc)
    raise SystemExit(f"error: mlflow ui did not start; its log: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    """End the UI's process group (uvicorn and MLflow's job runners are its children)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=15)


def pick_experiment(port: int, name: str | None) -> tuple[str, str]:
    """(id, name) of ``name``, else of the experiment with the most recent loopline parents."""
    found = _get(port, "experiments/search", max_results="1000").get("experiments", [])
    if name is not None:
        for exp in found:
            if exp["name"] == name:
                return exp["experiment_id"], name
        raise SystemExit(f"error: no experiment {name!r} in the store; pass --experiment with "
                         f"one of {[e['name'] for e in found]}")
    ranked = sorted(found, key=lambda e: -int(e.get("last_update_time", 0)))
    for exp in ranked:
        if exp["name"] != "Default":
            return exp["experiment_id"], exp["name"]
    raise SystemExit("error: the store holds no experiment; run `make demo` first")


def screenshot(chromium: str, url: str, out: Path, window: str) -> None:
    """One headless Chromium screenshot of ``url`` into ``out``."""
    with tempfile.TemporaryDirectory(prefix="loopline-chromium-") as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
               f"--host-resolver-rules=MAP {HOST} 127.0.0.1", f"--screenshot={out}",
               f"--window-size={window}", f"--virtual-time-budget={SETTLE_MS}", url]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if result.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
        raise SystemExit(f"error: chromium wrote no screenshot of {url}: "
                         f"{result.stderr.strip().splitlines()[-1:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, default=Path("results/mlflow.db"),
                        help="SQLite tracking store (default: the demo's results/mlflow.db)")
    parser.add_argument("--experiment", help="experiment name (default: the latest updated)")
    parser.add_argument("--out", type=Path, default=Path("docs/ui"), help="directory of the PNGs")
    parser.add_argument("--chromium", default=None, help="Chromium binary (default: on PATH)")
    args = parser.parse_args(argv)
    if not args.store.is_file():
        print(f"no tracking store at {args.store}: run `make demo` first; no screenshots taken")
        return 0
    chromium = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: chromium not found; install it (`apt-get install -y chromium`, "
                         "which `make ui-screenshot` does) or pass --chromium PATH")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="loopline-ui-") as tmp:
        db = Path(tmp) / "mlflow.db"
        shutil.copyfile(args.store, db)
        port = _free_port()
        proc = start_ui(db, port, Path(tmp) / "ui.log")
        try:
            exp_id, name = pick_experiment(port, args.experiment)
            page = f"http://{HOST}:{port}/#/experiments/{exp_id}/runs"
            query = urllib.parse.urlencode({"searchFilter": PARENTS, "orderByKey": ORDER,
                                            "orderByAsc": "true"})
            shots = {"runs.png": (f"{page}?{query}", LIST_WINDOW),
                     "charts.png": (f"{page}?{query}&compareRunsMode=CHART", CHART_WINDOW)}
            for file, (url, window) in shots.items():
                screenshot(chromium, url, args.out / file, window)
        finally:
            stop(proc)
    print(f"experiment {name!r} of {args.store}: {', '.join(str(args.out / f) for f in shots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
