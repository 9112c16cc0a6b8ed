"""Feeding a conversation core frames as the engine does."""

from __future__ import annotations

import dataclasses

from inference_worker.audio_frames import FrameOutput
from inference_worker.conversation.core import ConversationCore

__all__ = ["feed"]


def feed(core: ConversationCore, frame: FrameOutput, now: float) -> None:
    """Hand ``core`` one tick's ``frame`` from a step that began after every stop the core
    asked for (the engine stamps the stops it applied; a test of the fence stamps its own)."""
    core.on_frame(dataclasses.replace(frame, epoch=core.epoch), now)
