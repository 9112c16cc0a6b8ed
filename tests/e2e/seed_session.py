"""What the seed-client acceptance tests share: speech in the seed's input formats, camera
frames, the seed's view of a session's events, and a stack per backend.

The seed's client itself comes from the released wheel (``tests/seed_client.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from runtime.embedded import start_server
from tests.e2e.conftest import FAST_ENV
from tests.e2e.stack import Stack
from tests.worker.speech import synthesize

__all__ = [
    "AUDIO_DELTA",
    "QUESTION",
    "SeedStack",
    "duration_ms",
    "encode",
    "frame_reports",
    "names_frame",
    "png",
    "seed_stack",
    "seq_numbers",
    "speech",
]

#: What the user says in every test: real speech (Piper), a few seconds long.
QUESTION: Final = "Could you tell me what the weather will be like in Paris tomorrow morning?"
#: The seed's name of an audio delta.
AUDIO_DELTA: Final = "response.output_audio.delta"
_TEXT_DELTAS: Final = frozenset({
    "response.output_text.delta", "response.text.delta",
    "response.output_audio_transcript.delta",
})


def speech(rate: int, *, min_ms: int = 0, chunk_ms: int = 200) -> np.ndarray[Any, Any]:
    """:data:`QUESTION` spoken at ``rate`` (float32 samples), padded with silence to at least
    ``min_ms`` and to a whole number of ``chunk_ms`` appends (no append is a stub)."""
    pcm, _ = synthesize(QUESTION, rate)
    chunk = rate * chunk_ms // 1000
    length = max(len(pcm), rate * min_ms // 1000)
    length = -(-length // chunk) * chunk
    padded = np.zeros(length, dtype=np.float32)
    padded[:len(pcm)] = pcm
    return padded


def encode(pcm: np.ndarray[Any, Any], encoding: str) -> bytes:
    """Samples in one of the seed's PCM encodings: ``pcm16`` or ``pcm_f32le``."""
    if encoding == "pcm16":
        return bytes((np.clip(pcm, -1.0, 1.0) * 32767).astype("<i2").tobytes())
    assert encoding == "pcm_f32le", encoding
    return bytes(pcm.astype("<f4").tobytes())


def duration_ms(audio: bytes | bytearray, fmt: Any) -> float:
    """How long ``audio`` lasts in the seed's ``AudioFormat`` ``fmt``."""
    return float(fmt.duration_ms(len(audio)))


def png(red: int, green: int, blue: int, size: int = 16) -> bytes:
    """A valid ``size``x``size`` PNG of one colour (a camera frame the seed accepts: its
    validation reads the PNG signature)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + bytes((red, green, blue)) * size for _ in range(size))
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


def seq_numbers(events: Sequence[dict[str, Any]]) -> list[int]:
    """The ``server_event_seq`` of every numbered event, in arrival order."""
    return [e["server_event_seq"] for e in events if isinstance(e.get("server_event_seq"), int)]


# A frame report: a sha256 (hex, whole or its first 8 digits at least) and the unit the frame
# rode with, in either order.
_DIGEST: Final = r"\b(?=[0-9]*[a-f])([0-9a-f]{8,64})\b"  # hex, not a plain number
_DIGEST_THEN_UNIT: Final = re.compile(_DIGEST + r"[^\n]{0,80}?\bunit\W{0,3}(\d+)")
_UNIT_THEN_DIGEST: Final = re.compile(r"\bunit\W{0,3}(\d+)[^\n]{0,80}?" + _DIGEST)


def frame_reports(events: Sequence[dict[str, Any]]) -> list[tuple[str, int]]:
    """``(digest, unit)`` of each camera frame a recording backend reported, in order of first
    report: read from the text it output (its deltas joined), else from any event."""
    text = "".join(str(e.get("delta") or "") for e in events if e.get("type") in _TEXT_DELTAS)
    for source in (text, "\n".join(json.dumps(e) for e in events)):
        pairs = [(m.group(1), int(m.group(2))) for m in _DIGEST_THEN_UNIT.finditer(source)]
        if not pairs:
            pairs = [(m.group(2), int(m.group(1))) for m in _UNIT_THEN_DIGEST.finditer(source)]
        if pairs:
            first: dict[str, int] = {}
            for digest, unit in pairs:
                first.setdefault(digest, unit)
            return list(first.items())
    return []


def names_frame(digest: str, frame: bytes) -> bool:
    """Whether a reported ``digest`` is the sha256 of ``frame`` (its bytes, or the bare base64
    the wire carried), whole or its beginning."""
    wire = base64.b64encode(frame)
    return any(hashlib.sha256(data).hexdigest().startswith(digest) for data in (frame, wire))


@dataclass(frozen=True, slots=True)
class SeedStack:
    """A gateway and one worker of ``backend`` (serving the model ``backend``) on their own
    Redis, as the seed's client dials it.

    Attributes:
        backend: the worker's backend, which is also the model's name.
        url: the gateway's base URL (``ws://HOST:PORT``); the client adds ``/v1/realtime``.
    """

    backend: str
    url: str


def seed_stack(backend: str) -> Iterator[SeedStack]:
    """Start a :class:`SeedStack` for ``backend``, yield it, stop it (for module fixtures:
    a model backend loads once)."""
    server = start_server("auto")
    running = Stack(redis=server, env=dict(FAST_ENV))
    try:
        gateway = running.gateway()
        running.worker(slots=4, backend=backend)
        yield SeedStack(backend=backend, url=f"ws://127.0.0.1:{gateway.port}")
    finally:
        running.stop()
        server.stop()
