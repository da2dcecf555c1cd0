"""lm-eval's own ``hf`` model on a pretrained Llama directory and the ``loopline`` model on
its import (every layer, one loop) score the built-in tasks example for example alike:
the same per-example accuracy and generations, log-likelihoods within float rounding.
Offline: the task data are local JSONL files."""

from __future__ import annotations

import pytest
from support.hf_import_helpers import save_tiny_llama
from support.lm_eval_samples import per_example

from pipeline_lib.bench.lm_wrapper import LooplineLM
from pipeline_lib.bench.runner import task_manager_for
from pipeline_lib.bench.tasks import write_builtin_tasks
from pipeline_lib.retrofit.hf_import import import_checkpoint
from pipeline_lib.spec.config import BenchConfig, Config

pytestmark = pytest.mark.slow
TASKS = ["loopline_khop", "loopline_addition"]


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    root = tmp_path_factory.mktemp("import_lm_eval")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(root / "hf_home"))
        save_tiny_llama(root / "pretrained")
        import_checkpoint(root / "pretrained", root / "snap", Config())
        bench = BenchConfig(tasks=TASKS, examples_per_level=3, min_difficulty=1,
                            max_difficulty=2, max_gen_toks=6)
        write_builtin_tasks(bench, root / "tasks")
        yield root / "pretrained", root / "snap", task_manager_for(TASKS, root / "tasks")


def test_hf_on_the_original_scores_like_loopline_on_the_import(setting):
    from lm_eval.models.huggingface import HFLM

    pretrained, snap, manager = setting
    ours = per_example(LooplineLM(snapshot=str(snap), h_eff=1, batch_size=4), manager, TASKS)
    hf = HFLM(pretrained=str(pretrained), backend="causal", dtype="float32", device="cpu",
              batch_size=4, max_length=128)
    theirs = per_example(hf, manager, TASKS)
    for task in TASKS:
        assert [(d, m) for d, m, _ in theirs[task]] == [(d, m) for d, m, _ in ours[task]], task
        assert len(ours[task]) == 6
    for (_, _, a), (_, _, b) in zip(theirs["loopline_khop"], ours["loopline_khop"], strict=True):
        assert [ll for ll, _ in a] == pytest.approx([ll for ll, _ in b], abs=1e-3)
        assert [greedy for _, greedy in a] == [greedy for _, greedy in b]
    assert [r for _, _, r in theirs["loopline_addition"]] == [
        r for _, _, r in ours["loopline_addition"]]
