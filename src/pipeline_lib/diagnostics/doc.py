"""The device section of docs/performance.md, generated from a device check's JSON
(``make device-results``).

Only the text between ``<!-- results:device:begin -->`` and ``<!-- results:device:end -->``
is rewritten, so no device figure there is typed by hand: a stamp (device, torch, the commit
checked, date, how many checks passed), issue 14's GPU targets against what the JSON
measured (``not measured`` off a CUDA device, never a CPU figure in a GPU row), and one row
per check with its main figures and whatever it skipped. The JSON itself is kept in the
repository (``docs/device/device_check.json`` by default), so the section can be regenerated;
the stamp names it by its path in the repository.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..provenance import repo_root
from ..results_doc import replace_between_markers

SECTION = "device"
GPU_TYPES = ("cuda",)  # where the GPU targets apply (the check's `resolved` device type)


@dataclass(frozen=True)
class Target:
    """One GPU target of issue 14: where its figure lies in the JSON, and the bar."""

    figure: str  # as the section names it
    target: str
    values: Callable[[Mapping[str, Any]], list[float]]  # the figures found in the checks
    met: Callable[[float], bool]


def _field(check: str, *path: str) -> Callable[[Mapping[str, Any]], list[float]]:
    def get(checks: Mapping[str, Any]) -> list[float]:
        value: Any = checks.get(check, {})
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return [] if value is None else [float(value)]
    return get


def _per_shape(key: str) -> Callable[[Mapping[str, Any]], list[float]]:
    def get(checks: Mapping[str, Any]) -> list[float]:
        shapes = checks.get("cross_entropy", {}).get("shapes", [])
        return [float(s[key]) for s in shapes if key in s]
    return get


TARGETS = (
    Target("`train_throughput.mfu` (bf16; stated for d_model 1024, the check runs 768)",
           "≥ 0.40", _field("train_throughput", "mfu"), lambda v: v >= 0.40),
    Target("`cross_entropy.shapes[].triton_speedup_vs_eager` (V 32k–128k)", "≥ 1.5",
           _per_shape("triton_speedup_vs_eager"), lambda v: v >= 1.5),
    Target("`cross_entropy.shapes[].triton_peak_ratio` (Triton / eager peak memory)", "≤ 0.1",
           _per_shape("triton_peak_ratio"), lambda v: v <= 0.1),
    Target("`flex_attention.kernel_alone.flex_speedup` (vs SDPA, dense mask, packed rows)",
           "≥ 1", _field("flex_attention", "kernel_alone", "flex_speedup"), lambda v: v >= 1),
    Target("`heff_sweep.speedup_vs_cpu` (the same snapshot's sweep on the CPU)", "≥ 50",
           _field("heff_sweep", "speedup_vs_cpu"), lambda v: v >= 50),
)

# The figures of each check shown in its row (the JSON holds them all).
KEY_FIGURES = {
    "train_steps": ("precision", "attention", "tokens_per_s"),
    "snapshot_resume": ("identical", "max_loss_diff", "max_weight_diff"),
    "fsdp_segment": ("backend", "identical", "max_loss_diff"),
    "cross_entropy": ("shapes",),
    "flex_attention": ("kernel", "max_diff", "recompiles_after_first_length", "kernel_alone"),
    "moe_grouped_mm": ("dtype", "max_diff", "grouped_ms", "loop_ms"),
    "train_throughput": ("params", "d_model", "precision", "tokens_per_s", "model_tflops_per_s",
                         "mfu"),
    "heff_sweep": ("device", "precision", "tokens_per_s", "speedup_vs_cpu"),
    "lm_eval": ("tasks", "examples", "examples_per_s"),
    "generation": ("identical", "tokens_per_s", "reference_tokens_per_s"),
    "kv_cache": ("identical_fp32", "relative_logit_diff_fp32", "speedup"),
}
SHAPE_FIGURES = ("v", "dtype", "eager_ms", "torch_ms", "triton_ms", "triton_speedup_vs_eager",
                 "triton_peak_ratio", "triton_loss_diff", "interpreted")


def _brief(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {_brief(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return "; ".join(_brief({k: s[k] for k in SHAPE_FIGURES if k in s}) for s in value)
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def load_report(path: Path) -> dict[str, Any]:
    """The device check's JSON document (``device-check --out``), checked for its keys."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"{path} does not exist; run `python benchmarks/device_check.py --out "
                        f"{path}` on the device first") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} is not JSON ({exc.msg}, line {exc.lineno}); write it with "
                        "`device-check --out`") from None
    missing = [k for k in ("resolved", "torch", "checks") if k not in doc]
    if missing:
        raise DataError(f"{path} lacks {', '.join(missing)}: not a device check report "
                        "(`device-check --out` writes one)")
    return doc


def _stamp(doc: Mapping[str, Any], source: str) -> str:
    statuses = [c.get("status") for c in doc["checks"].values()]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("pass", "fail", "skip")
                       if statuses.count(s))
    device = doc.get("name") or doc["resolved"]
    partial = "" if doc.get("complete", True) else " · **cut short: partial results**"
    quick = " · `--quick` sizes" if doc.get("quick") else ""
    return (f"*Generated by `make device-results` from `{source}`: the device check of commit "
            f"`{doc.get('commit', 'unknown')}` on {doc.get('date', 'an unrecorded date')} · "
            f"device: {device} (`{doc['resolved']}`), torch {doc['torch']} · {counts}, "
            f"{doc.get('seconds', '?')} s{quick}{partial}.*")


def _target_rows(doc: Mapping[str, Any]) -> list[str]:
    on_gpu = str(doc["resolved"]).split(":")[0] in GPU_TYPES
    rows = ["| figure (device check JSON) | target | measured | met |", "|---|---|---|---|"]
    for t in TARGETS:
        values = t.values(doc["checks"]) if on_gpu else []
        if not on_gpu:
            measured, met = f"not measured (device: {doc['resolved']})", "—"
        elif not values:
            measured, met = "not in the report (check failed or skipped)", "—"
        else:
            measured = " / ".join(f"{v:.3g}" for v in values)
            met = "✓" if all(t.met(v) for v in values) else "✗"
        rows.append(f"| {t.figure} | {t.target} | {measured} | {met} |")
    return rows


def _check_rows(doc: Mapping[str, Any]) -> list[str]:
    rows = ["| check | status | s | figures | not run here |", "|---|---|---|---|---|"]
    for name, check in doc["checks"].items():
        shown = [k for k in KEY_FIGURES.get(name, ()) if k in check]
        figures = ", ".join(f"{k} {_brief(check[k])}" for k in shown)
        notes = [check["detail"]] if check.get("detail") else []
        notes += [f"{part}: {why}" for part, why in check.get("skipped", {}).items()]
        rows.append(f"| `{name}` | {check.get('status', '?')} | {check.get('seconds', '')} | "
                    f"{_cell(figures)} | {_cell('; '.join(notes))} |")
    return rows


def device_markdown(doc: Mapping[str, Any], source: str) -> str:
    """The section's markdown: stamp, GPU targets, one row per check."""
    lines = ["<!-- generated by `make device-results` from a device check's JSON: edits between "
             "the markers are overwritten -->", "", _stamp(doc, source), "",
             "GPU targets (issue 14; figures only from a CUDA run of the device check):", "",
             *_target_rows(doc), "", "Every check of that run:", "", *_check_rows(doc)]
    return "\n".join(lines)


def write_device_doc(report: Path, page: Path) -> str:
    """Rewrite ``page``'s device section from the JSON at ``report``; returns the section."""
    page = Path(page)
    if not page.is_file():
        raise DataError(f"page {page} does not exist; pass --doc PATH (a page holding the "
                        "results:device markers)")
    text = page.read_text()
    replace_between_markers(text, "", page, SECTION)  # fail on missing markers first
    doc = load_report(report)
    source = Path(os.path.relpath(Path(report).resolve(), repo_root(page))).as_posix()
    body = device_markdown(doc, source)
    page.write_text(replace_between_markers(text, body, page, SECTION))
    return body
