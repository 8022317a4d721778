"""Load a rack manifest: YAML with positions -> pydantic schema -> cross-field rules.

Each stage collects every problem it finds; a stage runs only on what the previous one accepted,
so a syntax error is never followed by a flood of schema errors about the same lines. Every
problem names `file:line:column`, the field path, and what was expected.
"""

from __future__ import annotations

import difflib
import types
import typing
import weakref
from pathlib import Path
from typing import Any

from belugactl.errors import Location, ManifestError, ManifestProblem
from belugactl.model.manifest_schema import Manifest
from belugactl.model.manifest_yaml import Path_, Position, PositionedDocument, YamlSyntaxError, load_positioned

__all__ = ["Manifest", "load_manifest", "load_manifest_text", "format_path", "manifest_source"]

_MAX_BYTES = 4 << 20  # a manifest is a few KiB; refuse to parse something that is clearly not one

# The file each loaded manifest came from, so that a fix deep in pool/ or serve/ can name it
# (`-f /etc/belugactl/rack.yaml`, not a placeholder). Kept beside the frozen schema model rather
# than in it: a manifest is the same data wherever it was read from. Entries leave with their manifest.
_SOURCES: dict[int, Path] = {}


def manifest_source(manifest: Manifest) -> Path | None:
    """The file `load_manifest` read this manifest from; None for one built from text or by hand."""
    return _SOURCES.get(id(manifest))


def _remember_source(manifest: Manifest, path: Path) -> Manifest:
    key = id(manifest)
    _SOURCES[key] = path
    weakref.finalize(manifest, _SOURCES.pop, key, None)
    return manifest


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest file; raise ManifestError listing every problem found."""
    path = Path(path)
    raw = _read_bounded(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(
            [ManifestProblem(Location(str(path)), "", f"not UTF-8 text (byte {exc.start})")], file=str(path)
        ) from None
    return _remember_source(load_manifest_text(text, file=str(path)), path)


def _read_bounded(path: Path) -> bytes:
    """At most _MAX_BYTES + 1 bytes: `-f /dev/zero` or a FIFO must not be read until memory runs out."""

    def file_problem(what: str, message: str, fix: str) -> ManifestError:
        problem = ManifestProblem(Location(str(path)), "", message, None)
        return ManifestError([problem], file=str(path), what=what, fix=fix)

    from belugactl.model.deadline_read import TIMEOUT_ENV, InputTimeout, read_bounded

    try:
        raw = read_bounded(path, _MAX_BYTES + 1)
    except InputTimeout as exc:
        raise file_problem(
            f"{path}: no complete manifest arrived within {exc.waited_s:g} s ({exc.kind}, {exc.got} bytes read)",
            f"waited {exc.waited_s:g} s for the end of {exc.kind}",
            f"pass a regular file with -f, or close the writer's end (set {TIMEOUT_ENV}=SECONDS to wait longer)",
        ) from None
    except FileNotFoundError:
        raise file_problem(
            f"{path}: the manifest file does not exist",
            "file not found",
            "pass an existing manifest with -f (examples/ has a single host, a rack and the CPU demo)",
        ) from None
    except IsADirectoryError:
        raise file_problem(
            f"{path}: is a directory, not a manifest", "is a directory", "pass the YAML file with -f"
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise file_problem(
            f"{path}: cannot read the manifest file ({reason})",
            f"cannot read the file: {reason}",
            "check the path and its permissions",
        ) from None
    if len(raw) > _MAX_BYTES:
        raise file_problem(
            f"{path}: too large for a manifest (more than {_MAX_BYTES >> 20} MiB)",
            f"more than {_MAX_BYTES} bytes; a manifest is a few KiB",
            "pass the rack manifest (YAML) with -f, not a device or a data file",
        )
    return raw


def load_manifest_text(text: str, *, file: str = "<manifest>") -> Manifest:
    from pydantic import ValidationError

    from belugactl.model.manifest_rules import check_rules

    def problem(position: Any, path: Path_, message: str, hint: str | None = None) -> ManifestProblem:
        line, column = (position.line, position.column) if position is not None else (None, None)
        return ManifestProblem(Location(file, line, column), format_path(path), message, hint)

    try:
        doc = load_positioned(text)
    except YamlSyntaxError as exc:
        raise ManifestError([problem(p.position, p.path, p.message, p.hint) for p in exc.problems], file=file) from None

    if doc.data is None:
        raise ManifestError(
            [problem(Position(1, 1), (), "the manifest is empty", "start from examples/single-host.yaml")], file=file
        )
    if not isinstance(doc.data, dict):
        kind = "a list" if isinstance(doc.data, list) else f"a {type(doc.data).__name__} value"
        raise ManifestError(
            [problem(doc.position_of(()), (), f"expected a mapping of keys (version, pool, hosts, ...), got {kind}")],
            file=file,
        )

    try:
        manifest = Manifest.model_validate(doc.data)
    except ValidationError as exc:
        problems = [_schema_problem(err, doc, problem) for err in exc.errors(include_url=False)]
        raise ManifestError(_dedupe(problems), file=file) from None

    rule_problems = check_rules(manifest)
    if rule_problems:
        problems = [
            problem(doc.position_of(rp.path, prefer_key=rp.at_key), rp.path, rp.message, rp.hint)
            for rp in rule_problems
        ]
        raise ManifestError(_dedupe(problems), file=file)
    return manifest


def format_path(path: Path_) -> str:
    """('hosts', 3, 'name') -> 'hosts[3].name'."""
    text = ""
    for element in path:
        if isinstance(element, int):
            text += f"[{element}]"
        else:
            text += f".{element}" if text else str(element)
    return text


# ---- pydantic error -> ManifestProblem ------------------------------------------------------


def _schema_problem(err: dict[str, Any], doc: PositionedDocument, problem: Any) -> ManifestProblem:
    kind = err["type"]
    path = _data_path(err["loc"], doc.data, keep_last=kind in ("missing", "extra_forbidden"))
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        key = path[-1]
        allowed = _allowed_keys(path[:-1], doc.data)
        hint = None
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        if close:
            hint = f"did you mean {close[0]!r}?"
        elif allowed:
            hint = "allowed here: " + ", ".join(allowed)
        return problem(doc.position_of(path, prefer_key=True), path, f"unknown key {key!r}", hint)
    if kind == "missing":
        key = path[-1]
        return problem(doc.position_of(path[:-1]), path, f"missing required key {key!r}")
    if kind in _PLAIN_TYPE_NAMES:
        message = f"expected {_PLAIN_TYPE_NAMES[kind]}, got {_show(err.get('input'))}"
    elif kind.startswith("literal_error") or kind.endswith(("_type", "_parsing")):
        message = f"{message}, got {_show(err.get('input'))}"
    if kind == "union_tag_invalid":
        ctx = err.get("ctx") or {}
        tag, expected = str(ctx.get("tag")), str(ctx.get("expected_tags", ""))
        choices = [t.strip().strip("'") for t in expected.split(",") if t.strip()]
        close = difflib.get_close_matches(tag, choices, n=1, cutoff=0.6)
        path = path + (str(ctx.get("discriminator", "kind")).strip("'"),)
        return problem(
            doc.position_of(path),
            path,
            f"unknown kind {tag!r}; expected one of {', '.join(map(repr, choices))}",
            f"did you mean {close[0]!r}?" if close else None,
        )
    if kind == "union_tag_not_found":
        return problem(doc.position_of(path), path + ("kind",), "missing required key 'kind'")
    return problem(doc.position_of(path), path, message)


# pydantic's wording names Python classes ("a valid dictionary or instance of Pool"); say it in YAML terms
_PLAIN_TYPE_NAMES = {
    "model_type": "a mapping of keys",
    "model_attributes_type": "a mapping of keys",
    "dict_type": "a mapping",
    "list_type": "a list",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _data_path(loc: tuple[Any, ...], data: Any, *, keep_last: bool) -> Path_:
    """Map a pydantic error location onto the document, dropping union tags and validator markers."""
    path: list[str | int] = []
    current = data
    for index, element in enumerate(loc):
        last = index == len(loc) - 1
        if _has(current, element):
            path.append(element)
            current = current[element]
        elif last and keep_last:
            path.append(element)
        # anything else is a discriminator tag ('cxl-region'), '[key]', or a function marker
    return tuple(path)


def _has(container: Any, element: Any) -> bool:
    if isinstance(container, dict):
        return element in container
    return isinstance(container, list) and isinstance(element, int) and 0 <= element < len(container)


def _dedupe(problems: list[ManifestProblem]) -> list[ManifestProblem]:
    seen: set[str] = set()
    result = []
    for p in problems:
        if str(p) not in seen:
            seen.add(str(p))
            result.append(p)
    result.sort(key=lambda p: (p.location.line or 0, p.location.column or 0))
    return result


def _allowed_keys(path: Path_, data: Any) -> list[str]:
    """The field names of the model that sits at `path` in the document."""
    from pydantic import BaseModel

    annotation: Any = Manifest
    current = data
    for element in path:
        annotation = _pick(annotation, current)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(element))
            if field is None:
                return []
            annotation = field.annotation
        else:
            args = typing.get_args(annotation)
            annotation = args[-1] if args else Any
        current = current[element] if isinstance(current, dict | list) else None
    annotation = _pick(annotation, current)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _unannotated(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _pick(annotation: Any, value: Any) -> Any:
    """Unwrap Annotated/Optional; for a union of models choose the one whose `kind` matches."""
    from pydantic import BaseModel

    annotation = _unannotated(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [_unannotated(a) for a in typing.get_args(annotation)]  # tagged members are Annotated
        models = [a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1:
            return models[0]
        if isinstance(value, dict):
            for model in models:
                kind = model.model_fields.get("kind")
                if kind is not None and value.get("kind") in typing.get_args(kind.annotation):
                    return model
        others = [a for a in members if a is not type(None)]
        return others[0] if others else annotation
    return annotation
