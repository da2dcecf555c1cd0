"""Configs too big for the machine are one line before anything is allocated (issue 39, 7).

Each case runs the real command in a subprocess and expects exit 2, one ``error:`` line with
the estimate and the memory available, no traceback and nothing written. Before, these
allocated until a native traceback or the kernel's OOM killer. The subprocess runs under an
address-space limit (RLIMIT_AS) as a safety net only: were the check to regress, the command
would fail at its first big allocation instead of swapping the test machine; its peak RSS
(from ``wait4``) shows that nothing big was allocated.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from support.hf_import_helpers import TINY, save_tiny_llama
from support.rel_messages import ROOT, command_env, entries

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))  # the trainer's helpers
from trainer_helpers import config_file, make_pack, snap, tiny_config  # noqa: E402

from pipeline_lib.checkpoint.snapshot import write_snapshot  # noqa: E402
from pipeline_lib.spec.config_write import config_yaml  # noqa: E402
from pipeline_lib.train.job import train_segment  # noqa: E402

ADDRESS_LIMIT = 6 << 30  # bytes of address space a refused command may map (torch: ~2 GiB)
SMALL_RSS = 2 << 30  # peak resident memory of a command that allocated nothing big
HUGE_WIDTH = 65536


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pack(tmp_path_factory.mktemp("pack") / "data")


def run_limited(workdir: Path, *args: str | Path) -> tuple[int, str, int]:
    """``python -m pipeline_lib ARGS`` under :data:`ADDRESS_LIMIT`: (exit status, output,
    peak RSS in bytes)."""
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_LIMIT, ADDRESS_LIMIT))

    log = workdir / "command.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline_lib", *map(str, args)],
                                stdout=fh, stderr=subprocess.STDOUT, cwd=workdir,
                                env={**command_env(workdir), "PYTHONPATH": str(ROOT / "src")},
                                preexec_fn=limit)
        watchdog = threading.Timer(600, proc.kill)  # a hang fails the test, never the suite
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, log.read_text(), usage.ru_maxrss * 1024


def assert_refused(workdir: Path, *args: str | Path) -> str:
    """The command exits 2 with one ``error:`` line giving the estimate and the memory
    available; no traceback; it allocated nothing big. Returns the line."""
    code, out, peak = run_limited(workdir, *args)
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1, out
    assert "Traceback" not in out, out
    assert re.search(r"needs at least [\d.]+ [TPG]iB of memory \(weights ", lines[0]), lines[0]
    assert re.search(r"has [\d.]+ [KMGT]iB available \((MemAvailable|the memory cgroup)",
                     lines[0]), lines[0]
    assert peak < SMALL_RSS, f"peak RSS {peak} bytes: something big was allocated"
    return lines[0]


@pytest.mark.parametrize("overrides, subject", [
    (["model.d_model=65536"], "error: model.d_model = 65536, model.vocab_size = 258 ("),
    (["model.vocab_size=4000000000"], "error: model.d_model = 32, model.vocab_size = "
                                      "4000000000 (128 B parameters): training needs"),
    (["train.micro_batch_rows=1073741824", "train.global_batch_rows=1073741824"],
     "error: train.micro_batch_rows × data.seq_len = 1073741824 × 32 (model.d_model = 32): "
     "training needs at least 8.5 TiB"),
])
def test_training_too_big_is_refused_before_allocating(pack: Path, tmp_path: Path,
                                                       overrides: list[str],
                                                       subject: str) -> None:
    cfg = config_file(tmp_path / "cfg.yaml")
    run = tmp_path / "run"
    line = assert_refused(tmp_path, "train", "--config", cfg, "--data", pack, "--resume-from",
                          "none", "--until-step", "3", "--out", snap(run, 3), *overrides)
    assert line.startswith(subject), line
    assert "lower " in line
    assert not run.exists()  # no snapshot, no logs, no lease


@pytest.fixture(scope="module")
def huge_snapshot(pack: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A verified snapshot whose config.yaml holds a model of width 65536 (about 100 B
    parameters), as one trained on a large machine would; its weights are a stand-in (the
    command must refuse before it reads them)."""
    cfg = tiny_config(f"model.d_model={HUGE_WIDTH}", "model.vocab_size=258")
    return write_snapshot(tmp_path_factory.mktemp("huge") / "step_0000003",
                          model_state={"stand_in": torch.zeros(1)},
                          optimizer_state={"state": {}, "param_groups": []},
                          trainer_state={"format": 1, "step": 3}, rng_state={},
                          config_yaml=config_yaml(cfg),
                          extra_files={"tokenizer.json": (pack / "tokenizer.json").read_bytes()})


def test_evaluating_a_snapshot_too_big_is_refused(pack: Path, huge_snapshot: Path,
                                                  tmp_path: Path) -> None:
    line = assert_refused(tmp_path, "heff", "--snapshot", huge_snapshot, "--data", pack,
                          "--out", tmp_path / "heff.json", "--no-track")
    assert line.startswith(f"error: snapshot {huge_snapshot} with model.d_model = {HUGE_WIDTH}, "
                           "model.vocab_size = 258 (103 B parameters): evaluating it needs at "
                           "least 384 GiB of memory (weights 384 GiB, activations of "
                           "eval.batch_rows × data.seq_len = 13 × 32 tokens"), line
    assert entries(tmp_path) == ["command.log"]
    line = assert_refused(tmp_path, "generate", "--snapshot", huge_snapshot, "--prompt", "x")
    assert line.startswith(f"error: snapshot {huge_snapshot} with model.d_model"), line


def test_a_large_eval_batch_on_a_small_split_still_runs(pack: Path, tmp_path: Path) -> None:
    """eval.batch_rows beyond the validation split reads the split as one batch: it ran
    before the check and still does (the check counts the rows a batch really has)."""
    run = tmp_path / "run"
    train_segment(tiny_config(), pack, None, 3, snap(run, 3))
    code, out, _ = run_limited(tmp_path, "heff", "--snapshot", snap(run, 3), "--data", pack,
                               "--out", tmp_path / "heff.json", "--no-track",
                               "eval.batch_rows=1000000000")
    assert code == 0, out
    assert json.loads((tmp_path / "heff.json").read_text())["losses"]


def _huge_source(pristine: Path, out: Path) -> Path:
    """The tiny Llama's config.json and safetensors header scaled to a hidden size of 65536
    and an FFN of 262144 (about 240 B parameters); the weight file is sparse: its size is
    right, its disk use nearly nothing."""
    vocab = TINY["vocab_size"]
    dims = {64: HUGE_WIDTH, 96: 4 * HUGE_WIDTH, 32: 1024, vocab: vocab}  # q/o rows = hidden
    out.mkdir()
    for name in pristine.iterdir():
        if name.name not in ("model.safetensors", "config.json"):
            (out / name.name).write_bytes(name.read_bytes())
    config = json.loads((pristine / "config.json").read_text())
    config.update(hidden_size=HUGE_WIDTH, intermediate_size=4 * HUGE_WIDTH,
                  num_attention_heads=512, num_key_value_heads=8, head_dim=128)
    (out / "config.json").write_text(json.dumps(config))
    header, offset = {}, 0
    with safe_open(str(pristine / "model.safetensors"), "pt") as fh:
        for key in fh.keys():
            shape = [dims[d] for d in fh.get_slice(key).get_shape()]
            size = 4 * int(torch.tensor(shape).prod())
            header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [offset,
                                                                           offset + size]}
            offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(out / "model.safetensors", "wb") as fh:
        fh.write(len(blob).to_bytes(8, "little") + blob)
        fh.truncate(8 + len(blob) + offset)
    return out


def test_importing_a_source_too_big_is_refused_from_its_header(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path / "tiny")
    source = _huge_source(tmp_path / "tiny", tmp_path / "source")
    line = assert_refused(tmp_path, "import-hf", "--source", source, "--out",
                          tmp_path / "snap", "--no-track")
    assert line.startswith(f"error: the model of {source / 'config.json'} (LlamaForCausalLM, "
                           f"2"), line
    assert f"hidden size {HUGE_WIDTH}" in line and ": importing it needs at least" in line
    assert line.endswith("; import fewer of its layers (--prelude/--core/--coda, "
                         "model.init_from's) or use a machine with more memory"), line
    assert not re.search(r"\bmodel\.\w+ =", line), line  # the source's terms, not loopline's
    assert not (tmp_path / "snap").exists()
