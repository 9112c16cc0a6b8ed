"""The resume-safe client: a push-to-talk turn whose connection drops at the answer's first audio;
`events()` resumes by itself, and no event is lost or repeated. Run `./scripts/dev --backend
loopback`, then `python examples/resume_client.py`; DUPLEX_GATEWAY_URL: the gateway
(ws://127.0.0.1:8000/v1)."""

import asyncio
import os

from duplex_client import DuplexClient, Resumed

URL = os.environ.get("DUPLEX_GATEWAY_URL", "ws://127.0.0.1:8000/v1") + "/realtime"
PCM = bytes(range(256)) * 75  # 0.4 s of pcm16 mono 24 kHz: the loopback plays it back


async def main() -> None:
    session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    async with await DuplexClient.connect(URL, session=session) as client:
        await client.append_audio(PCM)
        await client.commit()
        await client.create_response()
        audio = bytearray()
        seqs: list[int | None] = []
        async for event in client.events():
            if isinstance(event, Resumed):
                print(f"resumed: replay from server_event_seq {event.replay_from}")
                continue
            seqs.append(event.server_event_seq)
            if event.type == "response.output_audio.delta":
                if not audio:
                    await client.drop_connection()  # as a lost network would
                audio += event.audio
            elif event.type == "response.done":
                break
    # Leaving `async with` closed the session: session.close, then session.closed.
    print(f"{len(audio)} audio bytes, as sent: {audio == PCM}; events 1 to {len(seqs)}, each"
          f" once and in order: {seqs == list(range(1, len(seqs) + 1))}")


asyncio.run(main())
