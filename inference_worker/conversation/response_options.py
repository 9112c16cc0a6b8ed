"""What ``response.create`` may ask for (:func:`parse_response_options`): GA's and beta's
response options, honoured or refused, as :class:`ResponseOptions`.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from contract.messages import JsonObject
from inference_worker.conversation.beta import renamed_refusal, to_ga
from inference_worker.conversation.profiles import LOOPBACK, SessionProfile
from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.conversation.seed_settings import response_refusal
from inference_worker.conversation.session_schema import (
    Check,
    is_bool,
    is_max_tokens,
    is_modalities,
    is_number,
    is_optional_str,
    is_prompt,
    is_reasoning,
    is_str,
    is_tool_choice,
    is_tools,
    is_voice,
)
from inference_worker.conversation.session_update import (
    effective_value,
    format_refusal,
    modality_refusal,
    too_deep,
)
from inference_worker.untrusted import describe

__all__ = [
    "ResponseOptions",
    "parse_response_options",
]

# OpenAI's metadata bounds: at most 16 pairs, keys up to 64 characters, values up to 512.
_METADATA_PAIRS: Final = 16
_METADATA_KEY_CHARS: Final = 64
_METADATA_VALUE_CHARS: Final = 512
# Beta's flat response keys, each with the GA path it is mapped onto.
_RESPONSE_BETA_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "modalities": ("output_modalities",),
    "voice": ("audio", "output", "voice"),
    "output_audio_format": ("audio", "output", "format"),
    "max_response_output_tokens": ("max_output_tokens",),
    "max_tokens": ("max_output_tokens",),  # the seed's spelling
    "speed": ("audio", "output", "speed"),
}
# GA response option -> its check (the refusal is `invalid_value`). `audio`, `input` and
# `metadata` have checks of their own.
_RESPONSE_LEAVES: Final[Mapping[str, Check]] = {
    "output_modalities": lambda v: v is None or is_modalities(v),
    "instructions": is_optional_str,
    "conversation": lambda v: v in (None, "auto", "none"),
    "max_output_tokens": lambda v: v is None or is_max_tokens(v),
    "tools": lambda v: v is None or is_tools(v),
    "tool_choice": lambda v: v is None or is_tool_choice(v),
    "prompt": is_prompt,
    "reasoning": is_reasoning,
    "parallel_tool_calls": lambda v: v is None or is_bool(v),
}
_RESPONSE_AUDIO_KEYS: Final = frozenset({"format", "voice", "speed"})
# The seed's per-response options, read by seed_settings.response_refusal.
_SEED_OPTIONS: Final = frozenset({"temperature", "extra_body"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOptions:
    """What one ``response.create`` asked for, every option honoured: the request's value,
    else the session's.

    Attributes:
        output_modalities: ``("audio",)`` (audio and its transcript) or ``("text",)``.
        voice: the voice the response really speaks with.
        output_format: the response's audio format (a GA format object).
        instructions: the instructions of this response.
        conversation: ``"auto"`` (the response joins the default conversation) or ``"none"``
            (out of band: it adds nothing to the conversation).
        input: the items the response answers instead of the conversation (None: the
            conversation), checked only for shape (objects with a ``type``): the conversation
            core parses them as it parses ``conversation.item.create``.
        metadata: echoed in ``response.created`` / ``.done`` (LiveKit waits for it).
        max_output_tokens, tools, tool_choice, prompt, reasoning, parallel_tool_calls: as the
            session's fields of those names, for this response.
    """

    output_modalities: tuple[str, ...]
    voice: Any
    output_format: JsonObject
    instructions: str
    conversation: str
    input: tuple[JsonObject, ...] | None
    metadata: Mapping[str, str] | None
    max_output_tokens: int | str
    tools: tuple[JsonObject, ...]
    tool_choice: Any
    prompt: JsonObject | None
    reasoning: JsonObject | None
    parallel_tool_calls: bool | None

    @property
    def audio(self) -> bool:
        """Whether the response is audio (with its transcript) rather than text."""
        return self.output_modalities == ("audio",)

    @property
    def out_of_band(self) -> bool:
        """Whether the response stays out of the conversation (``conversation: "none"``)."""
        return self.conversation == "none"


def parse_response_options(request: JsonObject | None, config: JsonObject,
                           profile: SessionProfile = LOOPBACK) -> ResponseOptions | Refusal:
    """Read a ``response.create``'s ``response`` object: every option is honoured or refused.

    Both GA and beta spellings are read (``modalities``, ``voice``, ``output_audio_format``,
    ``max_response_output_tokens``); a ``null`` option is one left out (LiveKit sends
    ``"instructions": null``). An option ``profile`` cannot set per response
    (:attr:`SessionProfile.fixed_response_options`) may still be sent with the session's own
    value.

    Args:
        request: the ``response`` object of ``response.create``, if any.
        config: the effective session object, which supplies the defaults.
        profile: what the session's backend can do.

    Returns:
        The options, or the refusal of the first option that is malformed (``invalid_type``,
        ``invalid_value``), unknown (``unknown_parameter``), in a format the backend cannot
        take (``unsupported_audio_format``), or one the backend cannot set per response
        (``unsupported_native_response_options``).
    """
    if request is None:
        request = {}
    elif not isinstance(request, dict):
        return Refusal(code=RefusalCode.INVALID_TYPE, param="response",
                       message="expected an object")
    refusal = too_deep(request, "response")
    if refusal is not None:
        return refusal
    mapped = to_ga(request, _RESPONSE_BETA_PATHS, "response")
    if isinstance(mapped, Refusal):
        return mapped
    given, renamed = mapped
    refusal = renamed_refusal(_response_refusal(given, config, profile), renamed)
    if refusal is not None:
        return refusal
    return _response_options(given, config, profile)


def _response_refusal(given: JsonObject, config: JsonObject,
                      profile: SessionProfile) -> Refusal | None:
    for key, value in given.items():
        refusal = _response_option_refusal(key, value, profile)
        if refusal is not None:
            return refusal
    return (modality_refusal(given, profile, "response")
            or _fixed_option_refusal(given, config, profile)
            or response_refusal(given, config, profile.config, tuple(profile.extra_body),
                                native=bool(profile.fixed_response_options)))


def _response_option_refusal(key: str, value: Any, profile: SessionProfile) -> Refusal | None:
    param = f"response.{key}"
    if key == "audio":
        return _response_audio_refusal(value, profile)
    if key == "metadata":
        return _metadata_refusal(value)
    if key == "input":
        return _input_refusal(value)
    if key in _SEED_OPTIONS:
        return None
    check = _RESPONSE_LEAVES.get(key)
    if check is None:
        return Refusal(code=RefusalCode.UNKNOWN_PARAMETER, param=param,
                       message=f"unknown parameter {describe(key)}")
    if check(value):
        return None
    return Refusal(code=RefusalCode.INVALID_VALUE, param=param,
                   message=f"unsupported value {describe(value)}")


def _response_audio_refusal(value: Any, profile: SessionProfile) -> Refusal | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        return Refusal(code=RefusalCode.INVALID_TYPE, param="response.audio",
                       message="expected an object")
    for key in value:
        if key != "output":
            return Refusal(code=RefusalCode.UNKNOWN_PARAMETER, param=f"response.audio.{key}",
                           message=f"unknown parameter {describe(key)}")
    output = value.get("output")
    if output is None:
        return None
    if not isinstance(output, dict):
        return Refusal(code=RefusalCode.INVALID_TYPE, param="response.audio.output",
                       message="expected an object")
    return _response_output_refusal(output, profile)


def _response_output_refusal(output: JsonObject, profile: SessionProfile) -> Refusal | None:
    for key, value in output.items():
        param = f"response.audio.output.{key}"
        if key not in _RESPONSE_AUDIO_KEYS:
            return Refusal(code=RefusalCode.UNKNOWN_PARAMETER, param=param,
                           message=f"unknown parameter {describe(key)}")
        if value is None:
            continue
        if key == "format":
            refusal = format_refusal(value, param, profile)
            if refusal is not None:
                return refusal
        elif key == "speed":
            if not is_number(value, 0.25, 1.5):
                return Refusal(code=RefusalCode.INVALID_VALUE, param=param,
                               message=f"unsupported value {describe(value)}")
        elif not is_voice(value):
            return Refusal(code=RefusalCode.INVALID_VALUE, param=param,
                           message=f"unsupported value {describe(value)}")
    return None


def _metadata_refusal(metadata: Any) -> Refusal | None:
    # Echoed in response.created/.done (LiveKit waits for it), so it must be a string map.
    if metadata is None or (
        isinstance(metadata, dict) and len(metadata) <= _METADATA_PAIRS
        and all(isinstance(k, str) and len(k) <= _METADATA_KEY_CHARS
                and isinstance(v, str) and len(v) <= _METADATA_VALUE_CHARS
                for k, v in metadata.items())
    ):
        return None
    return Refusal(code=RefusalCode.INVALID_VALUE, param="response.metadata",
                   message=f"metadata must map strings to strings: at most {_METADATA_PAIRS} "
                           f"pairs, keys of at most {_METADATA_KEY_CHARS} characters, values "
                           f"of at most {_METADATA_VALUE_CHARS}")


def _input_refusal(items: Any) -> Refusal | None:
    if items is None:
        return None
    if not isinstance(items, list):
        return Refusal(code=RefusalCode.INVALID_TYPE, param="response.input",
                       message="expected an array")
    for index, item in enumerate(items):
        if not (isinstance(item, dict) and is_str(item.get("type"))):
            return Refusal(code=RefusalCode.INVALID_VALUE, param=f"response.input[{index}]",
                           message="each input item is an object with a string type")
    return None


def _session_value(name: str, config: JsonObject) -> Any:
    """What a response gets for option ``name`` when it leaves it out: the session's value."""
    if name == "conversation":
        return "auto"
    return config.get(name)


def _fixed_option_refusal(given: JsonObject, config: JsonObject,
                          profile: SessionProfile) -> Refusal | None:
    for name in sorted(profile.fixed_response_options & given.keys()):
        value = given[name]
        if value is None or (name != "input" and value == _session_value(name, config)):
            continue
        return Refusal(code=RefusalCode.UNSUPPORTED_NATIVE_RESPONSE_OPTIONS,
                       param=f"response.{name}",
                       message=f"model {describe(profile.model)} answers from what it hears "
                               f"and cannot set {name} per response: leave it out")
    return None


def _response_options(given: JsonObject, config: JsonObject,
                      profile: SessionProfile) -> ResponseOptions:
    """The options of an accepted request ``given`` (GA spelling): the request's, else the
    session's."""
    def option(name: str) -> Any:
        value = given.get(name)
        return copy.deepcopy(value if value is not None else _session_value(name, config))

    output = (given.get("audio") or {}).get("output") or {}
    session_output = config["audio"]["output"]
    voice = output.get("voice")
    fmt = output.get("format")
    items = given.get("input")
    return ResponseOptions(
        output_modalities=tuple(option("output_modalities")),
        voice=profile.voice_for(voice) if voice is not None
        else copy.deepcopy(session_output["voice"]),
        output_format=(effective_value(("audio", "output", "format"), fmt, profile)
                       if fmt is not None else dict(session_output["format"])),
        instructions=option("instructions") or "",
        conversation=option("conversation"),
        input=tuple(copy.deepcopy(items)) if items is not None else None,
        metadata=dict(given["metadata"]) if given.get("metadata") is not None else None,
        max_output_tokens=option("max_output_tokens"),
        tools=tuple(option("tools") or ()),
        tool_choice=option("tool_choice"),
        prompt=option("prompt"),
        reasoning=option("reasoning"),
        parallel_tool_calls=option("parallel_tool_calls"),
    )
