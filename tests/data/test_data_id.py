"""data_id: short, stable, sensitive to what changes the bytes, blind to what does not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from data_corpus import write_text_files

from pipeline_lib.spec.config import DataConfig, SourceConfig, TokenizerConfig
from pipeline_lib.spec.data_id import data_fingerprint, data_id, source_fingerprint


def test_data_id_is_12_hex_and_stable():
    a = data_id(DataConfig())
    assert re.fullmatch(r"[0-9a-f]{12}", a)
    assert a == data_id(DataConfig())


def test_data_id_follows_everything_that_changes_the_bytes():
    base = DataConfig()
    ids = {data_id(base)}
    variants = [
        replace(base, seq_len=64), replace(base, epochs=3), replace(base, val_fraction=0.1),
        replace(base, seed=1), replace(base, token_dtype="uint32"),
        replace(base, tokenizer=TokenizerConfig(type="bpe")),
        replace(base, sources=[SourceConfig(type="reasoning", seed=1)]),
        replace(base, sources=[SourceConfig(type="reasoning", max_difficulty=5)]),
        replace(base, sources=[SourceConfig(type="stdlib", max_docs=10)]),
        replace(base, sources=[SourceConfig(type="stdlib", weight=2.0)]),
    ]
    for v in variants:
        ids.add(data_id(v))
    assert len(ids) == len(variants) + 1


def test_bpe_knobs_do_not_change_a_byte_pack():
    a = DataConfig(tokenizer=TokenizerConfig(type="byte", vocab_size=512))
    b = DataConfig(tokenizer=TokenizerConfig(type="byte", vocab_size=4096))
    assert data_id(a) == data_id(b)
    c = DataConfig(tokenizer=TokenizerConfig(type="bpe", vocab_size=512))
    d = DataConfig(tokenizer=TokenizerConfig(type="bpe", vocab_size=4096))
    assert data_id(c) != data_id(d)


def test_file_sources_are_fingerprinted_by_stat(tmp_path):
    glob = write_text_files(tmp_path / "t", ["one", "two"])
    data = DataConfig(sources=[SourceConfig(type="text", path=glob)])
    first = data_id(data)
    files = source_fingerprint(data.sources[0])["files"]
    assert [os.path.basename(f[0]) for f in files] == ["doc_000.txt", "doc_001.txt"]
    assert [f[1] for f in files] == [3, 3]
    os.utime(tmp_path / "t" / "doc_000.txt", ns=(1, 1_000_000_000))
    second = data_id(data)
    assert second != first
    (tmp_path / "t" / "doc_002.txt").write_text("three")
    assert data_id(data) not in {first, second}


def test_missing_files_give_an_id_not_an_error(tmp_path):
    data = DataConfig(sources=[SourceConfig(type="parquet", path=str(tmp_path / "*.parquet"))])
    assert re.fullmatch(r"[0-9a-f]{12}", data_id(data))


def test_identity_imports_nothing_heavy():
    code = ("import sys; from pipeline_lib.spec.config import DataConfig; "
            "from pipeline_lib.spec.data_id import data_id; import pipeline_lib.data; "
            "data_id(DataConfig()); "
            "heavy = {'torch', 'pyarrow', 'tokenizers', 'numpy'} & {m.split('.')[0] "
            "for m in sys.modules}; print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_curriculum_and_record_fields_change_the_id_only_when_set(tmp_path):
    base = DataConfig()
    assert "curriculum_fraction" not in data_fingerprint(base)  # old packs keep their id
    assert data_id(replace(base, curriculum_fraction=0.0)) == data_id(base)
    ids = {data_id(base), data_id(replace(base, curriculum_fraction=0.3)),
           data_id(replace(base, curriculum_fraction=0.6))}
    assert len(ids) == 3
    path = write_text_files(tmp_path / "j", ["{}"]).replace("*.txt", "doc_000.txt")
    plain = SourceConfig(type="jsonl", path=path)
    assert not {"prompt_field", "answer_field", "level_field"} & set(source_fingerprint(plain))
    variants = [plain, replace(plain, prompt_field="q", answer_field="a"),
                replace(plain, level_field="k"),
                replace(plain, prompt_field="q", answer_field="a", level_field="k")]
    assert len({data_id(replace(base, sources=[v])) for v in variants}) == 4


def _tree(root):
    """A corpus tree without symlinks: nested, hidden, bracketed names."""
    for rel in ("a.txt", "x/b.txt", "x/y/c.txt", "x/.hidden/d.txt", ".e.txt", "x/[f].txt",
                "x/g.jsonl"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)


def test_globs_without_symlinks_match_exactly_what_glob_matches(tmp_path):
    """So the data_id of every ordinary glob stays what it was."""
    import glob

    from pipeline_lib.spec.data_id import source_files

    _tree(tmp_path / "c")
    for pattern in ("c/**/*.txt", "c/**", "c/*/**/*.txt", "c/**/y/*.txt", "c/x/*.txt",
                    "c/**/**/*.txt", "c/x/[[]f].txt", "nothing/**/*.txt"):
        absolute = str(tmp_path / pattern)
        # (glob lists a file once per way two ``**`` reach it; source_files once)
        expected = sorted({p for p in map(Path, glob.glob(absolute, recursive=True))
                           if p.is_file()})
        src = SourceConfig(type="text", path=absolute)
        assert source_files(src) == expected, pattern
    src = SourceConfig(type="text", path=str(tmp_path / "c" / "**" / "*.txt"))
    assert "answer_spans" not in data_fingerprint(DataConfig(sources=[src]))  # id unchanged


def test_a_symlink_loop_is_not_followed_and_a_file_is_listed_once(tmp_path):
    from pipeline_lib.spec.data_id import glob_source

    _tree(tmp_path / "c")
    (tmp_path / "c" / "x" / "up").symlink_to("..")  # a loop
    (tmp_path / "c" / "x" / "y" / "self").symlink_to(".")  # and another
    (tmp_path / "c" / "alias.txt").symlink_to("x/b.txt")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "h.txt").write_text("h")
    (tmp_path / "c" / "ext").symlink_to(tmp_path / "elsewhere")  # no loop: followed
    found = glob_source(SourceConfig(type="text", path=str(tmp_path / "c" / "**" / "*.txt")))
    c = tmp_path / "c"
    assert found.files == [c / "a.txt", c / "ext" / "h.txt", c / "x" / "[f].txt",
                           c / "x" / "b.txt", c / "x" / "y" / "c.txt"]
    assert found.loops == [str(c / "x" / "up"), str(c / "x" / "y" / "self")]
    assert found.duplicates == [(c / "alias.txt", c / "x" / "b.txt")]
    # the fingerprint lists the same five files once each
    fp = source_fingerprint(SourceConfig(type="text", path=str(c / "**" / "*.txt")))
    assert len(fp["files"]) == len({f[0] for f in fp["files"]}) == 5


def test_answer_span_version_is_in_the_id_of_packs_with_answers_only():
    from pipeline_lib.spec.data_id import ANSWER_SPAN_VERSION

    reasoning = DataConfig(sources=[SourceConfig(type="reasoning")])
    assert data_fingerprint(reasoning)["answer_spans"] == ANSWER_SPAN_VERSION == 2
    qa = DataConfig(sources=[SourceConfig(type="jsonl", path="x.jsonl", prompt_field="q",
                                          answer_field="a")])
    assert data_fingerprint(qa)["answer_spans"] == 2
    assert "answer_spans" not in data_fingerprint(DataConfig(sources=[SourceConfig(
        type="stdlib")]))


def test_heldout_and_labelled_sources_are_fingerprinted(tmp_path):
    from pipeline_lib.spec.data_id import LABELLED_GENERATOR_VERSION

    base = DataConfig(sources=[SourceConfig(type="reasoning")])
    assert "heldout" not in source_fingerprint(base.sources[0])  # old packs keep their id
    held = replace(base, sources=[SourceConfig(type="reasoning", heldout=True)])
    assert source_fingerprint(held.sources[0])["heldout"] is True
    assert data_id(held) != data_id(base)

    tasks = SourceConfig(type="labelled", tasks=["chain_root"], min_difficulty=2,
                         max_difficulty=9, seed=4, num_docs=50)
    fp = source_fingerprint(tasks)
    assert fp == {"type": "labelled", "weight": 1.0, "max_docs": 0,
                  "generator_version": LABELLED_GENERATOR_VERSION, "num_docs": 50,
                  "tasks": ["chain_root"], "min_difficulty": 2, "max_difficulty": 9, "seed": 4}
    ids = {data_id(DataConfig(sources=[s])) for s in
           [tasks, replace(tasks, seed=5), replace(tasks, max_difficulty=8),
            replace(tasks, tasks=["prefix_parity"]), replace(tasks, heldout=True)]}
    assert len(ids) == 5

    path = write_text_files(tmp_path / "l", ["{}"]).replace("*.txt", "doc_000.txt")
    records = SourceConfig(type="labelled", path=path, tasks=["khop"])
    fp = source_fingerprint(records)
    assert [Path(f[0]).name for f in fp["files"]] == ["doc_000.txt"]
    assert "tasks" not in fp and "text_field" not in fp  # a path: its files, no generator
    first = data_id(DataConfig(sources=[records]))
    os.utime(path, ns=(1, 1_000_000_000))
    assert data_id(DataConfig(sources=[records])) != first
