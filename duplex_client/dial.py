"""One connection attempt: the websocket handshake, the first frame, the gateway's answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from duplex_client.errors import DuplexClientError, ResumeRefused
from duplex_client.events import ErrorEvent
from duplex_client.retry import RETRYABLE_RESUME_CODES, NoAnswer

__all__ = ["dial", "dial_and_open", "dial_and_resume", "recv_json"]


async def dial(url: str, *, api_key: str | None, timeout: float) -> ClientConnection:
    """The websocket handshake, with ``api_key`` as ``Authorization: Bearer``."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return await websockets.connect(url, additional_headers=headers, max_size=None,
                                    open_timeout=timeout)


async def recv_json(ws: ClientConnection) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(await ws.recv())
    return data


async def _first_answer(ws: ClientConnection, first: dict[str, Any],
                        timeout: float) -> dict[str, Any]:
    """Send ``first`` and read the gateway's answer; the socket is aborted on any failure (a
    cancellation included), so an attempt never leaks one."""
    try:
        await ws.send(json.dumps(first))
        try:
            return await asyncio.wait_for(recv_json(ws), timeout)
        except TimeoutError:
            raise NoAnswer(f"no answer within {timeout} s") from None
    except BaseException:
        ws.transport.abort()
        raise


def _refusal(answer: dict[str, Any], what: str) -> DuplexClientError:
    """The exception for an answer that is not the one hoped for (an ``error`` event)."""
    code = ErrorEvent("error", None, answer).code  # the Realtime shape or the seed's flat one
    if what == "resume" and code not in RETRYABLE_RESUME_CODES:
        return ResumeRefused(f"resume refused: {answer}", code=code)
    return DuplexClientError(f"{what} refused: {answer}", code=code)


async def dial_and_open(url: str, *, api_key: str | None, session: dict[str, Any],
                        timeout: float) -> tuple[ClientConnection, dict[str, Any]]:
    """One open attempt: connect, send ``session.update``, read the answer."""
    ws = await dial(url, api_key=api_key, timeout=timeout)
    answer = await _first_answer(ws, {"type": "session.update", "session": session}, timeout)
    if answer.get("type") != "session.created":
        ws.transport.abort()
        raise _refusal(answer, "open")
    return ws, answer


async def dial_and_resume(url: str, *, api_key: str | None, resume: dict[str, Any],
                          timeout: float) -> tuple[ClientConnection, dict[str, Any]]:
    """One resume attempt: connect, send ``resume`` (a ``session.resume`` event), read the
    answer."""
    ws = await dial(url, api_key=api_key, timeout=timeout)
    answer = await _first_answer(ws, resume, timeout)
    if answer.get("type") != "session.resumed":
        ws.transport.abort()
        raise _refusal(answer, "resume")
    return ws, answer
