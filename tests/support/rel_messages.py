"""Helpers of the one-line-error tests (tests/reliability/test_rel_messages*.py).

Every case runs the real command in a subprocess, as a user would: the stage CLI
(``python -m pipeline_lib``) or a Snakemake dry run of the project's Snakefile in a scratch
working directory. :func:`assert_one_line_error` is the shared verdict: a non-zero exit, the
expected fragments in exactly one ``error:`` line, and no traceback anywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = ROOT / "config" / "experiments" / "tiny.yaml"


def command_env(workdir: Path) -> dict[str, str]:
    """The environment of a test command: one thread, offline, no outside tracking URI."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "HF_HOME": str(workdir / ".hf")}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def run_cli(workdir: Path, *args: str | Path, timeout: int = 300,
            limit_file_bytes: int | None = None) -> subprocess.CompletedProcess:
    """``python -m pipeline_lib ARGS`` in ``workdir``; ``limit_file_bytes`` caps the size of
    any file the command writes (RLIMIT_FSIZE: a write past it fails with EFBIG, as a full
    disk fails with ENOSPC; Python ignores SIGXFSZ, so the write returns the error)."""
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_bytes, limit_file_bytes))

    return subprocess.run([sys.executable, "-m", "pipeline_lib", *map(str, args)],
                          capture_output=True, text=True, cwd=workdir, env=command_env(workdir),
                          timeout=timeout, preexec_fn=limit if limit_file_bytes else None)


def run_snakemake(workdir: Path, *args: str | Path, timeout: int = 300
                  ) -> subprocess.CompletedProcess:
    """A Snakemake dry run of the project's Snakefile with its working directory in
    ``workdir`` (results and logs go there); ``args`` add --configfile/--config."""
    cmd = [str(SNAKEMAKE), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--dry-run", "--cores", "1", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=workdir,
                          env=command_env(workdir), timeout=timeout)


def write_yaml(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def plain_corpus(where: Path, n: int = 24) -> Path:
    """``n`` one-line text files in ``where`` (a plain corpus: no levels, no answers)."""
    where.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (where / f"{i}.txt").write_text(f"plain text number {i}, with words to learn {i * 7}\n")
    return where


def quick_config(path: Path, corpus: Path, *, loops: int = 1, **train: object) -> Path:
    """A config over the text files of ``corpus`` on which pack and a 5-step segment take
    about a second each (``train`` keys override)."""
    return write_yaml(path, {
        "data": {"sources": [{"type": "text", "path": str(corpus / "*.txt")}], "seq_len": 32,
                 "epochs": 1, "val_fraction": 0.5, "curriculum_fraction": 0},
        "model": {"d_model": 16, "n_heads": 2, "loops": loops},
        "train": {"total_steps": 5, "steps_per_segment": 5, "global_batch_rows": 8,
                  "micro_batch_rows": 8, "eval_interval": 0, "diagnostics_interval": 0,
                  "sample_tokens": 0, "warmup_steps": 2, "objective": "last", **train},
        "eval": {"h_eff": [1]}, "runs": {}})


def assert_ok(result: subprocess.CompletedProcess) -> None:
    """The command succeeded (its stderr's tail shown when not)."""
    assert result.returncode == 0, result.stderr[-3000:]


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """The command failed with exactly one ``error: …`` line holding every fragment, and
    printed no Python traceback (stdout and stderr); returns that line."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output and 'File "' not in output, output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def entries(directory: Path) -> list[str]:
    """Names in ``directory`` (hidden ones too: a leftover temporary sibling shows here)."""
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
