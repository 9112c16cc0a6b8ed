"""One push-to-talk turn with the official openai SDK: half a second of a tone in, the answer out.

Run a stack with `./scripts/dev --backend loopback` (the loopback plays each turn back), then
`python examples/sdk_turn.py`. DUPLEX_GATEWAY_URL: the gateway (ws://127.0.0.1:8000/v1);
DUPLEX_GATEWAY_MODEL: a model name it serves (loopback).
"""

import asyncio
import base64
import math
import os
import struct

from openai import AsyncOpenAI

URL = os.environ.get("DUPLEX_GATEWAY_URL", "ws://127.0.0.1:8000/v1")
MODEL = os.environ.get("DUPLEX_GATEWAY_MODEL", "loopback")
# pcm16 little-endian mono at 24 kHz, the session's default format.
TONE = struct.pack("<12000h", *(int(8000 * math.sin(2 * math.pi * 440 * n / 24_000))
                                 for n in range(12_000)))


async def main() -> None:
    client = AsyncOpenAI(api_key="unused", websocket_base_url=URL)
    # The model name places the session on a worker that serves it; the worker's backend was
    # fixed when it started (`./scripts/dev --backend ...`), not chosen per session.
    async with client.realtime.connect(model=MODEL) as conn:
        # turn_detection None: push-to-talk, the client commits and asks for the answer;
        # {"type": "server_vad"} (the default) lets the server find the end of each turn.
        await conn.session.update(session={"type": "realtime",
                                           "audio": {"input": {"turn_detection": None}}})
        await conn.input_audio_buffer.append(audio=base64.b64encode(TONE).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        audio = bytearray()
        async for event in conn:
            print(event.type)
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            elif event.type == "response.done":
                print(f"{event.response.status}: {len(audio)} audio bytes for {len(TONE)} sent")
                break


asyncio.run(main())
