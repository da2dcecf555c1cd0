"""Where a figure was made: the checkout's git state, the CPU's name and package versions
(stamps of the docs' generated sections, the device check's JSON, the benchmarks, a parent
run's tags). Imports nothing of loopline."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path


def git_output(repo: Path, *args: str) -> str | None:
    """``git -C repo ARGS``'s stripped output, or None (no git, not a checkout, an error)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def package_version(package: str, missing: str) -> str:
    """The installed version of ``package``, else ``missing``."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return missing


def repo_root(path: Path) -> Path:
    """The top of the git checkout holding ``path`` (a file or folder), else ``path``'s
    folder: where a page's stamp reads the commit and its repository paths start."""
    folder = Path(path).resolve()
    folder = folder if folder.is_dir() else folder.parent
    top = git_output(folder, "rev-parse", "--show-toplevel")
    return Path(top).resolve() if top else folder


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
