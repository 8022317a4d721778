"""Read a YAML document into plain Python values while remembering where every value sits.

PyYAML's composer keeps a start mark on every node; `yaml.safe_load` throws them away. We compose
the node graph ourselves, build the values, and keep a table from field path (a tuple of keys and
list indexes) to the line and column of the key and of the value, so that a validation error found
later, deep in the schema, can still point at `file:line:column`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Position:
    """1-based line and column."""

    line: int
    column: int


@dataclass
class YamlProblem:
    position: Position | None
    path: Path_
    message: str
    hint: str | None = None


@dataclass
class PositionedDocument:
    data: Any
    # path -> where the value starts; key_positions: path -> where its mapping key starts
    value_positions: dict[Path_, Position] = field(default_factory=dict)
    key_positions: dict[Path_, Position] = field(default_factory=dict)

    def position_of(self, path: Path_, *, prefer_key: bool = False) -> Position | None:
        """The deepest known position along `path` (the path may run past what the file holds)."""
        for cut in range(len(path), -1, -1):
            prefix = path[:cut]
            if prefer_key and cut == len(path) and prefix in self.key_positions:
                return self.key_positions[prefix]
            if prefix in self.value_positions:
                return self.value_positions[prefix]
        return None


class YamlSyntaxError(Exception):
    def __init__(self, problems: list[YamlProblem]) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


def _pos(mark: Any) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def load_positioned(text: str) -> PositionedDocument:
    """Parse one YAML document; raise YamlSyntaxError with positions for anything unparseable."""
    import yaml

    _check_characters(text)
    # PyYAML's composer recurses once per nesting level (several frames each), so a few KiB of
    # `[[[[...` ends in RecursionError before any of our checks could run. Its parser is a state
    # machine, so walk the events first and refuse deep or huge documents before composing them.
    _check_shape(text)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        raise YamlSyntaxError([_syntax_problem(exc, text)]) from None
    except yaml.YAMLError as exc:  # unmarked errors are rare (encoding); report them without a position
        raise YamlSyntaxError([YamlProblem(None, (), f"not valid YAML: {exc}")]) from None
    finally:
        loader.dispose()
    doc = PositionedDocument(data=None)
    if node is None:
        return doc
    problems: list[YamlProblem] = []
    doc.data = _build(node, (), loader, doc, problems, depth=0)
    if problems:
        raise YamlSyntaxError(problems)
    return doc


def _syntax_problem(exc: Any, text: str) -> YamlProblem:
    mark = exc.problem_mark or exc.context_mark
    position = _pos(mark) if mark is not None else None
    problem = exc.problem or str(exc)
    hint = None
    if position is not None:
        line_text = text.splitlines()[position.line - 1] if position.line - 1 < len(text.splitlines()) else ""
        if "\t" in problem or "\t" in line_text[: position.column]:
            hint = "YAML indentation must use spaces, not tabs"
    context = f"{exc.context}: " if exc.context else ""
    return YamlProblem(position, (), f"YAML syntax error: {context}{problem}", hint)


_MAX_DEPTH = 64  # a manifest is shallow; this stops runaway nesting
_MAX_NODES = 20_000  # aliases can multiply a small file into a huge tree ("billion laughs")
_TOO_DEEP = "document too large or too deeply nested for a manifest"


def _position_at(text: str, index: int) -> Position:
    line = text.count("\n", 0, index) + 1
    return Position(line, index - (text.rfind("\n", 0, index) + 1) + 1)


def _check_characters(text: str) -> None:
    """Refuse characters YAML forbids (NUL, other control characters) with their line and column."""
    import yaml

    try:
        yaml.reader.Reader(text)
    except yaml.reader.ReaderError as exc:
        index = exc.position if isinstance(exc.position, int) else 0
        code = exc.character if isinstance(exc.character, int) else ord(text[index]) if index < len(text) else 0
        name = "a NUL character" if code == 0 else f"the control character U+{code:04X}"
        problem = YamlProblem(
            _position_at(text, index),
            (),
            f"{name} is not allowed in a manifest",
            "a manifest is plain UTF-8 text: remove it, or pass the right file",
        )
        raise YamlSyntaxError([problem]) from None


def _check_shape(text: str) -> None:
    """Walk the parser's events (no recursion) and refuse nesting deeper than _MAX_DEPTH."""
    import yaml

    loader = yaml.SafeLoader(text)
    depth = 0
    events = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            events += 1
            if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                depth += 1
                if depth > _MAX_DEPTH:
                    message = f"nested more than {_MAX_DEPTH} levels deep; a manifest is a few levels deep"
                    raise YamlSyntaxError([YamlProblem(_pos(event.start_mark), (), message)])
                if events > 4 * _MAX_NODES:
                    raise YamlSyntaxError([YamlProblem(_pos(event.start_mark), (), _TOO_DEEP)])
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                depth -= 1
            elif events > 4 * _MAX_NODES:
                raise YamlSyntaxError([YamlProblem(_pos(event.start_mark), (), _TOO_DEEP)])
    except yaml.MarkedYAMLError as exc:
        raise YamlSyntaxError([_syntax_problem(exc, text)]) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError([YamlProblem(None, (), f"not valid YAML: {exc}")]) from None
    finally:
        loader.dispose()


def _build(
    node: Any, path: Path_, loader: Any, doc: PositionedDocument, problems: list[YamlProblem], depth: int
) -> Any:
    import yaml

    doc.value_positions[path] = _pos(node.start_mark)
    if depth > _MAX_DEPTH or len(doc.value_positions) > _MAX_NODES:
        problem = YamlProblem(_pos(node.start_mark), (), _TOO_DEEP)
        raise YamlSyntaxError([problem])
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        first_seen: dict[Any, Position] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                problems.append(YamlProblem(_pos(key_node.start_mark), path, "a mapping key must be a plain scalar"))
                continue
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str | int) or isinstance(key, bool):
                key = str(key_node.value)
            key_pos = _pos(key_node.start_mark)
            if key in first_seen:
                earlier = first_seen[key]
                problems.append(
                    YamlProblem(
                        key_pos,
                        path + (key,),
                        f"duplicate key {key!r} (first defined at line {earlier.line}, column {earlier.column})",
                        "YAML keeps only the last value; remove one of them",
                    )
                )
                continue
            first_seen[key] = key_pos
            doc.key_positions[path + (key,)] = key_pos
            result[key] = _build(value_node, path + (key,), loader, doc, problems, depth + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _build(item, path + (index,), loader, doc, problems, depth + 1) for index, item in enumerate(node.value)
        ]
    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        problems.append(YamlProblem(_pos(node.start_mark), path, f"cannot read this value: {exc}"))
        return None
