"""Server turn detection with the official openai SDK, then a resume after a dropped connection.

Streams a spoken WAV with `server_vad` on and never commits: the server hears where the turn
ends, commits it and answers by itself. At the answer's first audio the example drops the
connection, opens a new one and resumes the session with `session.resume` (the project's
extension, sent as the SDK sends any event): the answer goes on where it stopped, no event lost
or repeated.

Run a stack with `./scripts/dev --backend loopback` (it plays the turn back) or `./scripts/dev`
(the cascade answers what it heard; set DUPLEX_GATEWAY_MODEL=cascade), then
`python examples/sdk_server_vad.py question.wav` with any PCM WAV of speech (any rate and channel
count, e.g. `arecord -f S16_LE -r 24000 -c 1 -d 3 question.wav`). DUPLEX_GATEWAY_URL: the
gateway (ws://127.0.0.1:8000/v1); DUPLEX_GATEWAY_MODEL: a model name it serves (loopback).
"""

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from duplex_gateway.wav import read_wav

URL = os.environ.get("DUPLEX_GATEWAY_URL", "ws://127.0.0.1:8000/v1")
MODEL = os.environ.get("DUPLEX_GATEWAY_MODEL", "loopback")
CHUNK = 4800  # 100 ms of pcm16 mono at 24 kHz


async def next_event(conn: AsyncRealtimeConnection) -> dict[str, Any]:
    """The next server event as JSON: the SDK's types leave out the resume extension's fields
    (`session_id`, `resume_token`, `server_event_seq`)."""
    event: dict[str, Any] = json.loads(await conn.recv_bytes())
    # Where on the audio sent the server heard the turn (speech_started, speech_stopped), and
    # what was said (the cascade's transcripts).
    print(event["type"], *(f"{key}={value!r}" for key, value in event.items()
                           if key.endswith("_ms") or key == "transcript"))
    return event


async def main(wav: Path) -> None:
    # The recording, then a second of silence: the pause that ends the turn.
    pcm = read_wav(wav).pcm16 + bytes(48_000)
    client = AsyncOpenAI(api_key="unused", websocket_base_url=URL)
    seqs: list[int] = []
    audio = bytearray()
    async with client.realtime.connect(model=MODEL) as conn:
        created = await next_event(conn)
        session_id, token = created["session_id"], created["resume_token"]
        # A new loopback session starts with server_vad already; this shows where it is set.
        await conn.session.update(session={"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}})
        for at in range(0, len(pcm), CHUNK):
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(pcm[at:at + CHUNK]).decode())
        while True:
            event = await next_event(conn)
            seqs.append(event["server_event_seq"])
            if event["type"] == "response.output_audio.delta":
                audio += base64.b64decode(event["delta"])
                break
        # 1001 (going away): the session waits DISCONNECT_GRACE_S (30 s) for a resume.
        await conn.close(code=1001)
    print(f"dropped the connection after server_event_seq {seqs[-1]}")
    async with client.realtime.connect(model=MODEL) as conn:
        resume: Any = {"type": "session.resume", "session_id": session_id,
                       "resume_token": token, "last_received_server_event_seq": seqs[-1]}
        await conn.send(resume)
        # Before session.resumed, at most a session.created: this URL's own session, given up.
        while (event := await next_event(conn))["type"] != "session.resumed":
            if event["type"] == "error":  # the session ended, or its token is void
                raise SystemExit(f"resume refused: {event['error']['code']}")
        print(f"resumed {session_id}: replay from server_event_seq {event['replay_from']}")
        while event["type"] != "response.done":
            event = await next_event(conn)
            seqs.append(event["server_event_seq"])
            if event["type"] == "response.output_audio.delta":
                audio += base64.b64decode(event["delta"])
        status = event["response"]["status"]
    in_order = seqs == list(range(seqs[0], seqs[-1] + 1))
    print(f"response {status}: {len(audio)} audio bytes; server_event_seq {seqs[0]} to"
          f" {seqs[-1]}, each once and in order: {in_order}")


if len(sys.argv) != 2:
    sys.exit("usage: python examples/sdk_server_vad.py SPEECH.wav")
asyncio.run(main(Path(sys.argv[1])))
