"""Reading a frozen settings dataclass from flags and ``DUPLEX_GATEWAY_*`` variables (style rule 8).

Shared by the gateway and the worker, so both read settings the same way; each process builds
its one settings object at start and passes it down, and nothing else reads ``os.environ``.

A field's metadata may carry what it accepts (``"accepts"``: a :class:`Rule`), how it must
compare with another field (``"relation"``: a :class:`Relation`) and its flag (``"flag"``, when
it is not ``--`` plus the field's name with dashes). Every value is checked against its rule
where it was read, so a refusal names the flag or the variable it came from and says what is
accepted, in one line; relations are checked once every field is in range
(:func:`check_fields`, from the dataclass's ``__post_init__``). :func:`documented_range` is
the short text the settings page's table (``docs/reference/settings.md``) gives each field's
range, derived from the same rule and relation, so the table cannot drift from the code unnoticed.
"""

from __future__ import annotations

import abc
import dataclasses
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

from contract.models import MAX_MODEL_NAMES, is_model_name

__all__ = [
    "ENV_PREFIX",
    "NON_NEGATIVE",
    "PORT",
    "POSITIVE",
    "POSITIVE_COUNT",
    "REDIS_SCHEMES",
    "AtLeastOrZero",
    "BindAddress",
    "Choices",
    "LessThan",
    "ModelName",
    "ModelNames",
    "MoreThan",
    "Range",
    "RedisUrl",
    "Relation",
    "Rule",
    "SettingsError",
    "assignment",
    "check_fields",
    "documented_range",
    "env_name",
    "flag_name",
    "from_env",
]

ENV_PREFIX = "DUPLEX_GATEWAY_"
_T = TypeVar("_T")


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the flag or variable."""


class Rule(abc.ABC):
    """What one setting accepts."""

    @abc.abstractmethod
    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (already of the field's type) can be used."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The accepted values, in words, for the one-line refusal."""

    @abc.abstractmethod
    def summary(self) -> str:
        """The accepted values in a few words, as the settings page's table gives them."""

    def shown(self, value: Any) -> str:
        """How a refused value is quoted (a rule may hide what could be a secret)."""
        return _quoted(str(value))


@dataclasses.dataclass(frozen=True, slots=True)
class Range(Rule):
    """A finite number (or an integer) from ``low`` to ``high``; ``low_open``: above ``low``."""

    low: float
    high: float | None = None
    low_open: bool = False

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if not math.isfinite(value):
            return False
        above_low = value > self.low if self.low_open else value >= self.low
        return above_low and (self.high is None or value <= self.high)

    def describe(self) -> str:
        low, high = _number(self.low), None if self.high is None else _number(self.high)
        if self.low_open:
            return f"a number greater than {low}" + ("" if high is None else f" and at most {high}")
        return f"a number of at least {low}" if high is None else f"a number from {low} to {high}"

    def summary(self) -> str:
        low, high = _number(self.low), None if self.high is None else _number(self.high)
        if self.low_open:
            return f"above {low}" + ("" if high is None else f", at most {high}")
        if high is not None:
            return f"{low}-{high}"
        return "0 or more" if self.low == 0 else f"at least {low}"


@dataclasses.dataclass(frozen=True, slots=True)
class Choices(Rule):
    """One of a fixed set of words."""

    values: tuple[str, ...]

    def accepts(self, value: Any) -> bool:
        return value in self.values

    def describe(self) -> str:
        return "one of " + ", ".join(self.values)

    def summary(self) -> str:
        return "one of " + ", ".join(f"`{value}`" for value in self.values)


#: The URL kinds ``store.create_client`` connects to.
REDIS_SCHEMES = ("redis", "rediss", "redis+sentinel", "redis+cluster", "unix")


@dataclasses.dataclass(frozen=True, slots=True)
class RedisUrl(Rule):
    """A URL of one of :data:`REDIS_SCHEMES` naming a host (a path for ``unix://``).

    A refused URL is shown by its scheme only: it may carry a password.
    """

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, str):
            return False
        parts = urlsplit(value)
        if parts.scheme not in REDIS_SCHEMES:
            return False
        return bool(parts.path if parts.scheme == "unix" else parts.netloc)

    def describe(self) -> str:
        schemes = [f"{scheme}://" for scheme in REDIS_SCHEMES]
        return f"a {', '.join(schemes[:-1])} or {schemes[-1]} URL naming its server"

    def summary(self) -> str:
        schemes = [f"`{scheme}://`" for scheme in REDIS_SCHEMES]
        return f"a {', '.join(schemes[:-1])} or {schemes[-1]} URL"

    def shown(self, value: Any) -> str:
        scheme = urlsplit(str(value)).scheme
        return f"{_quoted(scheme)}://..." if scheme else "(not a URL)"


@dataclasses.dataclass(frozen=True, slots=True)
class ModelName(Rule):
    """A model name (``contract/models.py``), or empty where the setting says what that means."""

    def accepts(self, value: Any) -> bool:
        return value == "" or is_model_name(value)

    def describe(self) -> str:
        return ("a model name (letters, digits and . _ : / -, starting with a letter or digit,"
                " at most 128), or empty")

    def summary(self) -> str:
        return "a model name, or empty"


@dataclasses.dataclass(frozen=True, slots=True)
class ModelNames(Rule):
    """Model names, comma-separated, each at most once; none where the setting says what that
    means."""

    def accepts(self, value: Any) -> bool:
        return (isinstance(value, tuple) and len(value) <= MAX_MODEL_NAMES
                and len(set(value)) == len(value) and all(map(is_model_name, value)))

    def describe(self) -> str:
        return (f"up to {MAX_MODEL_NAMES} distinct model names, comma-separated (letters,"
                " digits and . _ : / -, starting with a letter or digit, at most 128 each)")

    def summary(self) -> str:
        return f"up to {MAX_MODEL_NAMES} model names, comma-separated"

    def shown(self, value: Any) -> str:
        return _quoted(",".join(value) if isinstance(value, tuple) else str(value))


# One label of a host name: letters, digits and inner hyphens, at most 63 (RFC 1123).
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_HOST_NAME_MAX = 253


@dataclasses.dataclass(frozen=True, slots=True)
class BindAddress(Rule):
    """An address a listener can be given: an IPv4 or IPv6 literal, or a host name.

    Only the form is checked here; whether the address is this machine's is found out when the
    listener binds. A port suffix, a URL, brackets or spaces are refused: the port is its own
    setting, and the listener would otherwise fail later with a less direct message.
    """

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, str):
            return False
        return _is_ip_literal(value) or _is_host_name(value)

    def describe(self) -> str:
        return ("an IPv4 or IPv6 address, or a host name (letters, digits, hyphens, dots),"
                " without a port")

    def summary(self) -> str:
        return "an IPv4 or IPv6 address, or a host name"


def _is_ip_literal(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _is_host_name(value: str) -> bool:
    labels = value.removesuffix(".").split(".")
    if len(value) > _HOST_NAME_MAX or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return False
    # An all-digit last label makes the name a mistyped IPv4 address (999.1.1.1), not a name.
    return not labels[-1].isdigit()


@dataclasses.dataclass(frozen=True, slots=True)
class Relation(abc.ABC):
    """How one setting must compare with the field ``other`` of the same object."""

    other: str

    @abc.abstractmethod
    def holds(self, value: Any, other_value: Any) -> bool:
        """Whether ``value`` may go with the other field's ``other_value``."""

    @abc.abstractmethod
    def describe(self, other: str) -> str:
        """The accepted values in words, ``other`` naming the other field."""


@dataclasses.dataclass(frozen=True, slots=True)
class MoreThan(Relation):
    """Greater than the other field."""

    def holds(self, value: Any, other_value: Any) -> bool:
        return bool(value > other_value)

    def describe(self, other: str) -> str:
        return f"more than {other}"


@dataclasses.dataclass(frozen=True, slots=True)
class LessThan(Relation):
    """Less than the other field."""

    def holds(self, value: Any, other_value: Any) -> bool:
        return bool(value < other_value)

    def describe(self, other: str) -> str:
        return f"less than {other}"


@dataclasses.dataclass(frozen=True, slots=True)
class AtLeastOrZero(Relation):
    """0 (the setting is off), or at least the other field."""

    def holds(self, value: Any, other_value: Any) -> bool:
        return bool(value == 0 or value >= other_value)

    def describe(self, other: str) -> str:
        return f"at least {other}, or 0"


#: A TCP port; 0 means "any free port" or "off", as the setting's help says.
PORT = Range(0, 65535)
#: A count of at least one.
POSITIVE_COUNT = Range(1)
#: A duration or rate that must be above zero.
POSITIVE = Range(0, low_open=True)
#: The rule of every number without one of its own (0 usually means "off" or "no limit").
NON_NEGATIVE = Range(0)


def env_name(field_name: str) -> str:
    """The variable that sets ``field_name``."""
    return ENV_PREFIX + field_name.upper()


def flag_name(f: dataclasses.Field[Any]) -> str:
    """The command-line flag that sets field ``f``."""
    return str(f.metadata.get("flag", "--" + f.name.replace("_", "-")))


def assignment(label: str, shown: str) -> str:
    """``--flag value`` or ``VARIABLE=value``, as the operator wrote it."""
    return f"{label} {shown}" if label.startswith("--") else f"{label}={shown}"


def _quoted(raw: str) -> str:
    return raw if raw and raw.isprintable() and " " not in raw else repr(raw)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _rule(f: dataclasses.Field[Any]) -> Rule | None:
    rule = f.metadata.get("accepts")
    if rule is not None:
        return rule  # type: ignore[no-any-return]
    default = f.default
    if isinstance(default, int | float) and not isinstance(default, bool):
        return NON_NEGATIVE
    return None


def _relation(f: dataclasses.Field[Any]) -> Relation | None:
    relation: Relation | None = f.metadata.get("relation")
    return relation


def documented_range(f: dataclasses.Field[Any]) -> str | None:
    """What ``f`` accepts in a few words, as its settings row ends (in parentheses); None: free.

    The rule's words, then the relation's, naming the other field by its variable without the
    prefix. A number without a rule of its own says "0 or more" unless a relation says more.
    """
    own_rule, relation = f.metadata.get("accepts"), _relation(f)
    # A relation is more precise than the "0 or more" of a number without a rule of its own.
    rule = own_rule if own_rule is not None or relation is not None else _rule(f)
    parts = [] if rule is None else [rule.summary()]
    if relation is not None:
        parts.append(relation.describe(f"`{relation.other.upper()}`"))
    return ", ".join(parts) or None


def _expected(f: dataclasses.Field[Any], rule: Rule | None) -> str:
    kind = "an integer" if isinstance(f.default, int) and not isinstance(f.default, bool) else ""
    if rule is None:
        return kind or f"a {type(f.default).__name__}"
    described = rule.describe()
    if kind and described.startswith("a number"):
        return "an integer" + described.removeprefix("a number")
    return described


def _cast(f: dataclasses.Field[Any], raw: str, label: str) -> Any:
    default: Any = f.default
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if isinstance(default, tuple):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        return type(default)(raw)
    except ValueError:
        rule = _rule(f)
        shown = rule.shown(raw) if rule is not None else _quoted(raw)
        raise SettingsError(f"{assignment(label, shown)}: expected {_expected(f, rule)}") from None


def _check(f: dataclasses.Field[Any], value: Any, label: str) -> None:
    rule = _rule(f)
    if rule is not None and not rule.accepts(value):
        where = assignment(label, rule.shown(value))
        raise SettingsError(f"{where}: expected {_expected(f, rule)}")


def check_fields(settings: Any) -> None:
    """Check every field of a settings object against its rule, naming its variable.

    For objects built directly (tests, embedders); :func:`from_env` checks each value where it
    was read instead, so its refusals name the flag when a flag set it.

    Raises:
        SettingsError: the first field whose value its rule refuses, else the first whose
            relation to another field does not hold.
    """
    fields = dataclasses.fields(settings)
    for f in fields:
        _check(f, getattr(settings, f.name), env_name(f.name))
    for f in fields:  # every value is in range now, so a comparison means what it says
        _check_relation(settings, f)


def _check_relation(settings: Any, f: dataclasses.Field[Any]) -> None:
    relation = _relation(f)
    if relation is None:
        return
    value, other_value = getattr(settings, f.name), getattr(settings, relation.other)
    if not relation.holds(value, other_value):
        other = f"{env_name(relation.other)} ({other_value})"
        raise SettingsError(f"{env_name(f.name)}={value}: expected {relation.describe(other)}")


def from_env(cls: type[_T], environ: Mapping[str, str] | None = None, **overrides: Any) -> _T:
    """Build ``cls`` from defaults, then ``DUPLEX_GATEWAY_<FIELD>``, then explicit overrides.

    Overrides whose value is None are ignored (an unset command-line flag); the others are the
    flags' values, and a variable they override is not read at all (flags win, even over a
    variable that would be refused).

    Raises:
        SettingsError: a value does not parse or is out of its range, or two settings
            contradict each other; one line naming the flag or variable.
    """
    env = os.environ if environ is None else environ
    flags = {name: value for name, value in overrides.items() if value is not None}
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = env_name(f.name)
        if f.name in flags:
            _check(f, flags[f.name], flag_name(f))
            values[f.name] = flags[f.name]
        elif name in env:
            values[f.name] = _cast(f, env[name], name)
            _check(f, values[f.name], name)
    return cls(**values)
