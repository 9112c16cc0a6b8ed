"""The seed's audio rates in a session object, folded into GA-shaped format objects.

The seed's clients give each direction's rate apart from its encoding: the input's as
``sample_rate_hz`` (or ``sample_rate``) at the session's top level or under ``audio.input``,
the output's under ``audio.output``. :func:`fold_rates` moves each onto the ``rate`` of that
direction's format object (the patch's own, or else the session's), so that everything after
it (the checks, the merge, the effective session object) sees only format objects:
``{"type": "audio/pcm", "rate": 16000}`` for pcm16 at 16 kHz. A rate key wins over the
``rate`` of a format object given beside it (the seed's order); the top-level input rate over
``audio.input``'s.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Any, Final

from contract.messages import JsonObject
from inference_worker.audio_formats import MAX_RATE, MIN_RATE, is_rate
from inference_worker.conversation.beta import param_name
from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.untrusted import describe

__all__ = ["fold_rates"]

_RATE_NAMES: Final = ("sample_rate_hz", "sample_rate")
# Where each direction's rate may be, first found first.
_RATES: Final = {
    "input": (((), _RATE_NAMES), (("audio", "input"), _RATE_NAMES)),
    "output": ((("audio", "output"), _RATE_NAMES),),
}


def fold_rates(ga: JsonObject, current: JsonObject) -> JsonObject | Refusal:
    """``ga`` (a patch with beta's keys already at their GA places) with the seed's rate keys
    moved onto the format objects' ``rate``; ``ga`` itself when it has none.

    Args:
        ga: the patch; it is not modified.
        current: the effective session object, whose format a rate alone applies to.

    Returns:
        The patch, or a ``bad_event`` refusal (the seed's code) of a rate that is no whole
        number of Hz from :data:`MIN_RATE` to :data:`MAX_RATE`, naming the key sent.
    """
    if not _has_rate(ga):
        return ga
    folded = _copied(ga)
    for direction, places in _RATES.items():
        rate: int | None = None
        for path, names in places:
            container = _at(folded, path)
            if container is None:
                continue
            for name in names:
                if name not in container:
                    continue
                value = container.pop(name)
                if not is_rate(value):
                    return Refusal(code=RefusalCode.BAD_EVENT,
                                   param=param_name((*path, name)),
                                   message=f"{name} must be a whole number of Hz from "
                                           f"{MIN_RATE} to {MAX_RATE}, got {describe(value)}")
                rate = rate or int(value)
        if rate is not None:
            _set_rate(folded, current, direction, rate)
    return folded


def _has_rate(ga: JsonObject) -> bool:
    return any(name in container for places in _RATES.values() for path, names in places
               if (container := _at(ga, path)) is not None for name in names)


def _at(obj: JsonObject, path: tuple[str, ...]) -> JsonObject | None:
    """The object at ``path`` in ``obj`` (None: absent, or not an object, which the checks
    refuse)."""
    for key in path:
        inner = obj.get(key)
        if not isinstance(inner, dict):
            return None
        obj = inner
    return obj


def _copied(ga: JsonObject) -> JsonObject:
    """``ga`` with the objects a rate may be taken from or put in copied (never the client's
    own changed)."""
    out = dict(ga)
    audio = out.get("audio")
    if isinstance(audio, dict):
        out["audio"] = {key: dict(value) if key in ("input", "output") and isinstance(value, dict)
                        else value for key, value in audio.items()}
    return out


def _set_rate(folded: JsonObject, current: JsonObject, direction: str, rate: int) -> None:
    """Put ``rate`` on ``direction``'s format: the patch's, or else the session's."""
    audio = folded.setdefault("audio", {})
    if not isinstance(audio, dict):
        return  # refused by the checks
    side = audio.setdefault(direction, {})
    if not isinstance(side, dict):
        return
    fmt: Any = side.get("format", current["audio"][direction]["format"])
    if isinstance(fmt, dict):
        side["format"] = {**{k: v for k, v in fmt.items() if k not in _RATE_NAMES},
                          "rate": rate}
