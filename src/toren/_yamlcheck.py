"""YAML that says where it is wrong: parsing with duplicate keys refused and the line of
every key path, and problems rendered as ``file:line: at 'key': found X; expected Y``.

Agent loading (``toren.agents``) and the scripted provider's script files
(``toren.providers.scripted``) both read YAML this way; it lives below both so that neither
imports the other. ``toren.agents.diagnostics`` adds the translation of pydantic's errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from toren.errors import AgentConfigError

__all__ = [
    "MISSING",
    "Loc",
    "Problem",
    "config_error",
    "describe_found",
    "format_path",
    "parse_yaml",
]

Loc = tuple[str | int, ...]
MISSING = object()


@dataclass(frozen=True)
class Problem:
    path: Loc
    found: str
    expected: str

    def render(self, file: str, lines: Mapping[Loc, int]) -> str:
        line = _line_for(self.path, lines)
        where = f"{file}:{line}" if line else file
        key = f"at {format_path(self.path)!r}" if self.path else "at the top level"
        return f"{where}: {key}: found {self.found}; expected {self.expected}"


def format_path(path: Loc) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line_for(path: Loc, lines: Mapping[Loc, int]) -> int | None:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def config_error(
    file: str, problems: Sequence[Problem], lines: Mapping[Loc, int]
) -> AgentConfigError:
    rendered = [p.render(file, lines) for p in problems]
    first = problems[0]
    if len(rendered) == 1:
        message = rendered[0]
    else:
        message = f"{file}: {len(rendered)} problems:\n" + "\n".join(f"  - {r}" for r in rendered)
    return AgentConfigError(
        message,
        file=file,
        key=format_path(first.path),
        found=first.found,
        expected=first.expected,
        problems=rendered,
    )


_TYPE_NAMES = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    list: "list",
    dict: "mapping",
    type(None): "null",
}


def describe_found(value: object) -> str:
    if value is MISSING:
        return "nothing (the key is missing)"
    if isinstance(value, Mapping):
        # Keys only: values may be secrets pasted in the wrong place.
        return f"a mapping with keys {sorted(map(str, value))}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = next((n for t, n in _TYPE_NAMES.items() if type(value) is t), type(value).__name__)
    return f"{text} ({kind})"


# -- YAML with line numbers and duplicate-key detection ---------------------------------


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int, first_line: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first_line = key, line, first_line


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[object, object]:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if (
                not isinstance(key_node, yaml.ScalarNode)
                or key_node.tag == "tag:yaml.org,2002:merge"
            ):
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _line_map(
    node: yaml.Node | None, path: Loc = (), out: dict[Loc, int] | None = None
) -> dict[Loc, int]:
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            sub = (*path, str(key_node.value))
            out[sub] = key_node.start_mark.line + 1
            _line_map(value_node, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out[(*path, index)] = item.start_mark.line + 1
            _line_map(item, (*path, index), out)
    return out


def parse_yaml(
    text: str, file: str, example: str = "'name: my-agent'"
) -> tuple[object, dict[Loc, int]]:
    """YAML with duplicate keys refused, and the line of every key path. A syntax error
    is an :class:`AgentConfigError` naming ``file``, the line, and ``example`` (a mapping
    of the shape the file should have)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _DuplicateKey as dup:
        raise config_error(
            file,
            [
                Problem(
                    (str(dup.key),),
                    f"the key {dup.key!r} a second time (first on line {dup.first_line})",
                    "each key at most once in a mapping",
                )
            ],
            {(str(dup.key),): dup.line},
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = (
            f"{file}:{mark.line + 1}: at line {mark.line + 1}, column {mark.column + 1}"
            if mark is not None
            else file
        )
        raise AgentConfigError(
            f"{where}: found invalid YAML "
            f"({exc.problem or exc.context}); expected a YAML mapping such as "
            f"{example} (check indentation, colons and quotes)",
            file=file,
            key="",
        ) from None
    except yaml.YAMLError as exc:
        raise AgentConfigError(
            f"{file}: found invalid YAML ({exc}); expected a YAML mapping", file=file
        ) from None
    finally:
        loader.dispose()
    return data, _line_map(node)
