"""docs/configuration.md's table of every config key and the modules that read it is what
the generator makes of this checkout (regenerate with ``make schema``)."""

from __future__ import annotations

from pipeline_lib import config_readers
from pipeline_lib.cli import main
from pipeline_lib.config_readers import DOC_PATH, DOC_SECTION, config_keys, keys_markdown
from pipeline_lib.results_doc import markers
from pipeline_lib.spec import schema as spec_schema


def test_committed_key_table_is_the_generated_one() -> None:
    begin, end = markers(DOC_SECTION)
    committed = DOC_PATH.read_text().split(begin)[1].split(end)[0].strip()
    assert committed == keys_markdown().strip(), \
        "docs/configuration.md's key table is stale: run `make schema`"


def test_every_key_is_in_the_table_once() -> None:
    rows = [line.split(" | ")[0] for line in keys_markdown().splitlines()]
    assert all(rows.count(f"| `{key}`") == 1 for key in config_keys())


def test_schema_write_regenerates_the_table(tmp_path, monkeypatch, capsys) -> None:
    """``schema --write`` (``make schema``) rewrites the schema and, between its markers, the
    page's table; the rest of the page is kept."""
    begin, end = markers(DOC_SECTION)
    page, schema = tmp_path / "configuration.md", tmp_path / "config.schema.yaml"
    page.write_text(f"# head\n{begin}\nold\n{end}\ntail\n")
    monkeypatch.setattr(config_readers, "DOC_PATH", page)
    monkeypatch.setattr(spec_schema, "SCHEMA_PATH", schema)
    assert main(["schema", "--write"]) == 0
    assert page.read_text() == f"# head\n{begin}\n{keys_markdown()}\n{end}\ntail\n"
    assert schema.read_text() == spec_schema.schema_yaml()
    assert "config key table regenerated" in capsys.readouterr().out
