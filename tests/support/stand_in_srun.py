"""A stand-in for SLURM's ``srun`` inside an allocation: ``--nodes=N`` copies of the command on
this machine, one per pretended node, as ``srun --ntasks-per-node=1`` would start them.

Each copy gets ``SLURM_NODEID``/``SLURM_PROCID`` (its node), ``SLURM_LOCALID=0`` and
``SLURM_NNODES``; output goes to this process's stdout. With ``--kill-on-bad-exit=1`` the
first copy to fail ends the others. Exits with the first non-zero status, else 0. Other
options (``--ntasks-per-node=1``, ``--cpus-per-task=…``) are accepted and recorded in
``$STAND_IN_SRUN_LOG`` when set, so a test can check the command line it was given.

Usage (tests): put an executable ``srun`` that runs this file on ``PATH``
(:func:`install_stand_in_srun`) and set ``SLURM_JOB_ID``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def install_stand_in_srun(bin_dir: Path) -> Path:
    """Write ``bin_dir/srun`` (runs this file with the current interpreter); returns it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE}" "$@"\n')
    srun.chmod(0o755)
    return srun


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    options: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            return options, argv[i:]
        name, _, value = arg[2:].partition("=")
        options[name] = value
    raise SystemExit("srun (stand-in): no command given")


def main(argv: list[str]) -> int:
    options, command = _parse(argv)
    if log := os.environ.get("STAND_IN_SRUN_LOG"):
        Path(log).write_text(json.dumps({"options": options, "command": command}))
    nodes = int(options.get("nodes", "1"))
    procs = [subprocess.Popen(command, env={**os.environ, "SLURM_NODEID": str(n),
                                            "SLURM_PROCID": str(n), "SLURM_LOCALID": "0",
                                            "SLURM_NNODES": str(nodes)})
             for n in range(nodes)]
    status = 0
    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if failed and options.get("kill-on-bad-exit") == "1":
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        time.sleep(0.1)
    for p in procs:
        if p.returncode != 0 and status == 0:
            status = p.returncode
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
