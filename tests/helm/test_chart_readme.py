"""The chart README's values table lists every value of values.yaml, with its type (from the
schema) and its default, and nothing else."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml  # type: ignore[import-untyped]

from tests.helm.render import CHART

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
#: The marker of a schema node that is a Kubernetes structure passed through whole: one row.
PASSED_THROUGH = "passed through to Kubernetes"
_ROW = re.compile(r"^\| `(?P<path>[^`]+)` \| (?P<type>[^|]+) \| `(?P<default>[^`]*)` \|"
                  r" (?P<meaning>.+) \|$")
_TYPES = {"integer": "int", "number": "number", "string": "string", "boolean": "bool",
          "array": "list", "object": "map"}


@dataclass(frozen=True, slots=True)
class Row:
    """One value: its dotted path, the type the schema gives it, its default as JSON."""

    path: str
    type: str
    default: str


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def type_word(node: dict[str, Any]) -> str:
    """int, number, string, bool, list, map; an enum of strings is a string, the monitoring
    toggles "bool or auto"."""
    if "enum" in node:
        if set(node["enum"]) == {True, False, "auto"}:
            return "bool or auto"
        assert all(isinstance(value, str) for value in node["enum"]), node
        return "string"
    return _TYPES[node["type"]]


def is_branch(node: dict[str, Any], value: Any) -> bool:
    """A closed object of the chart's own, whose keys get rows of their own."""
    return (isinstance(value, dict) and "properties" in node
            and PASSED_THROUGH not in node.get("$comment", ""))


def value_rows(value: Any, node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[Row]:
    node = resolve(node)
    if path and not is_branch(node, value):
        yield Row(".".join(path), type_word(node), json.dumps(value))
        return
    for key, child in value.items():
        yield from value_rows(child, node["properties"][key], (*path, key))


def readme_rows() -> dict[str, tuple[Row, str]]:
    """The README's rows by path, each with its meaning."""
    rows: dict[str, tuple[Row, str]] = {}
    for line in (CHART / "README.md").read_text().splitlines():
        match = _ROW.match(line)
        if match:
            assert match["path"] not in rows, f"{match['path']} has two rows"
            row = Row(match["path"], match["type"].strip(), match["default"])
            rows[match["path"]] = (row, match["meaning"].strip())
    return rows


def test_every_value_has_one_row_and_every_row_a_value() -> None:
    """The table's paths are exactly the values' paths."""
    expected = {row.path for row in value_rows(VALUES, SCHEMA)}
    documented = set(readme_rows())
    assert sorted(expected - documented) == [], "values without a README row"
    assert sorted(documented - expected) == [], "README rows without a value"


def test_each_row_gives_the_schemas_type_and_the_default() -> None:
    """Each row's type is the schema's and its default is values.yaml's, as JSON."""
    documented = readme_rows()
    for row in value_rows(VALUES, SCHEMA):
        assert documented[row.path][0] == row, row.path


def test_each_row_says_what_the_value_means() -> None:
    """No row is left with an empty or placeholder meaning."""
    for path, (_, meaning) in readme_rows().items():
        assert len(meaning) >= 8 and "TODO" not in meaning, path


def schema_keys_missing_from_values(node: dict[str, Any], value: Any,
                                    path: str = "") -> list[str]:
    node = resolve(node)
    if not is_branch(node, value):
        return []
    missing = []
    for key, child in node["properties"].items():
        if key == "global" and not path:  # helm passes it to every chart
            continue
        if key not in value:
            missing.append(path + key)
        else:
            missing += schema_keys_missing_from_values(child, value[key], f"{path}{key}.")
    return missing


def test_every_schema_property_is_a_value() -> None:
    """The schema names no key that values.yaml lacks (but `global`), so no value can be set
    that the table does not document."""
    assert schema_keys_missing_from_values(SCHEMA, VALUES) == []
