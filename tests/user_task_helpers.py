"""A user's own lm-eval task folder, as a researcher would write it: relative data_files,
an ``include:`` template, a ``!function`` hook with its utils.py, a per-example level field."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

STOPS = ["\n", ";", " "]  # as the built-in generate_until tasks (tests reuse their scorer)


def pointer_rows(level_field: str = "depth") -> list[dict]:
    """Multiple choice: which digit does the last variable hold (2 choices, levels 1..2)."""
    rows = []
    for level, prompts in ((1, ["a=3;print(a)=", "a=7;print(a)="]),
                           (2, ["a=4;b=a;print(b)=", "a=1;b=a;print(b)="])):
        for i, prompt in enumerate(prompts):
            answer = prompt[2]
            choices = [answer, "5"] if i % 2 == 0 else ["5", answer]
            rows.append({"prompt": prompt, "choices": choices, "label": choices.index(answer),
                         "answer": answer, level_field: level})
    return rows


def echo_rows(level_field: str = "depth") -> list[dict]:
    """Generation: continue the digit pattern the bench test model was trained on."""
    return [{"prompt": p, "answer": a, level_field: lv}
            for p, a, lv in (("5678", "9", 1), ("0123", "4", 1), ("345", "6", 2), ("12", "3", 2))]


def write_user_tasks(root: Path, level_field: str = "depth") -> Path:
    """``root/pointer.yaml`` (+ data/pointer.jsonl) and ``root/gen/echo.yaml`` (+ template,
    utils.py, echo.jsonl). Returns ``root``."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "gen").mkdir(parents=True, exist_ok=True)
    (root / "data" / "pointer.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in pointer_rows(level_field)))
    (root / "pointer.yaml").write_text(yaml.safe_dump({
        "task": "my_pointer", "tag": ["my_suite"], "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": "data/pointer.jsonl"}},
        "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "prompt",
        "doc_to_choice": "choices", "doc_to_target": "label", "target_delimiter": "",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }, sort_keys=False))
    (root / "gen" / "echo.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in echo_rows(level_field)))
    (root / "gen" / "_echo_template_yaml").write_text(yaml.safe_dump({
        "dataset_path": "json", "dataset_kwargs": {"data_files": ["echo.jsonl"]},
        "test_split": "train", "output_type": "generate_until", "doc_to_text": "prompt",
        "doc_to_target": "answer", "target_delimiter": "",
        "generation_kwargs": {"until": STOPS, "max_gen_toks": 6, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean",
                         "higher_is_better": True}],
    }, sort_keys=False))
    (root / "gen" / "utils.py").write_text(
        "def keep_all(dataset):\n    return dataset.filter(lambda doc: bool(doc['answer']))\n")
    (root / "gen" / "echo.yaml").write_text(
        "include: _echo_template_yaml\ntask: my_echo\ntag: my_suite\n"
        "process_docs: !function utils.keep_all\n")
    return root
