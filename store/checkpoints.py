"""Checkpoints and adoption: what lets a session outlive its worker (docs/design/hand-over.md).

A worker records where its sessions stand (:func:`write_checkpoints`, many sessions of one hash
slot in one call), and another worker takes a session over from the last such record
(:func:`adopt_session`), by compare-and-set on the session's owner epoch, after which the old
owner's writes are refused. The scripts are ``store/lua/write_checkpoint.lua`` and
``store/lua/adopt_session.lua``; this module builds their arguments and reads their answers.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from store.answers import reply_text
from store.client import store_call
from store.keys import WorkerKeys, session_keys
from store.pushes import encode_hand_over

__all__ = [
    "AdoptStatus",
    "Adoption",
    "Checkpoint",
    "CheckpointStatus",
    "CheckpointWrite",
    "ReserveStatus",
    "adopt_session",
    "adopted_sessions",
    "read_checkpoint",
    "tell_adopter",
    "write_checkpoints",
]

#: Runs a script with these keys and arguments and returns its answer.
RunScript = Callable[[Sequence[str], Sequence[Any]], Awaitable[Any]]


class CheckpointStatus(enum.StrEnum):
    """What became of one session's checkpoint."""

    #: Written: the record holds it now.
    OK = "ok"
    #: The session ended (nothing to continue).
    CLOSED = "closed"
    #: No such session (it ended and expired).
    UNKNOWN = "unknown"
    #: Its record is of another format: nothing of it is read.
    OTHER_FORMAT = "other_format"
    #: Another worker serves it now.
    MOVED = "moved"
    #: Its output log does not end at the event the checkpoint names (a write came between).
    BEHIND = "behind"


class ReserveStatus(enum.StrEnum):
    """Whether a worker could reserve a slot for a session it is to take over."""

    #: Reserved (or it was already).
    OK = "ok"
    #: Not live: draining, lost, not beating, or of another format.
    UNAVAILABLE = "unavailable"
    #: Every slot is taken.
    FULL = "full"
    #: It does not serve the session's model.
    OTHER_MODEL = "other_model"


class AdoptStatus(enum.StrEnum):
    """How an adoption went."""

    OK = "ok"
    CLOSED = "closed"
    UNKNOWN = "unknown"
    OTHER_FORMAT = "other_format"
    #: Its owner epoch is not the one named: someone else adopted it first.
    MOVED = "moved"
    #: It has no checkpoint: nothing to continue from.
    NO_CHECKPOINT = "no_checkpoint"
    #: Its checkpoint is not the one named (a newer one was written meanwhile).
    OTHER_CHECKPOINT = "other_checkpoint"
    #: Its input log no longer holds what the checkpoint needs read back.
    INPUT_GONE = "input_gone"


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointWrite:
    """One session's checkpoint.

    Attributes:
        session_id: the session.
        owner_epoch: the owner epoch the worker serves it under.
        applied: the ID of the last input entry the state reflects (``<fence>-<index>``).
        keep: the ID of the oldest input entry an adopter reads back (the input buffer's
            audio; ``applied`` when it needs none): the input log is trimmed no further.
        seq: the ``server_event_seq`` of the last event the state reflects.
        core: the conversation core's state, encoded
            (``inference_worker/conversation/checkpoint.py``).
    """

    session_id: str
    owner_epoch: int
    applied: str
    keep: str
    seq: int
    core: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Adoption:
    """The answer of :func:`adopt_session`.

    Attributes:
        status: how it went; the rest is set only for ``OK``, but ``owner_epoch``.
        owner_epoch: the session's owner epoch now (the adopter's, for ``OK``).
        applied: the checkpoint's last input entry ID: the adopter replays what follows.
        keep: the oldest input entry ID it reads back.
        seq: the checkpoint's last event: the adopter continues the numbering after it once
            it reconciled what the log holds past it.
        core: the conversation core's state.
        output_seq: the output log's last event now (past ``seq`` when the old owner wrote
            after its checkpoint).
    """

    status: AdoptStatus
    owner_epoch: int
    applied: str = ""
    keep: str = ""
    seq: int = 0
    core: bytes = b""
    output_seq: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A session's checkpoint as its record holds it (see :class:`CheckpointWrite`)."""

    owner_epoch: int
    applied: str
    keep: str
    seq: int
    core: bytes


async def read_checkpoint(client: Redis | RedisCluster, session_id: str) -> Checkpoint | None:
    """The session's checkpoint (None: it has none).

    Raises:
        StoreUnavailable: Redis could not be read.
    """
    key = session_keys(session_id).record
    with store_call(f"HMGET {key} checkpoint"):
        fields: Any = await client.hmget(key, ["ck_epoch", "ck_in", "ck_keep", "ck_seq",
                                               "ck_core"])
    epoch, applied, keep, seq, core = fields
    if epoch is None or core is None:
        return None
    return Checkpoint(owner_epoch=int(epoch), applied=reply_text(applied),
                      keep=reply_text(keep), seq=int(seq),
                      core=core if isinstance(core, bytes) else str(core).encode())


async def adopted_sessions(client: Redis | RedisCluster, worker_id: str) -> dict[str, int]:
    """The sessions homed elsewhere that ``worker_id`` holds a slot for, with when each was
    reserved (Redis clock, ms).

    Raises:
        StoreUnavailable: Redis could not be read.
    """
    key = WorkerKeys(worker_id).adopted
    with store_call(f"ZRANGE {key}"):
        members: Any = await client.zrange(key, 0, -1, withscores=True)
    return {reply_text(member): int(score) for member, score in members}


async def tell_adopter(client: Redis | RedisCluster, adopter: str, session_id: str) -> None:
    """Wake ``adopter`` for the session just handed to it (its poll finds it otherwise).

    Raises:
        StoreUnavailable: Redis could not be reached.
    """
    channel = WorkerKeys(adopter).input_channel
    with store_call(f"SPUBLISH {channel}"):
        await client.spublish(channel, encode_hand_over(session_id))


async def write_checkpoints(run: RunScript, batch: Sequence[CheckpointWrite],
                            ) -> list[CheckpointStatus]:
    """Write ``batch`` (sessions of one hash slot) in one call; a status per session."""
    slot = session_keys(batch[0].session_id).worker.worker_id
    keys: list[str] = []
    args: list[Any] = []
    for item in batch:
        k = session_keys(item.session_id)
        if k.worker.worker_id != slot:
            raise ValueError("write_checkpoints takes sessions of one home only")
        keys += [k.record, k.output_log]
        args += [item.owner_epoch, item.applied, item.keep, item.seq, item.core]
    answers = await run(keys, args)
    return [CheckpointStatus(reply_text(answer)) for answer in answers]


async def adopt_session(run: RunScript, session_id: str, *, replaces_epoch: int,
                        adopter: str, checkpoint_seq: int | None = None) -> Adoption:
    """Take ``session_id`` over for worker ``adopter`` from owner epoch ``replaces_epoch``,
    from the checkpoint of ``checkpoint_seq`` (None: whichever the record holds)."""
    k = session_keys(session_id)
    if adopter == k.worker.worker_id:
        raise ValueError(f"{adopter} is {session_id}'s home: a home never takes a session back")
    answer = await run([k.record, k.input_log, k.output_log, k.worker.record,
                        k.worker.sessions, k.worker.moved],
                       [replaces_epoch, adopter,
                        "" if checkpoint_seq is None else checkpoint_seq, session_id])
    status = AdoptStatus(reply_text(answer[0]))
    if status is not AdoptStatus.OK:
        return Adoption(status=status, owner_epoch=int(answer[1]))
    core = answer[5]
    return Adoption(status=status, owner_epoch=int(answer[1]), applied=reply_text(answer[2]),
                    keep=reply_text(answer[3]), seq=int(answer[4]),
                    core=core if isinstance(core, bytes) else str(core).encode(),
                    output_seq=int(answer[6]))
