"""Loading and merging: config files and ``key=value`` overrides into a validated
:class:`~.config.Config`, and the merge rules, as plain data, that every entry point shares.

Resolution order (later wins): dataclass defaults ← ``config/config.yaml`` (the embedded
default) ← a user config file (may be partial) ← ``key=value`` overrides. A named variant
from ``runs:`` is applied last by :func:`config_for_run`. ``load_config`` (the stage
commands' ``--config A --config B``) and the Snakefile (its ``--configfile A B``) stack files
by the same rules: sections merge key by key, lists and scalars replace, and a file that
lists ``runs:`` replaces the variants before it (a variant set is one unit). Light: no torch,
OmegaConf imported when a file is read (:func:`~.config_errors.omegaconf`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..credentials import redact_text
from ..errors import ConfigError
from .config import Config
from .config_errors import explain_omegaconf_error, mistyped_section, omegaconf
from .config_write import to_dict
from .rules import sources_have_answers, sources_have_levels, validate_config

log = logging.getLogger(__name__)
PROJECT_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG_PATH = PROJECT_ROOT / "config" / "config.yaml"
# eval's and bench's adaptive-exit keys before they became one subsection (``X.adaptive``):
# ``X.adaptive_Y`` is ``X.adaptive.Y``; the single ``X.adaptive_criterion: C`` is
# ``X.adaptive.criteria: [C]`` unless the section lists ``adaptive_criteria`` (which won then)
LEGACY_ADAPTIVE_KEYS = {"adaptive_thresholds": "thresholds", "adaptive_criteria": "criteria",
                        "adaptive_criterion_thresholds": "criterion_thresholds",
                        "adaptive_max_loops": "max_loops"}
LEGACY_CRITERION = "adaptive_criterion"
ADAPTIVE_SECTIONS = ("eval", "bench")


def read_yaml(path: Path) -> Any:
    """The mapping in the YAML file ``path`` (an OmegaConf ``DictConfig``; empty for an
    empty file), or a ConfigError naming the file."""
    OmegaConf = omegaconf().OmegaConf
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; pass a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass an existing YAML file")
    try:
        loaded = OmegaConf.load(path)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}: "
                          f"{exc.reason}); save it as UTF-8") from None
    except Exception as exc:  # yaml.YAMLError and friends
        raise ConfigError(yaml_error(path, exc)) from None
    if loaded is None:
        return OmegaConf.create({})
    if not isinstance(loaded, Mapping) and not hasattr(loaded, "keys"):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not a list")
    return upgrade_legacy_keys(loaded, str(path))


def upgrade_legacy_keys(data: Any, source: str) -> Any:
    """``data`` (a config mapping, plain or OmegaConf; its ``runs:`` variants too) with the
    legacy adaptive-exit keys of eval and bench (:data:`LEGACY_ADAPTIVE_KEYS`) written as
    their ``adaptive`` subsection, and a warning naming them; ``data`` itself when it has
    none. Snapshots written before the subsection keep loading through it."""
    variants = data.get("runs") if isinstance(data.get("runs"), Mapping) else {}
    if not any(_legacy_keys(part) for part in (data, *variants.values())
               if isinstance(part, Mapping)):
        return data
    DictConfig, OmegaConf = omegaconf().DictConfig, omegaconf().OmegaConf

    plain = OmegaConf.to_container(data, resolve=False) if isinstance(data, DictConfig) \
        else copy.deepcopy(dict(data))
    renamed = _upgrade_sections(plain, "")
    for name, variant in (plain.get("runs") or {}).items():
        if isinstance(variant, dict):
            renamed += _upgrade_sections(variant, f"runs.{name}.")
    log.warning("%s: %s; read as the new keys, rename them there", source, ", ".join(renamed))
    return OmegaConf.create(plain) if isinstance(data, DictConfig) else plain


def _legacy_keys(part: Mapping) -> list[str]:
    return [key for section in ADAPTIVE_SECTIONS if isinstance(part.get(section), Mapping)
            for key in part[section] if key in LEGACY_ADAPTIVE_KEYS or key == LEGACY_CRITERION]


def _upgrade_sections(part: dict, prefix: str) -> list[str]:
    """Move the legacy keys of ``part``'s eval and bench into their ``adaptive`` (in place);
    what was renamed, as ``old → new``."""
    renamed = []
    for name in ADAPTIVE_SECTIONS:
        section = part.get(name)
        if not isinstance(section, dict) or not _legacy_keys({name: section}):
            continue
        where = f"{prefix}{name}"
        new = dict(section.get("adaptive") or {})
        for old, key in LEGACY_ADAPTIVE_KEYS.items():
            if old in section:
                new[key] = section.pop(old)
                renamed.append(f"{where}.{old} → {where}.adaptive.{key}")
        if LEGACY_CRITERION in section:
            single = section.pop(LEGACY_CRITERION)
            renamed.append(f"{where}.{LEGACY_CRITERION} → {where}.adaptive.criteria (a list)")
            if not new.get("criteria"):  # an empty legacy list meant [adaptive_criterion]
                new["criteria"] = [single]
        if new.get("criteria") == []:  # the legacy list's "empty = [adaptive_criterion]"
            new.pop("criteria")
        section["adaptive"] = new
    return renamed


def yaml_error(path: Path, exc: Exception) -> str:
    """One line for a YAML syntax error in ``path``: where (line and column, 1-based, as
    editors count) and what PyYAML found."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    found = f"{problem} ({context})" if context else problem
    return (f"config file {path} is not valid YAML{where}: {found}; fix the syntax there "
            "(indentation, a missing ':' or closing bracket)")


def config_paths(path: str | Path | Sequence[str | Path] | None,
                 base: str | Path | None) -> list[Path]:
    """``path`` as a list of files (one, several, or none), ``base`` itself left out."""
    paths = [] if path is None else [path] if isinstance(path, str | Path) else list(path)
    return [Path(p) for p in paths
            if base is None or Path(p).resolve() != Path(base).resolve()]


def set_keys(data: Any, prefix: str = "") -> set[str]:
    """The dotted keys a plain mapping sets (``{"data": {"seq_len": 8}}`` → ``data.seq_len``;
    a list is one value)."""
    keys: set[str] = set()
    for key, value in (data.items() if isinstance(data, Mapping) else ()):
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            keys |= set_keys(value, name)
        else:
            keys.add(name)
    return keys


def user_keys(paths: Sequence[str | Path], default: Path, overrides: Any = None) -> set[str]:
    """The keys the user's config files (``default`` left out) and ``overrides`` set."""
    keys = set_keys(overrides or {})
    for file in config_paths(paths, default):
        keys |= set_keys(omegaconf().OmegaConf.to_container(read_yaml(file), resolve=False))
    return keys


def data_defaults(merged: Mapping[str, Any], explicit: set[str]) -> dict[str, Any]:
    """Values that follow the data: ``{key: value}`` to set in ``merged`` (plain data).

    config/config.yaml's defaults suit its built-in reasoning corpus, whose documents have
    levels and answers: ``data.curriculum_fraction: 0.3`` and ``train.objective:
    answer_deep_supervision``. With sources that have no levels (no answers) and the key not
    set by the user (``explicit``: keys set by their files, overrides or the variant), the
    curriculum is off (0) and the objective scores every token (``answer_X`` → ``X``)."""
    data, train = merged.get("data") or {}, merged.get("train") or {}
    sources = data.get("sources") or []
    changes: dict[str, Any] = {}
    fraction = data.get("curriculum_fraction")
    if ("data.curriculum_fraction" not in explicit and isinstance(fraction, int | float)
            and fraction > 0 and not sources_have_levels(sources)):
        changes["data.curriculum_fraction"] = 0.0
    objective = train.get("objective")
    if ("train.objective" not in explicit and isinstance(objective, str)
            and objective.startswith("answer_") and not sources_have_answers(sources)):
        changes["train.objective"] = objective.removeprefix("answer_")
    return changes


def apply_data_defaults(merged: dict[str, Any], explicit: set[str]) -> dict[str, Any]:
    """``merged`` (plain data) with :func:`data_defaults` set in it (in place; returned)."""
    for key, value in data_defaults(merged, explicit).items():
        section, name = key.split(".")
        merged[section][name] = value
    return merged


def merge_config_dicts(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Plain-data merge with the loader's rules: mappings merge recursively, lists and
    scalars replace, and a top-level ``runs`` in ``update`` replaces ``base``'s variants."""

    def merge(a: Any, b: Any) -> Any:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out = dict(a)
            for key, value in b.items():
                out[key] = merge(a[key], value) if key in a else copy.deepcopy(value)
            return out
        return copy.deepcopy(b)

    merged = merge(base, update)
    if "runs" in update:
        merged["runs"] = copy.deepcopy(update["runs"])
    return merged


def merge_config_files(paths: Sequence[str | Path], default: Path) -> dict[str, Any]:
    """``default`` (the embedded config/config.yaml) ← each of ``paths`` in order, by
    :func:`merge_config_dicts`, each file read as ``load_config`` reads it: plain data,
    unvalidated, equal to what ``load_config(paths)`` resolves."""
    merged: dict[str, Any] = {}
    for file in [Path(default), *config_paths(paths, default)]:
        data = omegaconf().OmegaConf.to_container(read_yaml(file))
        assert isinstance(data, dict)
        merged = merge_config_dicts(merged, data)
    return merged


def merge_user_config(paths: Sequence[str | Path], default: Path, last: Mapping[str, Any],
                      overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Snakefile's config: ``default`` ← ``paths`` ← ``last`` (Snakemake's ``--config``,
    or its whole config when no file was given), with the defaults that follow the data set
    where the user (``paths`` and ``overrides``) did not set them."""
    merged = merge_config_dicts(merge_config_files(paths, default), dict(last))
    return apply_data_defaults(merged, user_keys(paths, default, overrides))


def _merge(base: Any, update: Any, source: str) -> Any:
    try:
        return omegaconf().OmegaConf.merge(base, update)
    except omegaconf().errors.OmegaConfBaseException as exc:
        raise ConfigError(explain_omegaconf_error(exc, source, Config, update)) from None
    except TypeError as exc:  # e.g. a section given as a list, a list as a mapping
        raise ConfigError(mistyped_section(source, Config, update) or (
            f"{source}: {exc}; give sections as mappings and lists (such as data.sources) "
            "whole, e.g. data.sources=[{type: stdlib}]")) from None


def _validated(cfg: Any, source: str) -> Config:
    """The merged OmegaConf config as a validated :class:`Config`. Interpolations
    (``${train.lr}``) are resolved here, as OmegaConf does; one that does not resolve (an
    unknown key, a missing environment variable, a bad grammar) is a one-line ConfigError
    naming the key."""
    try:
        out = omegaconf().OmegaConf.to_object(cfg)
    except omegaconf().errors.OmegaConfBaseException as exc:
        raise ConfigError(explain_omegaconf_error(exc, source, Config, cfg)) from None
    assert isinstance(out, Config)
    validate_config(out)
    return out


def _structured(data: Mapping[str, Any] | Any, source: str) -> Config:
    return _validated(_merge(omegaconf().OmegaConf.structured(Config), data, source), source)


def _follow_data(cfg: Any, updates: Sequence[Any]) -> None:
    """Set in ``cfg`` (merged, OmegaConf) the defaults that follow the data and that none of
    ``updates`` (the user's files and overrides) sets (see :func:`data_defaults`)."""
    OmegaConf = omegaconf().OmegaConf
    explicit = set().union(*(set_keys(OmegaConf.to_container(u, resolve=False))
                             for u in updates))
    for key, value in data_defaults(OmegaConf.to_container(cfg, resolve=False),
                                    explicit).items():
        OmegaConf.update(cfg, key, value)


def load_config(
    path: str | Path | Sequence[str | Path] | None = None,
    overrides: Sequence[str] = (),
    *,
    base: str | Path | None = DEFAULT_CONFIG_PATH,
) -> Config:
    """Defaults ← ``base`` (config/config.yaml) ← ``path`` (one file, or several merged in
    order) ← ``key=value`` overrides.

    Sections merge key by key and lists are replaced; a file that lists ``runs:`` replaces
    the variants below it (a variant set is one unit, see :func:`merge_config_dicts`).
    """
    OmegaConf = omegaconf().OmegaConf
    cfg = OmegaConf.structured(Config)
    if base is not None and Path(base).is_file():
        cfg = _merge(cfg, read_yaml(Path(base)), str(base))
    updates = []  # what the user set: files and overrides
    for file in config_paths(path, base):
        update = read_yaml(file)
        if "runs" in update:
            cfg.runs = {}
        cfg = _merge(cfg, update, str(file))
        updates.append(update)
    if overrides:
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override '{item}' must look like key=value (e.g. train.lr=1e-3)")
        try:
            dotlist = OmegaConf.from_dotlist(list(overrides))
        except Exception as exc:
            raise ConfigError(redact_text(f"cannot parse overrides {list(overrides)}: {exc}")
                              ) from None
        cfg = _merge(cfg, upgrade_legacy_keys(dotlist, "command-line override"),
                     "command-line override")
        updates.append(dotlist)
    if base is not None:  # defaults that depend on the data follow it (complete configs stay)
        _follow_data(cfg, updates)
    # where an interpolation that does not resolve was written (interpolations resolve here)
    files = [str(p) for p in config_paths(path, base)] or [str(base or "config")]
    source = ("command-line override" if any("${" in item for item in overrides)
              else " + ".join(files))
    return _validated(cfg, source)


def config_from_dict(data: Mapping[str, Any], source: str = "config") -> Config:
    """Build a validated :class:`Config` from a plain (possibly partial) mapping."""
    return _structured(dict(upgrade_legacy_keys(data, source)), source)


def config_for_run(cfg: Config, run: str) -> Config:
    """The config of variant ``run``: ``runs[run]`` merged over the other sections.

    The result has ``runs`` emptied: it is what one run directory trains and evaluates.
    """
    if run not in cfg.runs:
        known = ", ".join(sorted(cfg.runs)) or "(none)"
        raise ConfigError(f"unknown run '{run}' (config key runs.{run}); known runs: {known}")
    base = {**to_dict(cfg), "runs": {}}
    variant = cfg.runs[run] or {}
    if not isinstance(variant, Mapping):
        raise ConfigError(f"runs.{run} is {variant!r}; a variant is a mapping of sections, "
                          "e.g. {model: {loops: 4}}")
    try:
        merged = apply_data_defaults(merge_config_dicts(base, variant), set_keys(variant))
        return _structured(merged, f"runs.{run}")
    except ConfigError as exc:  # a cross-field rule broken by the variant: name it
        text = str(exc)
        raise ConfigError(text if text.startswith(f"runs.{run}") else f"runs.{run}: {text}") \
            from None

