"""lm-eval's own ``hf`` model on an export scores the built-in tasks exactly as the ``loopline``
model scores the snapshot: same per-example accuracy (multiple choice: log-likelihoods agree
too; generation: the same text), at the training loop count and at ``num_loops=4`` passed
through ``--model_args``. Offline: the task data are local JSONL files."""

from __future__ import annotations

import pytest
from snapshot_helpers import train_pattern_model, write_tiny_snapshot
from support.lm_eval_samples import per_example

from pipeline_lib.bench.lm_wrapper import LooplineLM
from pipeline_lib.bench.runner import task_manager_for
from pipeline_lib.bench.tasks import write_builtin_tasks
from pipeline_lib.data.tokenizer import byte_level_tokenizer
from pipeline_lib.export import export_snapshot
from pipeline_lib.spec.config import BenchConfig

pytestmark = pytest.mark.slow

TASKS = ["loopline_khop", "loopline_addition"]


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """(snapshot, its export, task manager) with the pattern model and 2 × 2 examples a task."""
    root = tmp_path_factory.mktemp("lm_eval_hf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(root / "hf_home"))
        tok = byte_level_tokenizer()
        snap = write_tiny_snapshot(root / "snapshots" / "step_0000007",
                                   train_pattern_model(tok), tok, step=7)
        export_snapshot(snap, root / "export")
        bench = BenchConfig(tasks=TASKS, examples_per_level=2, min_difficulty=1,
                            max_difficulty=2, max_gen_toks=6)
        write_builtin_tasks(bench, root / "tasks")
        yield snap, root / "export", task_manager_for(TASKS, root / "tasks")


@pytest.mark.parametrize("h_eff", [2, 4])
def test_hf_model_on_the_export_scores_like_the_loopline_model(setting, h_eff):
    from lm_eval.models.huggingface import HFLM

    snap, export, manager = setting
    ours = per_example(LooplineLM(snapshot=str(snap), h_eff=h_eff, batch_size=4), manager, TASKS)
    extra = {} if h_eff == 2 else {"num_loops": h_eff}  # 2 = config.num_loops, the default
    hf = HFLM(pretrained=str(export), backend="causal", trust_remote_code=True,
              dtype="float32", device="cpu", batch_size=4, **extra)
    assert hf.model.config.num_loops == h_eff and hf.max_length == 24
    theirs = per_example(hf, manager, TASKS)
    for task in TASKS:
        assert [(d, m) for d, m, _ in theirs[task]] == [(d, m) for d, m, _ in ours[task]], task
        assert len(ours[task]) == 4
    for (_, _, a), (_, _, b) in zip(theirs["loopline_khop"], ours["loopline_khop"], strict=True):
        assert [ll for ll, _ in a] == pytest.approx([ll for ll, _ in b], abs=1e-4)
        assert [greedy for _, greedy in a] == [greedy for _, greedy in b]
    assert [r for _, _, r in theirs["loopline_addition"]] == [
        r for _, _, r in ours["loopline_addition"]]
