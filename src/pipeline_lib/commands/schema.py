"""`schema`: print or rewrite the JSON schema generated from the config dataclasses, and
(``--write``) the table of every config key and the modules that read it in
docs/configuration.md."""

from __future__ import annotations

import argparse

from ..results_doc import replace_between_markers
from ..spec import schema as spec_schema
from ._common import Command, arg

COMMAND = Command("schema", "print (or --write) the config JSON schema", (
    arg("--write", action="store_true",
        help="rewrite workflow/schemas/config.schema.yaml and the key table of "
             "docs/configuration.md"),))


def run(args: argparse.Namespace) -> int:
    # generators of files the CLI's other commands never need: only when this one runs
    from ..config_readers import DOC_PATH, DOC_SECTION, keys_markdown

    if args.write:
        print(spec_schema.write_schema(spec_schema.SCHEMA_PATH))  # read at call time
        text = DOC_PATH.read_text()
        DOC_PATH.write_text(replace_between_markers(text, keys_markdown(), DOC_PATH,
                                                    DOC_SECTION))
        print(f"{DOC_PATH}: config key table regenerated")
    else:
        print(spec_schema.schema_yaml(), end="")
    return 0
