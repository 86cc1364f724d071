"""Settings structs are the one description of every option: flags, help, checks and samples come from them.

A command lists the tables it reads as `Section`s (TOML table, settings struct, the few flag renames and
environment variables). From a struct's fields and their docstrings this module makes

* the argparse group: `--name-with-dashes` per field, `type` from the annotation, `choices` from `Literal`,
  bool as `--flag/--no-flag`, lists comma-separated, help = the field's docstring and its default;
* the settings themselves (`read_section`): flag > environment > `[table]` of `--config` > the command's
  default > the struct's default. Every mistake stops the command with one line naming the key, where the
  value came from, and what is allowed (`hpcbus.toml: [influx] processes = 'ful' is not one of 'aggregate',
  'full'`);
* a commented TOML table (`render_toml`) and a Markdown table (`render_markdown`) for deploy/ and the READMEs
  (`hpcbus.commands.dev.samples` writes them; a test fails when a committed copy drifts).

Field docstrings are not kept by Python at run time: they are read once from the source with `ast`.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
import inspect
import itertools
import json
import os
import re
import textwrap
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec
import msgspec.inspect as mi

S = TypeVar("S", bound=msgspec.Struct)


class SettingsError(ValueError):
    """A configuration mistake, named by its option; reported once at start-up (exit 2)."""


@dataclass(frozen=True)
class Section(Generic[S]):
    """One table a command reads: `[table]` of the config file, decoded into `struct`. Generic over the
    struct, so `read_section(args, SECTION)` has the struct's type without an annotation."""

    table: str | None
    """TOML table name; None: flags only (no table, not in the samples)."""
    struct: type[S]
    title: str = ""
    """Title of the argparse group (default: the table name)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """field -> environment variable."""
    flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """field -> its flags, where they are not `--name-with-dashes` (renames kept from earlier versions, or to
    avoid a clash with another table's flag); an empty tuple: no flag."""
    metavars: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """This command's defaults where they differ from the struct's (e.g. the durable name of a consumer)."""
    notes: Mapping[str, str] = field(default_factory=dict)
    """field -> what this command adds to the field's docstring."""
    hints: Mapping[str, str] = field(default_factory=dict)
    """field -> what to add when its value is not one of its choices (a key whose meaning changed: where the
    old value belongs now)."""
    files: tuple[str, ...] = ()
    """Fields that name a file the command will read (a seed, a certificate, an accounting file): checked
    at start-up and by `--check-config` (`check_files`), so a missing one is one line and exit 2, not a
    traceback and a restart loop."""

    @property
    def name(self) -> str:
        return self.title or self.table or self.struct.__name__


# --- the struct: fields, types, docstrings -------------------------------------------------------------------


@functools.cache
def field_docs(struct: type) -> dict[str, str]:
    """field -> its docstring (the string literal after the field), whitespace collapsed; fields a struct
    inherits from a settings struct it extends (`hpcbus.settings.HostnameSettings`) have their base's."""
    docs: dict[str, str] = {}
    for base in reversed(struct.__mro__[1:]):
        if isinstance(base, type) and issubclass(base, msgspec.Struct) and base is not msgspec.Struct:
            docs.update(field_docs(base))
    docs.update(_described(struct))
    return {**docs, **_own_field_docs(struct)}


def _described(struct: type) -> dict[str, str]:
    """field -> the description its type carries (a key declared once in `hpcbus.keys`)."""
    out: dict[str, str] = {}
    for name, hint in typing.get_type_hints(struct, include_extras=True).items():
        if typing.get_origin(hint) is typing.Annotated:
            for meta in typing.get_args(hint)[1:]:
                if isinstance(meta, msgspec.Meta) and meta.description:
                    out[name] = " ".join(meta.description.split())
    return out


def _own_field_docs(struct: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(struct)))
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef)
    docs: dict[str, str] = {}
    body = cls.body
    for stmt, after in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


@functools.cache
def _hints(struct: type) -> dict[str, Any]:
    return typing.get_type_hints(struct)


def fields(struct: type[msgspec.Struct]) -> tuple[mi.Field, ...]:
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    return info.fields


def default_of(f: mi.Field) -> Any:
    if f.default is not msgspec.NODEFAULT:
        return f.default
    if f.default_factory is not msgspec.NODEFAULT:
        return f.default_factory()
    return msgspec.NODEFAULT


def _strip(t: mi.Type) -> mi.Type:
    """`X | None` -> X; a type with a description (`hpcbus.keys`) -> the type."""
    if isinstance(t, mi.Metadata):
        t = t.type
    if isinstance(t, mi.UnionType):
        rest = [u for u in t.types if not isinstance(u, mi.NoneType)]
        if len(rest) == 1:
            return rest[0]
    return t


def literal_values(struct: type, name: str) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal[...]` field (or list of them), in declaration order."""
    hint = _hints(struct).get(name)
    while hint is not None:
        origin = typing.get_origin(hint)
        if origin is typing.Literal:
            return typing.get_args(hint)
        if origin in (list, tuple, typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = args[0] if args else None
            continue
        if origin is typing.Annotated:
            hint = typing.get_args(hint)[0]
            continue
        return None
    return None


def _choices(values: Iterable[Any]) -> str:
    return ", ".join(repr(v) for v in values)


# --- flags ---------------------------------------------------------------------------------------------------


def flags_of(section: Section, name: str) -> tuple[str, ...]:
    if name in section.flags:
        return section.flags[name]
    return ("--" + name.replace("_", "-"),)


def dest_of(section: Section, name: str) -> str | None:
    """The argparse attribute of a field's flag (its first long flag), None without a flag."""
    long = [f for f in flags_of(section, name) if f.startswith("--")]
    return long[0][2:].replace("-", "_") if long else None


def _comma_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def toml_value(value: Any) -> str:
    """A default as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def doc_of(section: Section, name: str) -> str:
    struct: type[msgspec.Struct] = section.struct
    doc = field_docs(struct).get(name, "")
    note = section.notes.get(name, "")
    return f"{doc} {note}".strip()


def _help(section: Section, f: mi.Field) -> str:
    doc = doc_of(section, f.name)
    default = section.defaults.get(f.name, default_of(f))
    parts = [doc]
    if default is not msgspec.NODEFAULT:
        parts.append(f"(default {toml_value(default)}")
        if f.name in section.env:
            parts[-1] += f"; ${section.env[f.name]}"
        parts[-1] += ")"
    return " ".join(p for p in parts if p).replace("%", "%%")


def _metavar(name: str, t: mi.Type, doc: str) -> str:
    if isinstance(t, mi.IntType):
        return "N"
    if isinstance(t, mi.FloatType):
        return "S" if "second" in doc.lower() else "X"
    return name.upper() if len(name) <= 8 else "TEXT"


def add_section_arguments(parser: argparse.ArgumentParser, section: Section) -> Any:
    """The argparse group of a section: one flag per field (nested tables have none)."""
    group = parser.add_argument_group(section.name)
    for f in fields(section.struct):
        names = flags_of(section, f.name)
        dest = dest_of(section, f.name)
        t = _strip(f.type)
        if not names or dest is None or isinstance(t, mi.StructType):
            continue
        kw: dict[str, Any] = {"dest": dest, "default": None, "help": _help(section, f)}
        choices = literal_values(section.struct, f.name)
        if isinstance(t, mi.BoolType):
            kw["action"] = argparse.BooleanOptionalAction
        elif isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
            kw["type"] = _comma_list
            kw["metavar"] = section.metavars.get(f.name, "A,B")
        elif choices is not None:
            kw["choices"] = choices
            kw["type"] = type(choices[0])
        else:
            kw["type"] = {mi.IntType: int, mi.FloatType: float}.get(type(t), str)
            kw["metavar"] = section.metavars.get(f.name) or _metavar(f.name, t, kw["help"])
        group.add_argument(*names, **kw)
    return group


# --- reading -------------------------------------------------------------------------------------------------


def load_config(path: str | None) -> dict[str, Any]:
    """The whole `--config` file ({} without one)."""
    if not path:
        return {}
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"--config {path}: {exc}") from None


def load_table(path: str | None, table: str) -> dict[str, Any]:
    """The `[table]` of the `--config` file ({} without a file or table)."""
    found = load_config(path).get(table, {})
    if not isinstance(found, dict):
        raise SettingsError(f"{path}: {table} must be a table ([{table}])")
    return found


def check_tables(path: str | None, command: str, own: Sequence[str], known: Iterable[str]) -> None:
    """A table no hpcbus command reads (a typo) stops the command. Tables other commands read are allowed:
    one file serves every service of a host (deploy/hpcbus.toml)."""
    data = load_config(path)
    known = set(known) | set(own)
    for key, value in data.items():
        if not isinstance(value, dict):
            raise SettingsError(f"{path}: `{key}` is outside any table; {command} reads {_tables(own)}")
        if key not in known:
            others = sorted(known - set(own))
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            raise SettingsError(
                f"{path}: unknown table [{key}]"
                + (f" (did you mean [{hint[0]}]?)" if hint else "")
                + f"; {command} reads {_tables(own)}"
                + (f" (other commands: {_tables(others)})" if others else "")
            )


def check_places(path: str | None, sections: Sequence[Section]) -> None:
    """A key put in the wrong one of a command's tables (`interval` in `[node]`, where `[node_agent]` has it)
    stops the command with the table it belongs in, before `read_section` would only call it unknown."""
    data = load_config(path)
    for section in sections:
        values = data.get(section.table or "")
        if not section.table or not isinstance(values, dict):
            continue
        own = {f.name for f in fields(section.struct)}
        for key in values:
            homes = [
                s.table
                for s in sections
                if s.table and s is not section and key in {f.name for f in fields(s.struct)}
            ]
            if key not in own and homes:
                raise SettingsError(
                    f"{path}: [{section.table}] {key}: `{key}` belongs in {_tables(homes)}, not [{section.table}]"
                )


def check_files(section: Section[Any], settings: msgspec.Struct) -> None:
    """Each file `section.files` names (when set) exists and can be read: else `SettingsError` naming the
    option, the path and why."""
    for name in section.files:
        value = getattr(settings, name, "")
        if not value:
            continue
        path = Path(str(value)).expanduser()
        flag = (flags_of(section, name) or (name,))[0]
        why = ""
        if not path.exists():
            why = "no such file"
        elif not path.is_file():
            why = "not a file"
        elif not os.access(path, os.R_OK):
            why = "cannot be read (permission denied)"
        if why:
            raise SettingsError(f"{flag} {value}: {why}")


def check_every_table(path: str | None, sections: Iterable[Section[Any]]) -> None:
    """Every table of the config file read as each command that reads it would (`--check-config`): a typo in
    a table this command does not read is found now, not when the other service starts."""
    data = load_config(path)
    for section in sections:
        values = data.get(section.table or "")
        if not section.table or not isinstance(values, dict):
            continue
        origin = _Origin(section)
        origin.where = dict.fromkeys(values, str(path))
        _check(section.struct, dict(values), origin, section.table)  # the words `read_section` would say
        try:
            msgspec.convert(values, section.struct)
        except msgspec.ValidationError as exc:
            raise SettingsError(f"{path}: [{section.table}]: {exc}") from None


def _tables(tables: Iterable[str]) -> str:
    return ", ".join(f"[{t}]" for t in tables)


class _Origin:
    """Where each value came from, to name it in an error."""

    def __init__(self, section: Section) -> None:
        self.section = section
        self.where: dict[str, str] = {}

    def key(self, name: str, table: str | None = None) -> str:
        table = table if table is not None else self.section.table
        return f"[{table}] {name}" if table else name

    def prefix(self, name: str) -> str:
        where = self.where.get(name, "")
        return f"{where}: " if where else ""


def _from_string(t: mi.Type, text: str) -> Any:
    """An environment variable's text as the field's type."""
    t = _strip(t)
    if isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        return _comma_list(text)
    if isinstance(t, mi.BoolType):
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected true or false")
    if isinstance(t, mi.IntType):
        return int(text)
    if isinstance(t, mi.FloatType):
        return float(text)
    return text


def _check(
    struct: type, values: dict[str, Any], origin: _Origin, table: str | None, nested_in: str = ""
) -> None:
    """Unknown keys, values outside a Literal, lists given as "a, b" strings; nested tables recursively
    (`nested_in`: the parent's field, whose source names theirs)."""
    known = {f.name: f for f in fields(struct)}
    for name in list(values):
        value = values[name]
        f = known.get(name)
        prefix = origin.prefix(nested_in or name)
        if f is None:
            hint = difflib.get_close_matches(name, list(known), n=1)
            raise SettingsError(
                f"{prefix}{'[' + table + '] ' if table else ''}unknown field `{name}`"
                + (f" (did you mean `{hint[0]}`?)" if hint else f"; known: {', '.join(known)}")
            )
        t = _strip(f.type)
        if isinstance(t, mi.ListType) and isinstance(value, str):
            values[name] = value = _comma_list(value)
        if isinstance(t, mi.StructType) and isinstance(value, dict):
            _check(t.cls, value, origin, f"{table}.{name}" if table else name, nested_in or name)
            continue
        allowed = literal_values(struct, name)
        if allowed is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            if item not in allowed or type(item) is not type(allowed[0]):
                shown = f" = {value!r}" if item is value else f": {item!r}"
                said = origin.section.hints.get(name, "") if table == origin.section.table else ""
                raise SettingsError(
                    f"{prefix}{origin.key(name, table)}{shown} is not one of {_choices(allowed)}"
                    + (f" ({said})" if said else "")
                )


_AT = re.compile(r"^(.*) - at `\$\.([^`]*)`$")


def _lookup(values: Mapping[str, Any], path: str) -> Any:
    node: Any = values
    for part in re.findall(r"[^.\[\]]+", path):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return msgspec.NODEFAULT
    return node


def read_section(
    args: argparse.Namespace, section: Section[S], environ: Mapping[str, str] | None = None
) -> S:
    """The settings of one section: flag > environment > `[table]` of `--config` > command default >
    struct default. Unknown keys, values outside a `Literal`, wrong types and broken constraints raise
    SettingsError naming the key, its source and what is allowed."""
    origin = _Origin(section)
    values: dict[str, Any] = {}
    for name, value in section.defaults.items():
        values[name] = value
    path = getattr(args, "config", None)
    if section.table and path:
        for name, value in load_table(path, section.table).items():
            values[name] = value
            origin.where[name] = str(path)
    env = os.environ if environ is None else environ
    types = {f.name: f.type for f in fields(section.struct)}
    for name, var in section.env.items():
        text = env.get(var)
        if text:
            origin.where[name] = var
            try:
                values[name] = _from_string(types[name], text)
            except ValueError as exc:
                raise SettingsError(f"{var}: {origin.key(name)} = {text!r}: {exc}") from None
    for name in types:
        dest = dest_of(section, name)
        value = getattr(args, dest, None) if dest else None
        if value is not None:
            values[name] = value
            origin.where[name] = flags_of(section, name)[0]
    _check(section.struct, values, origin, section.table, "")
    try:
        return msgspec.convert(values, section.struct)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = _AT.match(text)
        if not m:
            raise SettingsError(f"{_sources(origin)}{origin.key('')}".rstrip() + f": {text}") from None
        problem, at = m.group(1), m.group(2)
        top = re.split(r"[.\[]", at, maxsplit=1)[0]
        value = _lookup(values, at)
        shown = "" if value is msgspec.NODEFAULT else f" = {value!r}"
        key = (
            origin.key(at)
            if "." not in at
            else origin.key(at.rsplit(".", 1)[1], f"{section.table}.{at.rsplit('.', 1)[0]}")
        )
        raise SettingsError(f"{origin.prefix(top)}{key}{shown}: {problem[0].lower()}{problem[1:]}") from None


def _sources(origin: _Origin) -> str:
    where = sorted(set(origin.where.values()))
    return f"{', '.join(where)}: " if where else ""


# --- samples -------------------------------------------------------------------------------------------------


def _comment(text: str, width: int = 110) -> list[str]:
    return textwrap.wrap(text, width - 2, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)


def shown_flags(section: Section, name: str) -> list[str]:
    """A field's flags as the help shows them (`--x`, and `--no-x` for a bool)."""
    names = list(flags_of(section, name))
    t = _strip(next(f.type for f in fields(section.struct) if f.name == name))
    if isinstance(t, mi.BoolType):
        names += ["--no-" + n[2:] for n in names if n.startswith("--")]
    return names


def _field_note(section: Section, name: str) -> str:
    notes = []
    names = shown_flags(section, name)
    if names and section.table is not None:
        notes.append(", ".join(names))
    if name in section.env:
        notes.append(f"${section.env[name]}")
    return f" ({'; '.join(notes)})" if notes else ""


def render_toml(
    section: Section,
    values: Mapping[str, Any] | None = None,
    *,
    commented: bool = False,
    docs: bool = True,
    heading: str = "",
    table: str | None = None,
    struct: type[msgspec.Struct] | None = None,
) -> str:
    """`[table]` with every key, its docstring as a comment and its default. `values` are example values
    written instead of the default; with `commented`, keys without an example value are commented out."""
    table = table or section.table
    own: type[msgspec.Struct] = section.struct
    struct = struct or own
    values = values or {}
    top = struct is section.struct
    lines = [f"[{table}]" + (f"  # {heading}" if heading else "")]
    nested: list[str] = []
    for f in fields(struct):
        t = _strip(f.type)
        if isinstance(t, mi.StructType):
            sub = values.get(f.name, {})
            nested.append(
                render_toml(
                    section, sub, commented=commented, docs=docs, table=f"{table}.{f.name}", struct=t.cls
                )
            )
            continue
        doc = doc_of(section, f.name) if top else field_docs(struct).get(f.name, "")
        if docs:
            lines.extend(_comment(doc + (_field_note(section, f.name) if top else "")))
        if f.name in values:
            lines.append(f"{f.name} = {toml_value(values[f.name])}")
        else:
            default = section.defaults.get(f.name, default_of(f)) if top else default_of(f)
            lines.append(f"{'# ' if commented else ''}{f.name} = {toml_value(default)}")
    return "\n".join([*lines, *("\n" + n.rstrip("\n") for n in nested)]) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(section: Section, table: str | None = None, struct: type | None = None) -> str:
    """A Markdown table of a section's keys: key, default, flag, environment, meaning."""
    table = table or section.table
    struct = struct or section.struct
    top = struct is section.struct
    rows = ["| key | default | flag | env | |", "| --- | --- | --- | --- | --- |"]
    nested: list[str] = []
    for f in fields(struct):
        t = _strip(f.type)
        if isinstance(t, mi.StructType):
            nested.append(render_markdown(section, f"{table}.{f.name}", t.cls))
            continue
        default = section.defaults.get(f.name, default_of(f)) if top else default_of(f)
        flag = ", ".join(f"`{n}`" for n in shown_flags(section, f.name)) if top else ""
        env = f"`{section.env[f.name]}`" if top and f.name in section.env else ""
        doc = doc_of(section, f.name) if top else field_docs(struct).get(f.name, "")
        rows.append(f"| `{f.name}` | `{_md(toml_value(default))}` | {flag} | {env} | {_md(doc)} |")
    head = f"`[{table}]`\n\n" if table else ""
    return head + "\n".join(rows) + "\n" + "".join("\n" + n for n in nested)
