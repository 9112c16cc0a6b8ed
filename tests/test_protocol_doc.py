"""docs/reference/protocol.md is held to the code: what it lists is exactly what the gateway speaks.

The code's side is derived from the code itself, never from a hand list: the client event
types are the codec's dispatch table and the fields each parser reads (read from
``gateway/protocol/parse.py``'s syntax tree); the server events are one instance of every typed
event a worker can write, delivered through the real :class:`ConnectionCore`, plus every gateway
notice and error through the real renderers; the error codes are :class:`ErrorCode` and every
code the worker's refusals name (read from ``inference_worker/``'s syntax trees); the close
codes are :class:`CloseCode`. GA-ness is the openai SDK's own unions.

The document's side is its tables whose first header cell names them (``client event``,
``server event``, ...) and the JSON lines in its ``<!-- examples: NAME -->`` blocks.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import types
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import pytest
from openai.types.beta.realtime.realtime_client_event import (
    RealtimeClientEvent as BetaClientEvent,
)
from openai.types.beta.realtime.realtime_server_event import (
    RealtimeServerEvent as BetaServerEvent,
)
from openai.types.realtime.realtime_client_event import RealtimeClientEvent
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

from contract import messages as m
from gateway.protocol import dialect, envelope, parse, render
from gateway.protocol.actions import SendFrame
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.dialect import Dialect
from gateway.protocol.errors import ClientProtocolError, CloseCode, ErrorCode, InternalError
from gateway.protocol.render_duplex import DECISION_EVENT_TYPES, DuplexRenderer
from inference_worker.conversation import session_schema
from inference_worker.conversation.refusals import RefusalCode
from tests.gateway.strict import validate_server_event

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reference" / "protocol.md"
KINDS = frozenset({"GA", "beta alias", "seed extension", "ours"})
# Every server and client event has these; the tables list the other fields.
ALWAYS = frozenset({"type", "event_id"})
SID = "sess_w0123456789ab.0123456789abcdef0123456789abcdef"


# --------------------------------------------------------------------------- the document


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One table row: its cells (the first one names the item) and its line in the doc."""

    cells: tuple[str, ...]
    line: int

    @property
    def name(self) -> str:
        names = ticked(self.cells[0])
        assert len(names) == 1, f"line {self.line}: name one item in backticks: {self.cells[0]}"
        return names[0]


def ticked(cell: str) -> list[str]:
    """The backticked words of a cell."""
    return re.findall(r"`([^`]+)`", cell)


def _cells(line: str) -> list[str]:
    if not line.startswith("|"):
        return []
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


@cache
def doc_lines() -> tuple[str, ...]:
    return tuple(DOC.read_text(encoding="utf-8").splitlines())


def doc_table(first_header: str) -> dict[str, Row]:
    """The rows of the one table whose first header cell is ``first_header``, by name."""
    lines = doc_lines()
    starts = [i for i, line in enumerate(lines) if _cells(line)[:1] == [first_header]]
    assert len(starts) == 1, f"{DOC.name} needs exactly one '| {first_header} |' table"
    header = _cells(lines[starts[0]])
    rows: dict[str, Row] = {}
    for i in range(starts[0] + 2, len(lines)):  # past the header and its --- line
        cells = _cells(lines[i])
        if not cells:
            break
        assert len(cells) == len(header), f"line {i + 1}: {len(cells)} cells, not {len(header)}"
        row = Row(tuple(cells), i + 1)
        assert row.name not in rows, f"line {i + 1}: {row.name} is listed twice"
        rows[row.name] = row
    return rows


def column(first_header: str, header: str) -> int:
    """The index of the column ``header`` in the table named by ``first_header``."""
    line = next(line for line in doc_lines() if _cells(line)[:1] == [first_header])
    return _cells(line).index(header)


def kinds_of(first_header: str) -> dict[str, str]:
    """Each item's kind; every kind is one of the four the doc defines."""
    index = column(first_header, "kind")
    kinds = {name: row.cells[index] for name, row in doc_table(first_header).items()}
    for name, kind in kinds.items():
        assert kind in KINDS, f"{name}: kind {kind!r} is not one of {sorted(KINDS)}"
    return kinds


def fields_of(first_header: str, header: str) -> dict[str, set[str]]:
    """Each item's fields: the backticked words of its ``header`` column."""
    index = column(first_header, header)
    return {name: set(ticked(row.cells[index])) for name, row in doc_table(first_header).items()}


def doc_examples(block: str) -> list[dict[str, Any]]:
    """The JSON objects, one per line, of the fenced block after ``<!-- examples: block -->``."""
    lines = doc_lines()
    marker = lines.index(f"<!-- examples: {block} -->")
    assert lines[marker + 1].startswith("```"), f"a fenced block must follow the {block} marker"
    examples: list[dict[str, Any]] = []
    for line in lines[marker + 2:]:
        if line.startswith("```"):
            return examples
        if line.strip():
            examples.append(json.loads(line))
    raise AssertionError(f"the {block} block is not closed")


# --------------------------------------------------------------------------- the SDK's unions


def _union_fields(union: Any) -> dict[str, set[str]]:
    """Event type -> the fields of its SDK model, for one of the SDK's event unions."""
    if typing.get_origin(union) is Annotated:
        union = typing.get_args(union)[0]
    by_type: dict[str, set[str]] = {}
    for model in typing.get_args(union):
        for event_type in typing.get_args(model.model_fields["type"].annotation):
            by_type[event_type] = set(model.model_fields)
    return by_type


GA_CLIENT = _union_fields(RealtimeClientEvent)
GA_SERVER = _union_fields(RealtimeServerEvent)
BETA_CLIENT = _union_fields(BetaClientEvent)
BETA_SERVER = _union_fields(BetaServerEvent)


def check_kinds(kinds: dict[str, str], ga: dict[str, set[str]], beta: dict[str, set[str]]) -> None:
    """GA exactly when the SDK's GA union has the type; a beta alias only from the beta union."""
    for name, kind in sorted(kinds.items()):
        if name in ga:
            assert kind == "GA", f"{name} is a GA event: mark it GA, not {kind!r}"
        elif name in beta:
            assert kind == "beta alias", f"{name} is a beta event: mark it 'beta alias'"
        else:
            assert kind in {"seed extension", "ours"}, f"{name} is in no SDK union: {kind!r}"


# --------------------------------------------------------------------------- the code: client


_FIELD_READERS = frozenset({"require", "optional", "require_seq", "optional_seq", "audio"})


def _fields_read(function: ast.FunctionDef) -> set[str]:
    """The fields a codec function reads through its ``_Fields`` (``f.require("audio")``...)."""
    fields: set[str] = set()
    for node in ast.walk(function):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in _FIELD_READERS and isinstance(node.func.value, ast.Name)
                and node.func.value.id != "self"):
            continue
        first = node.args[0] if node.args else None
        assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
            f"parse.py:{node.lineno}: a field read by a computed name; extend this test")
        fields.add(first.value)
    return fields


@cache
def codec_fields() -> tuple[dict[str, set[str]], set[str]]:
    """(event type -> the fields its parser reads, the fields read for every event), from the
    codec's dispatch table ``_PARSERS`` and the functions it names."""
    tree = ast.parse(Path(parse.__file__).read_text(encoding="utf-8"))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    table = next(node.value for node in tree.body
                 if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                 and node.target.id == "_PARSERS")
    assert isinstance(table, ast.Dict)
    per_type: dict[str, set[str]] = {}
    for key, value in zip(table.keys, table.values, strict=True):
        assert isinstance(key, ast.Constant) and isinstance(key.value, str)
        assert isinstance(value, ast.Name)
        per_type[key.value] = _fields_read(functions[value.id])
    # The seed's append hints are read by name from the contract's list, not one call each.
    per_type["input_audio_buffer.append"] |= m.APPEND_HINT_KEYS
    parsers = {value.id for value in table.values if isinstance(value, ast.Name)}
    common = set().union(*(_fields_read(function) for name, function in functions.items()
                           if name not in parsers))
    return per_type, common


# --------------------------------------------------------------------------- the code: server


def _sample(hint: Any) -> Any:
    """A value of the type ``hint``, for building one instance of every message class."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return _sample(next(arg for arg in typing.get_args(hint) if arg is not type(None)))
    if hint is list or typing.get_origin(hint) is list:
        return []
    samples: dict[Any, Any] = {str: "x", int: 1, bytes: b"\x00\x00", bool: True}
    if hint in samples:
        return samples[hint]
    if hint is dict or typing.get_origin(hint) is dict:
        return {}
    raise AssertionError(f"no sample value for {hint!r}: extend _sample()")


def _instance(cls: type[Any]) -> Any:
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _sample(hints[f.name]) for f in dataclasses.fields(cls)})


def _delivered(event: m.Event, dialect: Dialect = Dialect.GA) -> list[dict[str, Any]]:
    """What a client of ``dialect`` receives for ``event`` written to its session's log: the
    real core (a duplex one: with the decision frames derived from it)."""
    core = ConnectionCore(max_frame_bytes=1 << 20, url_model="loopback", dialect=dialect)
    core.quiet_period_over()
    core.open_succeeded(SID, resume_token="token", generation=1, model="loopback",
                        capabilities={"chunk_period_ms": 40})
    core.actions_to_run()
    core.receive_log_entries(1, [m.encode_message(event)])
    frames = [action.text for action in core.actions_to_run() if isinstance(action, SendFrame)]
    assert frames, f"{type(event).__name__} was not delivered"
    assert len(frames) == 1 or dialect is Dialect.DUPLEX, f"{type(event).__name__}: {frames}"
    return [json.loads(frame) for frame in frames]


def _all_rendered(dialect: Dialect = Dialect.GA) -> Iterator[dict[str, Any]]:
    duplex = DuplexRenderer([])
    render_notice = render.render_notice if dialect is Dialect.GA else duplex.notice
    render_error = render.render_error if dialect is Dialect.GA else duplex.error
    for cls in typing.get_args(m.Event):
        yield from _delivered(_instance(cls), dialect)
    # A listen decision that ends a response names it.
    yield from _delivered(m.ResponseDone(response={"id": "resp_1"}, listen="x"), dialect)
    for cls in typing.get_args(envelope.Notice):
        yield render_notice(_instance(cls), event_id="event_gw_1")
    yield render_error(ClientProtocolError(ErrorCode.INVALID_JSON, "x"), "event_gw_1")
    yield render_error(InternalError("x"), "event_gw_1")


@cache
def samples(dialect: Dialect = Dialect.GA) -> dict[str, dict[str, Any]]:
    """Server event type -> one instance as a client of ``dialect`` gets it."""
    return {sent["type"]: sent for sent in _all_rendered(dialect)}


@cache
def server_fields(dialect: Dialect = Dialect.GA) -> dict[str, set[str]]:
    """Server event type -> every top-level field the code sends on it (type and event_id
    apart), over one instance of each event, notice and error."""
    by_type: dict[str, set[str]] = {}
    for sent in _all_rendered(dialect):
        assert ALWAYS <= sent.keys(), f"{sent['type']} lacks type or event_id"
        by_type.setdefault(sent["type"], set()).update(sent.keys() - ALWAYS)
    return by_type


# --------------------------------------------------------------------------- the code: errors


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` (or ``NAME: Final = "text"``) constants."""
    strings: dict[str, str] = {}
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        value = getattr(node, "value", None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            strings |= {t.id: value.value for t in targets if isinstance(t, ast.Name)}
    return strings


def _callee(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _codes_at(node: ast.expr, path: Path, strings: dict[str, str]) -> set[str] | None:
    """The codes a ``code=`` argument can be; None when it passes a refusal's code on."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name) and node.id in strings:
        return {strings[node.id]}
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "RefusalCode"):
        return {RefusalCode[node.attr].value}  # the worker's catalogue of refusal codes
    if isinstance(node, ast.Attribute) and node.attr == "code":
        return None  # ``ErrorEvent(code=refusal.code)``: counted where the Refusal is made
    if isinstance(node, ast.Name) and path.name == "session_update.py" and node.id == "code":
        return {code.value for _, code in session_schema.LEAVES.values()}  # session.update's table
    raise AssertionError(f"{path.name}:{node.lineno}: an error code the test cannot resolve")


@cache
def worker_error_types() -> dict[str, set[str]]:
    """Error code -> its ``error.type`` values, for every code the worker's refusals and
    error events name anywhere in ``inference_worker/``."""
    default_type = str(next(f.default for f in dataclasses.fields(m.ErrorEvent)
                            if f.name == "error_type"))
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "inference_worker").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        strings = _module_strings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _callee(node) == "VadConfigError":
                # The detector's refusals: a Refusal passes their code on (``error.code``).
                first = node.args[0] if node.args else None
                assert first is not None, f"{path.name}:{node.lineno}: a code"
                for code in _codes_at(first, path, strings) or ():
                    found.setdefault(code, set()).add(default_type)
                continue
            if not isinstance(node, ast.Call) or _callee(node) not in {"Refusal", "ErrorEvent"}:
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            assert not node.args and "code" in keywords, f"{path.name}:{node.lineno}: code="
            codes = _codes_at(keywords["code"], path, strings)
            error_type = keywords.get("error_type")
            if codes is None:
                assert error_type is None, f"{path.name}:{node.lineno}: a refusal's own type"
                continue
            kind = default_type
            if error_type is not None:
                assert isinstance(error_type, ast.Constant), f"{path.name}:{node.lineno}"
                kind = str(error_type.value)
            for code in codes:
                found.setdefault(code, set()).add(kind)
    return found


@cache
def error_types() -> dict[str, set[str]]:
    """Every ``error.code`` a client can get -> its ``error.type`` values."""
    found = {code: set(types_) for code, types_ in worker_error_types().items()}
    for code in ErrorCode:
        found.setdefault(code.value, set()).add(ClientProtocolError(code, "x").error_type)
    return found


# --------------------------------------------------------------------------- tests: client


def test_client_event_types_are_exactly_the_ones_the_codec_dispatches_on() -> None:
    """The client event table lists every type the codec parses and nothing else, and the
    refused table every type it answers with unsupported_event."""
    per_type, _ = codec_fields()
    assert set(per_type) == parse.CLIENT_EVENT_TYPES  # the derivation reads the real table
    assert set(doc_table("client event")) == parse.CLIENT_EVENT_TYPES
    assert set(doc_table("refused client event")) == parse.UNSUPPORTED_CLIENT_EVENT_TYPES


def test_client_event_fields_are_exactly_the_ones_their_parsers_read() -> None:
    """Each client event's fields column names exactly what its parser reads, and the common
    field table what is read for every event."""
    per_type, common = codec_fields()
    assert fields_of("client event", "fields") == per_type
    assert set(doc_table("common client field")) == common


def test_client_event_kinds_follow_the_sdk_unions() -> None:
    """A client event is marked GA exactly when the SDK's GA union has it, and a beta alias
    only when the beta union does."""
    check_kinds(kinds_of("client event"), GA_CLIENT, BETA_CLIENT)
    check_kinds(kinds_of("refused client event"), GA_CLIENT, BETA_CLIENT)
    kinds_of("common client field")


def test_every_client_event_has_an_example_the_codec_takes_as_documented() -> None:
    """Every listed client event has an example; the parsed ones parse, the refused ones are
    refused with unsupported_event."""
    parsed, refused = set(doc_table("client event")), set(doc_table("refused client event"))
    examples = doc_examples("client-events")
    assert {example["type"] for example in examples} == parsed | refused
    for example in examples:
        frame = json.dumps(example)
        if example["type"] in parsed:
            parse.parse_client_frame(frame, max_frame_bytes=1 << 20)
            continue
        with pytest.raises(ClientProtocolError) as refusal:
            parse.parse_client_frame(frame, max_frame_bytes=1 << 20)
        assert refusal.value.code == ErrorCode.UNSUPPORTED_EVENT


# --------------------------------------------------------------------------- tests: server


def test_server_event_types_are_exactly_the_ones_the_code_sends() -> None:
    """The server event table lists every type the renderers produce and nothing else."""
    assert set(doc_table("server event")) == set(server_fields())


def test_server_event_fields_are_exactly_the_ones_the_code_sends() -> None:
    """Each server event's fields column names exactly the top-level fields the code sends on
    it, besides type and event_id."""
    assert fields_of("server event", "top-level fields") == server_fields()


def test_server_event_kinds_follow_the_sdk_unions() -> None:
    """A server event is marked GA exactly when the SDK's GA union has it."""
    check_kinds(kinds_of("server event"), GA_SERVER, BETA_SERVER)


def test_every_server_event_has_a_strictly_valid_example() -> None:
    """Every listed server event has an example that validates as the strictest real client
    validates it, with only the documented fields."""
    documented = fields_of("server event", "top-level fields")
    examples = doc_examples("server-events")
    assert {example["type"] for example in examples} == set(documented)
    for example in examples:
        validate_server_event(example)
        extra = example.keys() - ALWAYS - documented[example["type"]]
        assert not extra, f"{example['type']} example has undocumented fields {sorted(extra)}"


# --------------------------------------------------------------------------- tests: extensions


@cache
def _extension_rows() -> tuple[tuple[str, frozenset[str], Row], ...]:
    """(field, the events its "on" column names, row); no events named: every event."""
    on = column("field extension", "on")
    kinds_of("field extension")
    return tuple((name, frozenset(ticked(row.cells[on])), row)
                 for name, row in doc_table("field extension").items())


def _covered(field: str, event_type: str) -> bool:
    return any(name == field and (not events or event_type in events)
               for name, events, _ in _extension_rows())


def test_every_field_the_sdk_lacks_on_a_ga_event_is_a_listed_extension() -> None:
    """A top-level field the code sends on a GA server event, or reads on a GA client event,
    that the SDK's model of that event lacks, has a row in the field extension table."""
    missing = [f"{field} on {event_type}"
               for event_type, fields in server_fields().items() if event_type in GA_SERVER
               for field in sorted(fields - GA_SERVER[event_type])
               if not _covered(field, event_type)]
    per_type, common = codec_fields()
    missing += [f"{field} on {event_type}"
                for event_type, fields in per_type.items() if event_type in GA_CLIENT
                for field in sorted((fields | common) - GA_CLIENT[event_type])
                if not _covered(field, event_type)]
    assert not missing, f"not in the field extension table: {missing}"


def test_every_listed_extension_is_a_field_the_code_sends_or_reads() -> None:
    """Each top-level field extension row names a field the code really has on each event
    it names (on some event, for a row that names none)."""
    per_type, common = codec_fields()
    present = {**{t: f | common for t, f in per_type.items()}, **server_fields()}
    for field, events, row in _extension_rows():
        if "." in field:
            continue  # a nested field (session.extra_body): not a top-level one
        holders = {event_type for event_type, fields in present.items() if field in fields}
        assert holders, f"line {row.line}: nothing sends or reads {field}"
        assert events <= holders, f"line {row.line}: {field} is not on {sorted(events - holders)}"


# --------------------------------------------------------------------------- tests: errors


def test_error_codes_are_exactly_the_ones_the_gateway_and_workers_use() -> None:
    """The error code table lists every ErrorCode and every code a worker refusal names, and
    nothing else."""
    assert "input_audio_buffer_commit_empty" in worker_error_types()  # the scan reads the worker
    assert set(doc_table("error code")) == set(error_types())


def test_error_types_are_the_ones_the_code_gives_each_code() -> None:
    """Each error code's error.type column names exactly the types the code gives it."""
    assert fields_of("error code", "error.type") == error_types()
    kinds_of("error code")


def test_every_error_code_has_a_strictly_valid_example() -> None:
    """Every listed error code has an error event example, strictly valid, of its type."""
    documented = fields_of("error code", "error.type")
    examples = doc_examples("errors")
    assert {example["error"]["code"] for example in examples} == set(documented)
    for example in examples:
        validate_server_event(example)
        assert example["error"]["type"] in documented[example["error"]["code"]]


def test_close_codes_are_exactly_the_ones_the_gateway_sends() -> None:
    """The close code table lists every CloseCode value and nothing else."""
    assert set(doc_table("close code")) == {str(int(code)) for code in CloseCode}
    kinds_of("close code")


# --------------------------------------------------------------------------- tests: duplex dialect


def test_the_url_table_lists_what_the_handshake_reads() -> None:
    """The URL table names the duplex path and every query parameter parse_handshake reads."""
    tree = ast.parse(Path(dialect.__file__).read_text(encoding="utf-8"))
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef)
                    and node.name == "parse_handshake")
    read: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and _callee(node) in {"_flag", "get"}:
            name = node.args[1 if _callee(node) == "_flag" else 0]
            assert isinstance(name, ast.Constant) and isinstance(name.value, str)
            read.add(name.value)
    assert read and set(doc_table("URL")) == read | {dialect.DUPLEX_PATH}
    kinds_of("URL")


def test_duplex_client_events_are_the_duplex_parsers_aliases() -> None:
    """Each listed alias is one the codec takes on duplex connections only, standing for the
    event the table says, reading that event's fields; its example parses as that event on a
    duplex connection and is unknown_event on a GA one."""
    per_type, _ = codec_fields()
    rows = doc_table("duplex client event")
    stands = column("duplex client event", "stands for")
    assert set(rows) == parse.DUPLEX_CLIENT_EVENT_TYPES
    for name, row in rows.items():
        target = parse.DUPLEX_CLIENT_EVENT_ALIASES[name]
        assert ticked(row.cells[stands]) == [target], f"line {row.line}"
        assert fields_of("duplex client event", "fields")[name] == per_type[target]
    kinds_of("duplex client event")
    examples = doc_examples("duplex-client-events")
    assert {example["type"] for example in examples} == set(rows)
    for example in examples:
        text = json.dumps(example)
        parsed = parse.parse_client_frame(text, max_frame_bytes=1 << 20, dialect=Dialect.DUPLEX)
        plain = parse.parse_client_frame(json.dumps(
            {**example, "type": parse.DUPLEX_CLIENT_EVENT_ALIASES[example["type"]]}),
            max_frame_bytes=1 << 20)
        assert type(parsed.command) is type(plain.command)
        with pytest.raises(ClientProtocolError) as refusal:
            parse.parse_client_frame(text, max_frame_bytes=1 << 20)
        assert refusal.value.code == ErrorCode.UNKNOWN_EVENT


def test_duplex_only_events_are_the_listed_ones() -> None:
    """The events a duplex connection gets and a GA one never does are the renderer's
    decision frames and the table's rows, with the fields it lists (no server_event_seq:
    they are derived from the event they ride, no log entries)."""
    ga, duplex = server_fields(), server_fields(Dialect.DUPLEX)
    only = set(duplex) - set(ga)
    assert only == DECISION_EVENT_TYPES == set(doc_table("duplex-only event"))
    documented = fields_of("duplex-only event", "top-level fields")
    assert documented == {event_type: duplex[event_type] for event_type in only}


def test_dialect_fields_are_exactly_the_ones_that_differ() -> None:
    """Every top-level field a duplex connection gets on an event a GA one gets without it,
    and the reverse, is in the dialect field table; nested rows are checked in place."""
    ga, duplex = server_fields(), server_fields(Dialect.DUPLEX)
    gained = {(f, t) for t in ga for f in duplex[t] - ga[t]}
    lost = {(f, t) for t in ga for f in ga[t] - duplex[t]}
    on, ga_column = column("dialect field", "on"), column("dialect field", "GA")
    rows = doc_table("dialect field")
    listed = {(name, t) for name, row in rows.items() if "." not in name
              for t in ticked(row.cells[on])}
    replaced = {(f, t) for row in rows.values() for t in ticked(row.cells[on])
                for f in ticked(row.cells[ga_column]) if f in ga[t]}
    assert listed == gained and replaced == lost
    for row in rows.values():
        assert all(any(f in ga[t] for t in ticked(row.cells[on]))
                   for f in ticked(row.cells[ga_column])), f"line {row.line}"
    for t in ticked(rows["session.capabilities"].cells[on]):
        assert "capabilities" in samples(Dialect.DUPLEX)[t]["session"], t
        assert "capabilities" not in samples()[t]["session"], t


def test_a_seed_reason_is_the_documented_status_details_reason() -> None:
    """The response.status_details.reason row: a response-end event naming the seed's reason
    shows it there on duplex connections."""
    assert "response.status_details.reason" in doc_table("dialect field")

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class WithSeedReason(m.ResponseDone):
        seed_reason: str | None = None

    event = WithSeedReason(response={"id": "resp_1", "status": "cancelled"}, seed_reason="barge_in")
    rendered = DuplexRenderer([])._patches[m.ResponseDone]({}, event)
    assert rendered["response"]["status_details"]["reason"] == "barge_in"


def test_duplex_examples_carry_exactly_the_fields_a_duplex_connection_gets() -> None:
    duplex = server_fields(Dialect.DUPLEX)
    for example in doc_examples("duplex-server-events"):
        assert example.keys() - ALWAYS == duplex[example["type"]], example["type"]


def _rows(first_header: str) -> list[tuple[str, ...]]:
    """A table's rows, names repeated allowed: the backticked words of each cell (``any``:
    none)."""
    lines = doc_lines()
    start = next(i for i, line in enumerate(lines) if _cells(line)[:1] == [first_header])
    rows: list[tuple[str, ...]] = []
    for line in lines[start + 2:]:
        cells = _cells(line)
        if not cells:
            return rows
        rows.append(tuple(" ".join(ticked(cell)) for cell in cells))
    return rows


def test_dialect_error_codes_are_the_code_table() -> None:
    """Each row is one entry of the GA -> seed code table, and every entry has a row."""
    documented = {(code, param or None): seed for code, param, seed in _rows("dialect error code")}
    assert documented == dict(dialect.SEED_ERROR_CODES)


def test_dialect_resync_reasons_are_every_reason_and_its_seed_name() -> None:
    """Every resync reason the core sends has a row, its duplex name the code's."""
    sources = [(ROOT / "gateway" / "protocol" / name).read_text(encoding="utf-8")
               for name in ("connection.py", "delivery.py")]
    sent = {reason for text in sources
            for reason in re.findall(r'ResyncRequiredNotice\([^)]*reason="(\w+)"', text)}
    rows = {name: (ga, duplex.split()[0]) for name, ga, duplex in _rows("dialect resync reason")}
    assert set(rows) == sent and sent
    for reason, (ga, duplex) in rows.items():
        assert ga == reason and duplex == dialect.SEED_RESYNC_REASONS.get(reason, reason)
