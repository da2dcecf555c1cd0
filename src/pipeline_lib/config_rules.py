"""Cross-field rules within one section of the config, apart from the dataclasses.

:func:`pipeline_lib.config.validate_config` calls them after the generic field checks
(:mod:`pipeline_lib.config_fields`); they take the section's dataclass and raise a one-line
ConfigError naming the key and the fix. Rules that span sections stay in validate_config.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

ANSWER_FIELD_SOURCE_TYPES = ("jsonl", "parquet")  # sources that read prompt/answer/level fields


def check_source_fields(i: int, src: Any) -> None:
    """``data.sources[i]`` (a SourceConfig): prompt_field/answer_field come as a pair, and
    only jsonl/parquet read them (and level_field)."""
    fields = {"prompt_field": src.prompt_field, "answer_field": src.answer_field,
              "level_field": src.level_field}
    used = [name for name, value in fields.items() if value]
    if used and src.type not in ANSWER_FIELD_SOURCE_TYPES:
        raise ConfigError(f"data.sources[{i}].{used[0]} is set on a {src.type} source; only "
                          "jsonl and parquet sources read it, remove it")
    if bool(src.prompt_field) != bool(src.answer_field):
        given, missing = (("prompt_field", "answer_field") if src.prompt_field
                          else ("answer_field", "prompt_field"))
        raise ConfigError(f"data.sources[{i}].{given} is set without {missing}; set both "
                          "(the document is prompt + answer) or neither")


def check_tokenizer(tok: Any) -> None:
    """``data.tokenizer`` (a TokenizerConfig): type file reads path; byte and bpe read
    neither a path nor a BOS setting."""
    if tok.type == "file" and not tok.path:
        raise ConfigError("data.tokenizer.path is empty for a file tokenizer; set it to a "
                          "tokenizer.json, a Hugging Face tokenizer directory or a .gguf file")
    if tok.type != "file" and tok.path:
        raise ConfigError(f"data.tokenizer.path is set for a {tok.type} tokenizer; only type "
                          "file reads it: set data.tokenizer.type to file or remove the path")
    if tok.type != "file" and tok.add_bos == "true":
        raise ConfigError(f"data.tokenizer.add_bos = true, but a {tok.type} tokenizer has no BOS "
                          "token; set it to auto or false (or use type file)")
