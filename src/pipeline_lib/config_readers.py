"""Which modules read each config key: the table in docs/configuration.md, generated.

A static reading of the source, torch-free (nothing is imported but the config): every
Python module under ``src/pipeline_lib`` and ``workflow/scripts``, and the Snakefile and
``workflow/rules/*.smk`` as text. A module reads ``section.key`` when it loads the attribute
``key`` from an expression known to be that section's dataclass:

- an attribute chain through the sections (``cfg.train.lr``, ``cfg.data.tokenizer.type``,
  ``x.model.loops``: the section attributes name their class, whatever is before them);
- a parameter annotated with a config class (``train: TrainConfig``) or, unannotated, named
  after a section (``eval_cfg``, ``bench``); a name assigned from such an
  expression (``t = cfg.train``), looped over ``data.sources``, or returned by a function
  annotated ``-> Config``/``-> ModelConfig`` …; ``self.x`` assigned one of those in a class;
- ``getattr(section, "key")`` and any call with a section and a string constant naming one
  of its keys (``_get(src, "type")``), or a name looped over a literal tuple of them.

Assignments are writes, not reads. A call that takes a section whole (``to_dict``,
``dataclasses.asdict``, the signatures, ``config_yaml`` …) is listed once per section, not
per key. The reading over-reports (an attribute named like a section on an object that is
not one counts) and can miss a read through a name it cannot type (an ``Any`` parameter
named otherwise, the result of an unannotated function): a key without a reader is a
candidate for removal, to be confirmed by hand (grep, the rules, the signatures).
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from collections.abc import Iterator
from pathlib import Path

from .spec.config import Config
from .spec.config_load import PROJECT_ROOT

# calls that take a section whole (serialise, hash, compare or copy every key)
WHOLE_SECTION_CALLS = frozenset({"to_dict", "public_dict", "asdict", "astuple", "config_yaml",
                                 "config_hash", "save_config", "flatten", "model_signature",
                                 "without_later_defaults", "redact_config", "fields"})
DOC_PATH = PROJECT_ROOT / "docs" / "configuration.md"
DOC_SECTION = "config-keys"  # its <!-- results:config-keys:begin/end --> markers


@dataclasses.dataclass(frozen=True)
class Section:
    """A config dataclass: its dotted key prefix, its leaf keys and its nested sections."""

    prefix: str  # "train", "train.spike", "data.sources[]"
    cls: type
    leaves: tuple[str, ...]
    nested: dict[str, tuple[str, bool]]  # attribute → (class name, a list of them)


def _sections(cls: type = Config, prefix: str = "") -> Iterator[Section]:
    hints = typing.get_type_hints(cls)
    leaves, nested, inner = [], {}, []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        sub = tp if dataclasses.is_dataclass(tp) else item if dataclasses.is_dataclass(item) \
            else None
        if sub is None:
            leaves.append(f.name)
            continue
        nested[f.name] = (sub.__name__, sub is item)
        inner.append((sub, f"{prefix}.{f.name}{'[]' if sub is item else ''}".lstrip(".")))
    yield Section(prefix, cls, tuple(leaves), nested)
    for sub, sub_prefix in inner:
        yield from _sections(sub, sub_prefix)


SECTIONS = {s.cls.__name__: s for s in _sections()}
# the attribute a section hangs on (train, spike, sources …) → (class name, a list of them)
SECTION_ATTRS = {attr: kind for s in SECTIONS.values() for attr, kind in s.nested.items()}


def config_keys() -> list[str]:
    """Every leaf key, dotted (``data.sources[].type``), in the dataclasses' order."""
    return [f"{s.prefix}.{leaf}".lstrip(".") for s in SECTIONS.values() for leaf in s.leaves]


# --------------------------------------------------------------------------- typing names

Types = frozenset[str]  # config class names; "[]Name": a list of them
NONE: Types = frozenset()
_CLASS_WORD = re.compile(r"\b(" + "|".join(sorted(SECTIONS, key=len, reverse=True)) + r")\b")


def _annotation_types(node: ast.expr | None) -> Types:
    """The config classes an annotation names (``list[SourceConfig]`` → a list of them)."""
    if node is None:
        return NONE
    text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) \
        else ast.unparse(node)
    return frozenset(("[]" if re.search(rf"(list|Sequence)\[{m}\]", text) else "") + m
                     for m in _CLASS_WORD.findall(text))


def _named(name: str) -> Types:
    """An unannotated parameter named after a section (``eval_cfg``, ``train``, ``bench``);
    not ``model`` or ``data``, which name the network and the pack as often."""
    base = re.sub(r"_(cfg|config)$", "", name)
    if base not in SECTION_ATTRS or name in ("model", "data", "sources"):
        return NONE
    cls, many = SECTION_ATTRS[base]
    return frozenset({("[]" if many else "") + cls})


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr \
        if isinstance(func, ast.Attribute) else ""


@dataclasses.dataclass
class Scope:
    """What a stretch of code knows: names (and ``self.x``) → config classes, names → the
    string constants a loop binds them to, and functions → the classes they return."""

    names: dict[str, Types]
    strings: dict[str, tuple[str, ...]]
    returns: dict[str, Types]
    attrs: dict[str, Types]  # attribute names bound to one config class anywhere (cfg …)

    def child(self) -> Scope:
        return Scope(dict(self.names), dict(self.strings), self.returns, self.attrs)

    def types(self, node: ast.expr) -> Types:
        """The config classes ``node`` evaluates to (empty: not a config, or unknown)."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id, NONE)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and f"self.{node.attr}" in self.names:
                return self.names[f"self.{node.attr}"]
            inner = frozenset(f"{'[]' if many else ''}{cls}" for t in self.types(node.value)
                              if (kind := SECTIONS[t].nested.get(node.attr)) is not None
                              for cls, many in [kind] if not t.startswith("[]"))
            if inner:
                return inner
            if node.attr in SECTION_ATTRS:
                cls, many = SECTION_ATTRS[node.attr]
                return frozenset({("[]" if many else "") + cls})
            return self.attrs.get(node.attr, NONE)
        if isinstance(node, ast.Subscript):
            return frozenset(t[2:] for t in self.types(node.value) if t.startswith("[]"))
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in ("replace", "deepcopy", "copy") and node.args:
                return self.types(node.args[0])
            return self.returns.get(name, NONE)
        if isinstance(node, ast.IfExp):
            return self.types(node.body) | self.types(node.orelse)
        if isinstance(node, ast.BoolOp):
            return frozenset().union(*(self.types(v) for v in node.values))
        return NONE


def _bind(target: ast.expr, types: Types, scope: Scope) -> None:
    if isinstance(target, ast.Name):
        scope.names[target.id] = types
    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
            and target.value.id == "self":
        scope.names[f"self.{target.attr}"] = types
    elif isinstance(target, ast.Tuple | ast.List):
        for elt in target.elts:
            _bind(elt, NONE, scope)


def _bind_loop(target: ast.expr, iterable: ast.expr, scope: Scope) -> None:
    """A loop variable: an element of a list of sections, or the strings of a literal."""
    if isinstance(iterable, ast.Tuple | ast.List | ast.Set) and isinstance(target, ast.Name) \
            and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                    for e in iterable.elts):
        scope.strings[target.id] = tuple(e.value for e in iterable.elts)  # type: ignore[attr-defined]
        return
    if isinstance(iterable, ast.Call) and _call_name(iterable) == "enumerate" \
            and iterable.args and isinstance(target, ast.Tuple) and len(target.elts) == 2:
        _bind(target.elts[0], NONE, scope)
        target, iterable = target.elts[1], iterable.args[0]
    _bind(target, frozenset(t[2:] for t in scope.types(iterable) if t.startswith("[]")), scope)


class Reads:
    """The readers found so far: key → modules, section prefix → modules taking it whole."""

    def __init__(self) -> None:
        self.keys: dict[str, set[str]] = {}
        self.whole: dict[str, set[str]] = {}

    def key(self, types: Types, leaf: str, module: str) -> None:
        for t in types:
            if not t.startswith("[]") and leaf in SECTIONS[t].leaves:
                prefix = SECTIONS[t].prefix
                self.keys.setdefault(f"{prefix}.{leaf}".lstrip("."), set()).add(module)

    def section(self, types: Types, module: str) -> None:
        for t in types:
            self.whole.setdefault(SECTIONS[t.removeprefix("[]")].prefix or "(all)",
                                  set()).add(module)


class _Walker:
    """One module's statements in order, each scope knowing what its names hold."""

    def __init__(self, module: str, reads: Reads):
        self.module, self.reads = module, reads

    def walk(self, node: ast.AST, scope: Scope) -> None:
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is not None:
            handler(node, scope)
        else:
            self.children(node, scope)

    def children(self, node: ast.AST, scope: Scope) -> None:
        for child in ast.iter_child_nodes(node):
            self.walk(child, scope)

    def _FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
                     scope: Scope) -> None:
        for expr in [*getattr(node, "decorator_list", []), *node.args.defaults,
                     *(d for d in node.args.kw_defaults if d is not None)]:
            self.walk(expr, scope)
        inner = scope.child()
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                inner.names[arg.arg] = _annotation_types(arg.annotation) or _named(arg.arg)
        for stmt in node.body if isinstance(node.body, list) else [node.body]:
            self.walk(stmt, inner)

    _AsyncFunctionDef = _Lambda = _FunctionDef

    def _ClassDef(self, node: ast.ClassDef, scope: Scope) -> None:
        inner = scope.child()
        for stmt in node.body:  # dataclass fields: self.x of the methods
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                inner.names[f"self.{stmt.target.id}"] = _annotation_types(stmt.annotation)
        for method in (s for s in node.body if isinstance(s, ast.FunctionDef)):
            params = {a.arg: _annotation_types(a.annotation) for a in method.args.args}
            for sub in ast.walk(method):
                if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Name):
                    for target in sub.targets:
                        if params.get(sub.value.id):
                            _bind(target, params[sub.value.id], inner)
        self.children(node, inner)

    def _Assign(self, node: ast.Assign | ast.AnnAssign, scope: Scope) -> None:
        if node.value is not None:
            self.walk(node.value, scope)
        types = scope.types(node.value) if node.value is not None else NONE
        if isinstance(node, ast.AnnAssign):
            types = _annotation_types(node.annotation) or types
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            if isinstance(target, ast.Attribute):
                self.walk(target.value, scope)  # the base of a write is read
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    and len(target.elts) == len(node.value.elts):  # t, n = cfg.train, 4
                for elt, value in zip(target.elts, node.value.elts, strict=True):
                    _bind(elt, scope.types(value), scope)
            else:
                _bind(target, types, scope)

    _AnnAssign = _Assign

    def _For(self, node: ast.For | ast.AsyncFor, scope: Scope) -> None:
        self.walk(node.iter, scope)
        _bind_loop(node.target, node.iter, scope)
        for stmt in [*node.body, *node.orelse]:
            self.walk(stmt, scope)

    _AsyncFor = _For

    def _ListComp(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp,
                  scope: Scope) -> None:
        inner = scope.child()
        for gen in node.generators:
            self.walk(gen.iter, inner)
            _bind_loop(gen.target, gen.iter, inner)
            for cond in gen.ifs:
                self.walk(cond, inner)
        for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
            self.walk(part, inner)

    _SetComp = _GeneratorExp = _DictComp = _ListComp

    def _Attribute(self, node: ast.Attribute, scope: Scope) -> None:
        if isinstance(node.ctx, ast.Load):
            self.reads.key(scope.types(node.value), node.attr, self.module)
        self.walk(node.value, scope)

    def _Call(self, node: ast.Call, scope: Scope) -> None:
        if _call_name(node) in WHOLE_SECTION_CALLS:
            for arg in node.args:
                self.reads.section(scope.types(arg), self.module)
        elif len(node.args) >= 2:  # getattr(section, "key"), _get(src, "type") …
            leaf = node.args[1]
            names = (leaf.value,) if isinstance(leaf, ast.Constant) \
                and isinstance(leaf.value, str) else scope.strings.get(leaf.id, ()) \
                if isinstance(leaf, ast.Name) else ()
            for name in names:
                self.reads.key(scope.types(node.args[0]), name, self.module)
        self.children(node, scope)


# --------------------------------------------------------------------------- the readers

def _python_files(root: Path) -> dict[str, ast.Module]:
    """``{module label: parsed source}``: the library (``train.optim``) and the rule scripts
    (``workflow/scripts/train_segment.py``)."""
    lib = root / "src" / "pipeline_lib"
    files = {".".join(p.relative_to(lib).with_suffix("").parts): p
             for p in sorted(lib.rglob("*.py"))}
    files = {k.removesuffix(".__init__"): p for k, p in files.items()}
    files.update({str(p.relative_to(root)): p
                  for p in sorted((root / "workflow" / "scripts").glob("*.py"))})
    return {label: ast.parse(p.read_text(), str(p)) for label, p in files.items()}


def _global_types(trees: dict[str, ast.Module]) -> tuple[dict[str, Types], dict[str, Types]]:
    """Functions → the config classes they return; attribute names → the classes bound to
    them in a class body (``cfg: ModelConfig``, ``self.cfg = cfg`` of an annotated ``cfg``)."""
    returns: dict[str, Types] = {}
    attrs: dict[str, Types] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and (types := _annotation_types(node.returns)):
                returns[node.name] = returns.get(node.name, NONE) | types
            elif isinstance(node, ast.ClassDef):
                scope = Scope({}, {}, {}, {})
                _Walker("", Reads())._ClassDef(node, scope)
                for name, types in scope.names.items():
                    if name.startswith("self.") and types:
                        attrs[name[5:]] = attrs.get(name[5:], NONE) | types
    return returns, attrs


def _text_reads(root: Path, reads: Reads) -> None:
    """The Snakefile and the rules: ``.section.key`` and ``config["section"]["key"]``."""
    for path in [root / "Snakefile", *sorted((root / "workflow" / "rules").glob("*.smk"))]:
        text, label = path.read_text(), str(path.relative_to(root))
        pairs = re.findall(r"\.(?=(\w+)\.(\w+)\b)", text)  # overlapping: a.config.eval.x
        pairs += re.findall(r"config\[\"(\w+)\"\]\[\"(\w+)\"\]", text)
        for section, leaf in pairs:
            if section in SECTION_ATTRS:
                cls, many = SECTION_ATTRS[section]
                if not many:
                    reads.key(frozenset({cls}), leaf, label)


def find_readers(root: Path = PROJECT_ROOT) -> Reads:
    """Every key's readers, and every section's whole readers, in the checkout at ``root``."""
    trees = _python_files(root)
    returns, attrs = _global_types(trees)
    reads = Reads()
    for label, tree in trees.items():
        _Walker(label, reads).walk(tree, Scope({}, {}, returns, attrs))
    _text_reads(root, reads)
    return reads


def _cell(modules: set[str]) -> str:
    return ", ".join(f"`{m}`" for m in sorted(modules - {"config_readers"})) or "—"


def keys_markdown(root: Path = PROJECT_ROOT) -> str:
    """The generated section of docs/configuration.md: every key and the modules that read
    it, then the sections that modules take whole."""
    reads = find_readers(root)
    keys = config_keys()
    lines = ["<!-- generated by `make schema` (python -m pipeline_lib schema --write) from the "
             "config dataclasses and a static reading of the source "
             "(src/pipeline_lib/config_readers.py): edits between the markers are overwritten "
             "-->", "",
             f"{len(keys)} keys. *read by*: the modules (`train.optim` is "
             "`src/pipeline_lib/train/optim.py`) and workflow files that read the key itself; "
             "`spec.rules` (`validate_config`) and `spec.fields` validate it.", "",
             "| key | read by |", "|---|---|"]
    lines += [f"| `{key}` | {_cell(reads.keys.get(key, set()))} |" for key in keys]
    lines += ["", "Sections taken whole (serialised, hashed or compared key by key: the train "
              "and data signatures, the resolved config written with every snapshot, the "
              "MLflow parameters), so every key in them is read there too:", "",
              "| section | taken whole by |", "|---|---|"]
    lines += [f"| `{section}` | {_cell(modules)} |"
              for section, modules in sorted(reads.whole.items())]
    return "\n".join(lines)
