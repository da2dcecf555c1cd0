"""`schema`: print or rewrite the JSON schema generated from the config dataclasses."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("schema", help="print (or --write) the config JSON schema")
    parser.add_argument("--write", action="store_true",
                        help="rewrite workflow/schemas/config.schema.yaml")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..spec.schema import SCHEMA_PATH, schema_yaml, write_schema

    if args.write:
        print(write_schema(SCHEMA_PATH))
    else:
        print(schema_yaml(), end="")
    return 0
