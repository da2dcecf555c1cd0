"""Bad sampling settings are one line naming the task (or key) and the setting, before any
model runs: bench.sampling in the config, and a user task's generation_kwargs, repeats and k."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline_lib.cli import main
from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config import BenchConfig
from pipeline_lib.spec.config_load import load_config
from pipeline_lib.task_catalog import check_bench_tasks


@pytest.mark.parametrize(("override", "words"), [
    ("bench.sampling.temperature=-1", "config key bench.sampling.temperature = -1.0 is below "
                                      "its minimum 0"),
    ("bench.sampling.repeats=0", "config key bench.sampling.repeats = 0 is below its minimum 1"),
])
def test_bad_bench_sampling_is_a_one_line_config_error(override, words):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["bench.sampling.repeats=5", override])
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def _user_task(root: Path, **fields) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "rows.jsonl").write_text('{"prompt": "12", "answer": "3"}\n')
    cfg = {"task": "my_gen", "dataset_path": "json",
           "dataset_kwargs": {"data_files": {"test": "rows.jsonl"}}, "test_split": "test",
           "output_type": "generate_until", "doc_to_text": "prompt", "doc_to_target": "answer",
           "generation_kwargs": {"until": ["\n"], "do_sample": True},
           "metric_list": [{"metric": "exact_match"}], **fields}
    (root / "gen.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return root


@pytest.mark.parametrize(("fields", "words"), [
    ({"generation_kwargs": {"do_sample": True, "temperature": -0.5}},
     "generation_kwargs temperature=-0.5 must be a number >= 0"),
    ({"generation_kwargs": {"top_p": 0}}, "generation_kwargs top_p=0 must lie in (0, 1]"),
    ({"generation_kwargs": {"do_sample": True, "top_k": 0}},
     "generation_kwargs top_k=0 must be a whole number >= 1"),
    ({"repeats": 0}, "repeats=0 must be a whole number >= 1"),
    ({"repeats": 4, "metric_list": [{"metric": "loopline_samples", "k": [1, 8]}]},
     "metric loopline_samples k=8 must be a whole number from 1 to repeats=4"),
    ({"repeats": 4, "filter_list": [{"name": "maj@8", "filter": [
        {"function": "take_first_k", "k": 8}, {"function": "majority_vote"}]}]},
     "filter 'maj@8' take_first_k k=8 must be a whole number from 1 to repeats=4"),
])
def test_bad_user_task_sampling_names_the_task_and_the_kwarg(tmp_path, fields, words):
    root = _user_task(tmp_path / "tasks", **fields)
    with pytest.raises(ConfigError) as err:
        check_bench_tasks(BenchConfig(tasks=[], include_path=str(root)))
    message = str(err.value)
    assert message.startswith(f"task my_gen ({root / 'gen.yaml'}): {words}")
    assert message.endswith("fix it in the task's YAML") and "\n" not in message


@pytest.mark.slow
def test_the_bench_command_refuses_them_with_exit_2_and_writes_nothing(snapshot_dir, tmp_path,
                                                                      capsys):
    root = _user_task(tmp_path / "tasks", repeats=2,
                      metric_list=[{"metric": "loopline_samples", "k": [3]}])
    out = tmp_path / "bench" / "step_0000007.json"
    rc = main(["bench", "--snapshot", str(snapshot_dir), "--out", str(out), "--h-eff", "1",
               "bench.tasks=[]", f"bench.include_path={root}", "--no-track"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("error: task my_gen (") and "k=3" in err[0]
    assert not (tmp_path / "bench").exists()
