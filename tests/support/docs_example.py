"""docs/data.md's worked example of labelled records: its two JSONL files and its config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

DATA_PAGE = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def worked_example(where: Path) -> tuple[dict[str, Any], list[list[dict[str, Any]]]]:
    """The example's ``data`` section, its sources' paths pointing at its two files written
    into ``where`` (train.jsonl, test.jsonl), and the records of each file."""
    section = DATA_PAGE.read_text().split("**Labelled records (sequence labelling).**")[1]
    texts = [block.split("```")[0].strip() for block in section.split("```jsonl\n")[1:3]]
    data = yaml.safe_load(section.split("```yaml\n")[1].split("```")[0])["data"]
    for name, text in zip(("train", "test"), texts, strict=True):
        (where / f"{name}.jsonl").write_text(text + "\n")
    for src in data["sources"]:
        src["path"] = str(where / Path(src["path"]).name)
    return data, [[json.loads(line) for line in text.splitlines()] for text in texts]
