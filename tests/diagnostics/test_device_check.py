"""The one-command device check on this CPU: the real checks (``--quick`` sizes), the table,
the JSON line and ``--out`` file, skipped checks and parts with their reasons, the exit
status; a check that fails is reported and the others still run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.cli import main
from pipeline_lib.diagnostics import CHECKS
from pipeline_lib.diagnostics.peaks import bf16_peak

ROOT = Path(__file__).resolve().parents[2]
QUICK_SKIPS = {
    "cross_entropy.triton": "--quick: the Triton interpreter runs in the full CPU check",
    "cross_entropy.peak_memory": "measured on CUDA only (here: benchmarks/bench_loss.py, one "
                                 "process per method)",
    "flex_attention": "--quick: FlexAttention's first compile takes ~20 s on a CPU",
    "train_throughput.mfu": "no bf16 peak for a cpu device: FLOP/s reported without MFU",
    "heff_sweep.vs_cpu": "the check runs on the CPU: no accelerator to compare with"}


def report(capsys: pytest.CaptureFixture) -> tuple[list[str], dict]:
    lines = capsys.readouterr().out.strip().splitlines()
    return lines[:-1], json.loads(lines[-1])


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[str], dict, Path]:
    """``device-check --quick`` on the CPU, run once: (exit status, table, JSON, work dir)."""
    import io
    from contextlib import redirect_stdout

    work = tmp_path_factory.mktemp("device_check")
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["device-check", "--quick", "--work-dir", str(work / "work"), "--out",
                   str(work / "report" / "check.json"), "experiment.device=cpu"])
    lines = out.getvalue().strip().splitlines()
    return rc, lines[:-1], json.loads(lines[-1]), work


def test_quick_check_runs_every_check_on_the_cpu(quick) -> None:
    rc, table, result, work = quick
    assert rc == 0, table
    assert table[0].startswith("device check: device cpu, resolved cpu, torch ")
    checks = result["checks"]
    assert list(checks) == list(CHECKS) and result["quick"] is True and result["complete"]
    status = {name: c["status"] for name, c in checks.items()}
    assert status == {name: "skip" if name == "flex_attention" else "pass" for name in CHECKS}
    assert [row.split()[:2] for row in table[2:]] == [[n, s] for n, s in status.items()]
    # every skipped check, and every skipped part of a check, says why
    assert result["skipped"] == QUICK_SKIPS
    assert checks["flex_attention"]["detail"] == QUICK_SKIPS["flex_attention"]
    assert checks["train_throughput"]["skipped"] == {"mfu": QUICK_SKIPS["train_throughput.mfu"]}
    assert "mfu" not in checks["train_throughput"]
    assert "skipped flex_attention" not in table[2] and "(--quick: FlexAttention" in table[6]
    assert result["seconds"] == round(sum(ch["seconds"] for ch in checks.values()), 1) > 0
    # --out holds the same document as the last line
    assert json.loads((work / "report" / "check.json").read_text()) == result


def test_quick_check_figures(quick) -> None:
    _, _, result, work = quick
    c = result["checks"]
    train = c["train_steps"]
    assert (train["precision"], train["attention"]) == ("fp32", "sdpa")
    assert train["tokens_per_s"] > 0 and train["last_loss"] < train["first_loss"]
    for name in ("snapshot_resume", "fsdp_segment"):  # bit-identical to the 4-step run
        assert (c[name]["identical"], c[name]["max_weight_diff"], c[name]["max_loss_diff"],
                c[name]["max_relative_loss_diff"]) == (True, 0.0, 0.0, 0.0), name
    assert (c["fsdp_segment"]["backend"], c["fsdp_segment"]["sharded"]) == ("gloo", True)
    assert (work / "work" / "fsdp" / "snapshots" / "step_0000004" / "model_dcp").is_dir()
    [shape] = c["cross_entropy"]["shapes"]
    assert shape["torch_loss_diff"] <= 1e-6 and shape["torch_grad_diff"] <= 1e-4
    assert shape["eager_ms"] > 0 and shape["torch_ms"] > 0 and "triton_ms" not in shape
    moe = c["moe_grouped_mm"]
    assert (moe["max_diff"], moe["width_58"], moe["dtype"]) == (0.0, "loop", "float32")
    thr = c["train_throughput"]
    assert thr["loops"] == 4 and thr["params"] > 0 and thr["steps"] == 3
    assert thr["model_tflops_per_s"] == pytest.approx(
        thr["train_flops_per_token"] * thr["tokens_per_s"] / 1e12, abs=1e-3)
    heff = c["heff_sweep"]
    assert (heff["device"], heff["precision"], heff["h_eff"]) == ("cpu", "fp32", [1, 2, 4, 8])
    assert heff["tokens"] >= 1024 and set(heff["losses"]) == {"1", "2", "4", "8"}
    assert c["lm_eval"]["tasks"] == 3 and c["lm_eval"]["examples"] == 3
    assert c["generation"]["identical"] is True and c["generation"]["new_tokens"] > 0
    kv = c["kv_cache"]
    assert kv["identical_fp32"] is True and kv["relative_logit_diff_fp32"] <= 1e-5
    assert [b["same_tokens_fp32"] for b in kv["batches"]] == [True] and kv["speedup"] > 0
    # what the checks wrote stays in --work-dir: the packs and the runs
    assert (work / "work" / "whole" / "snapshots" / "step_0000004" / "MANIFEST.json").is_file()
    assert (work / "work" / "split" / "snapshots" / "step_0000004").is_dir()
    assert (work / "work" / "model" / "snapshots" / "step_0000003").is_dir()


def test_a_spent_budget_skips_the_checks_with_the_reason(tmp_path: Path, capsys) -> None:
    rc = main(["device-check", "--only", "train_steps", "kv_cache", "--budget-s", "0",
               "--work-dir", str(tmp_path), "experiment.device=cpu"])
    _, result = report(capsys)
    assert rc == 0
    assert list(result["skipped"]) == ["train_steps", "kv_cache"]
    assert all(r.startswith("time budget spent (0 s of 0 s)") for r in result["skipped"].values())
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_a_failing_check_is_reported_and_the_rest_still_run(tmp_path: Path, capsys) -> None:
    blocked = tmp_path / "not_a_dir"
    blocked.write_text("a file where the checks want their work directory")
    rc = main(["device-check", "--only", "train_steps", "moe_grouped_mm", "--work-dir",
               str(blocked), "experiment.device=cpu"])
    table, result = report(capsys)
    assert rc == 1
    train = result["checks"]["train_steps"]
    assert train["status"] == "fail" and "not_a_dir" in train["detail"]
    assert "\n" not in train["detail"]
    assert result["checks"]["moe_grouped_mm"]["status"] == "pass"
    assert table[2].split()[:2] == ["train_steps", "fail"]
    assert blocked.read_text().startswith("a file")  # nothing written over it


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H100 80GB HBM3", ("H100 SXM", 989.4)), ("NVIDIA H100 PCIe", ("H100 PCIe", 756.0)),
    ("NVIDIA H100 NVL", ("H100 NVL", 835.0)), ("NVIDIA H200", ("H200 SXM", 989.4)),
    ("NVIDIA A100-SXM4-40GB", ("A100 (40/80 GB, SXM/PCIe)", 312.0)),
    ("NVIDIA A100 80GB PCIe", ("A100 (40/80 GB, SXM/PCIe)", 312.0)),
    ("NVIDIA L40S", ("L40S", 362.0)), ("NVIDIA A10", ("A10", 125.0)), ("NVIDIA L4", ("L4", 121.0)),
    ("NVIDIA GeForce RTX 4090", ("GeForce RTX 4090", 165.2)), ("NVIDIA A10G", None),
    ("Tesla V100-SXM2-16GB", None)])
def test_bf16_peaks_by_device_name(name: str, peak) -> None:
    assert bf16_peak(name) == peak


@pytest.mark.slow
def test_the_benchmark_script_runs_every_check(tmp_path: Path) -> None:
    """``benchmarks/device_check.py`` at CPU sizes: FlexAttention compiled, Triton interpreted."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_check.py"),
                          "--work-dir", str(tmp_path), "experiment.device=cpu"],
                         capture_output=True, text=True, env=env, timeout=900, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    checks = result["checks"]
    assert {name: c["status"] for name, c in checks.items()} == dict.fromkeys(CHECKS, "pass")
    flex = checks["flex_attention"]
    assert flex["recompiles_after_first_length"] == 0 and flex["max_diff"] <= 1e-4
    assert flex["kernel_alone"]["max_diff"] <= 1e-4
    assert flex["skipped"] == {"backward": "torch has no FlexAttention backward on the CPU"}
    interpreted = checks["cross_entropy"]["shapes"][-1]
    assert interpreted["interpreted"] is True and interpreted["triton_grad_diff"] <= 1e-4
    assert set(result["skipped"]) == {"cross_entropy.peak_memory", "flex_attention.backward",
                                      "train_throughput.mfu", "heff_sweep.vs_cpu"}


def test_a_run_cut_short_keeps_what_it_measured(tmp_path: Path, monkeypatch, capsys) -> None:
    """Each finished check is written to --out at once (``complete`` false) and its row goes
    to stderr: a device run killed by its time limit still leaves its figures."""
    from pipeline_lib.diagnostics import runner

    def killed(ctx):  # what a time limit's interrupt looks like to the runner
        raise KeyboardInterrupt

    monkeypatch.setitem(runner.RUNS, "kv_cache", killed)
    out = tmp_path / "check.json"
    with pytest.raises(KeyboardInterrupt):
        main(["device-check", "--only", "moe_grouped_mm", "kv_cache", "--work-dir",
              str(tmp_path / "work"), "--out", str(out), "experiment.device=cpu"])
    partial = json.loads(out.read_text())
    assert partial["complete"] is False and list(partial["checks"]) == ["moe_grouped_mm"]
    assert partial["checks"]["moe_grouped_mm"]["status"] == "pass"
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1].split()[:2] == ["moe_grouped_mm", "pass"]
    assert captured.out == ""  # stdout keeps its contract: the table and JSON come at the end


def _readme(tmp_path: Path) -> Path:
    readme = tmp_path / "README.md"
    readme.write_text("# title\n\ntext\n<!-- results:device:begin -->\nold\n"
                      "<!-- results:device:end -->\nafter\n")
    return readme


def test_device_results_write_the_cpu_report_without_gpu_figures(quick, tmp_path) -> None:
    """`device-results` turns a check's JSON into a page's device section: a stamp with the commit
    and device, every GPU target "not measured" on the CPU, a row per check."""
    _, _, result, work = quick
    readme = _readme(tmp_path)
    assert main(["device-results", "--report", str(work / "report" / "check.json"),
                 "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\ntext\n<!-- results:device:begin -->\n")
    assert text.endswith("<!-- results:device:end -->\nafter\n") and "\nold\n" not in text
    section = text.split("<!-- results:device:begin -->")[1]
    assert f"the device check of commit `{result['commit']}` on {result['date']}" in section
    assert "device: cpu (`cpu`)" in section and "10 pass, 1 skip" in section
    assert section.count("| not measured (device: cpu) | — |") == 5
    for name in CHECKS:
        assert f"| `{name}` | " in section
    assert "mfu: no bf16 peak for a cpu device" in section


def test_device_results_judge_each_gpu_target(quick, tmp_path) -> None:
    """On a CUDA report every target row shows what was measured and whether it holds."""
    from pipeline_lib.diagnostics.doc import device_markdown

    doc = json.loads(json.dumps(quick[2]))
    doc.update(resolved="cuda:0", name="NVIDIA H200", complete=False)
    checks = doc["checks"]
    checks["train_throughput"]["mfu"] = 0.43
    checks["cross_entropy"]["shapes"] = [
        {"v": 32768, "triton_speedup_vs_eager": 1.8, "triton_peak_ratio": 0.05},
        {"v": 131072, "triton_speedup_vs_eager": 1.4, "triton_peak_ratio": 0.04}]
    checks["flex_attention"]["kernel_alone"] = {"flex_speedup": 1.2}
    del checks["heff_sweep"]["status"]
    section = device_markdown(doc, "x.json")
    rows = {line.split(" | ")[0]: line for line in section.splitlines() if line.startswith("| `")}
    assert rows["| `train_throughput.mfu` (bf16; stated for d_model 1024, the check runs 768)"
                ].endswith("| 0.43 | ✓ |")
    speed = next(r for k, r in rows.items() if "triton_speedup_vs_eager" in k)
    assert speed.endswith("| 1.8 / 1.4 | ✗ |")  # one vocabulary misses the bar
    peak = next(r for k, r in rows.items() if "triton_peak_ratio" in k)
    assert peak.endswith("| 0.05 / 0.04 | ✓ |")
    assert next(r for k, r in rows.items() if "flex_speedup" in k).endswith("| 1.2 | ✓ |")
    assert next(r for k, r in rows.items() if "speedup_vs_cpu" in k).endswith(
        "| not in the report (check failed or skipped) | — |")
    assert "device: NVIDIA H200 (`cuda:0`)" in section and "cut short: partial results" in section


def test_device_results_refuse_a_file_that_is_no_report(tmp_path, capsys) -> None:
    readme = _readme(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"checks": {}}')
    assert main(["device-results", "--report", str(bad), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lacks resolved, torch: not a device check report" in err[0]
    assert "\nold\n" in readme.read_text()  # nothing written


def test_device_results_name_the_report_by_its_path_in_the_checkout(tmp_path, capsys) -> None:
    """A page in docs/ (``--doc``, the default target docs/performance.md) gets its section,
    and the stamp names the JSON by its path from the checkout's top, wherever the page is."""
    repo = tmp_path / "repo"
    (repo / "docs" / "device").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    page = _readme(repo / "docs")
    report = repo / "docs" / "device" / "device_check.json"
    report.write_text(json.dumps({"resolved": "cpu", "torch": "2.x", "commit": "abc1234",
                                  "checks": {"kv_cache": {"status": "pass", "speedup": 2.5}}}))
    assert main(["device-results", "--report", str(report), "--doc", str(page)]) == 0
    assert capsys.readouterr().out == f"{page}: device section regenerated from {report}\n"
    section = page.read_text().split("<!-- results:device:begin -->")[1]
    assert "from `docs/device/device_check.json`: the device check of commit `abc1234`" in section
    assert "| `kv_cache` | pass |  | speedup 2.5 |  |" in section


def test_bf16_fsdp_segment_is_judged_by_the_bf16_tolerance(tmp_path, capsys) -> None:
    """In bf16, FSDP2's bf16 parameters and one device's autocast round differently, so the
    one-rank FSDP2 segment is held to bf16's tolerance, not to bit-identity (which the fp32
    check on the CPU still demands)."""
    rc = main(["device-check", "--only", "fsdp_segment", "--quick", "--work-dir", str(tmp_path),
               "experiment.device=cpu", "experiment.precision=bf16"])
    _, result = report(capsys)
    fsdp = result["checks"]["fsdp_segment"]
    assert rc == 0 and fsdp["status"] == "pass", fsdp
    assert fsdp["sharded"] is True and 0 < fsdp["max_weight_diff"] <= 3e-2


def test_the_check_runs_where_lm_eval_mlflow_and_snakemake_are_missing() -> None:
    """A GPU machine's own Python has torch but not the bench, tracking or workflow extras
    (scripts/device_check_from_source.sh): the command imports without them and its lm_eval
    check skips with the reason (the first H200 run stopped at ``import lm_eval``)."""
    code = ("import sys\n"
            "for m in ('lm_eval', 'mlflow', 'snakemake'): sys.modules[m] = None\n"
            "from pipeline_lib.diagnostics.evaluation import lm_eval\n"
            "import pipeline_lib.commands.device_check, pipeline_lib.diagnostics.runner\n"
            "print(lm_eval(None).detail)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "lm-eval is not installed (the bench extra)"
