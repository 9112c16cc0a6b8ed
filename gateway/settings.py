"""Settings: one frozen object per process, read once from flags and ``DUPLEX_GATEWAY_*``.

Every field is documented in docs/reference/settings.md; ``tests/test_settings.py`` checks
that the table and this module agree, each row's range included. A field's ``accepts`` is its
range and its ``relation`` how it compares with another field (``runtime.config``); numbers
without a range accept any finite value from 0 up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.protocol.bounds import VideoBounds
from runtime.config import (
    NON_NEGATIVE,
    PORT,
    POSITIVE,
    POSITIVE_COUNT,
    AtLeastOrZero,
    BindAddress,
    LessThan,
    ModelName,
    RedisUrl,
    check_fields,
)
from store.answers import DEFAULT_ATTACHMENT_LEASE_MS

__all__ = ["GatewaySettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySettings:
    """One gateway process."""

    host: str = field(
        default="127.0.0.1", metadata={"help": "address to listen on", "accepts": BindAddress()}
    )
    port: int = field(default=8000, metadata={"help": "TCP port to listen on", "accepts": PORT})
    redis_url: str = field(
        default="redis://127.0.0.1:6379/0",
        metadata={"help": "redis:// for one node, redis+sentinel://host:port[,host:port]/service"
                          " for Sentinel, redis+cluster://host:port for a Cluster",
                  "accepts": RedisUrl()},
    )
    default_model: str = field(
        default="",
        metadata={"help": "the model a session gets when its client names none (in the URL's"
                          " ?model= or its first session.update); empty: the least loaded"
                          " worker of any model", "accepts": ModelName()},
    )
    # Clients that resume send session.resume as their first frame, one round trip after the
    # handshake; clients that wait for session.created send nothing. Opening the URL's session
    # only after a short quiet period spares the resuming ones an open (a slot, a tenant place,
    # an open counted against the tenant's rate) that they would give up at once.
    url_open_delay_s: float = field(
        default=0.2,
        metadata={"help": "a connection whose URL names a model opens its session at its first"
                          " client frame that is not session.resume, or after this long with"
                          " none (for clients that wait for session.created); 0: at once",
                  "accepts": NON_NEGATIVE, "relation": LessThan("first_message_timeout_s")},
    )
    api_keys: tuple[str, ...] = field(
        default=(), metadata={"help": "comma-separated accepted API keys; empty: no auth"}
    )
    tenant_max_sessions: int = field(
        default=0, metadata={"help": "concurrent sessions per API key (tenant); 0: no cap"}
    )
    tenant_sessions_per_minute: int = field(
        default=0,
        metadata={"help": "new sessions per API key (tenant) in any 60 s; more: error"
                          " rate_limit_exceeded, close 1013; 0: no limit"},
    )
    max_frames_per_s: float = field(
        default=200.0,
        metadata={"help": "client frames read per second per connection (1 s burst); faster"
                          " senders are paced (read later), not refused"},
    )
    max_bytes_per_s: float = field(
        default=2 * 1024 * 1024,
        metadata={"help": "client frame bytes read per second per connection (1 s burst);"
                          " faster senders are paced; 0: no limit"},
    )
    max_audio_speed: float = field(
        default=10.0,
        metadata={"help": "input audio accepted per connection, as a multiple of real time"
                          " (24 kHz pcm16: 48,000 bytes/s; 1 s burst); faster audio is paced;"
                          " 0: no limit"},
    )
    max_frame_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata={"help": "largest client frame; larger: close 1009", "accepts": POSITIVE_COUNT},
    )
    max_video_frame_bytes: int = field(
        default=3_000_000,
        metadata={"help": "largest camera frame (an image of an append's video_frames, decoded);"
                          " larger: invalid_video_frames; 0: only MAX_FRAME_BYTES bounds it"},
    )
    max_video_frames_per_s: float = field(
        default=4.0,
        metadata={"help": "camera frames per second per connection (1 s burst, at least one"
                          " append's 2); more: invalid_video_frames; 0: no limit"},
    )
    pulled_input_hold_s: float = field(
        default=0.08,
        metadata={"help": "input for a session whose worker reads its input on its own clock"
                          " (a frame backend's, once per tick) is held until it completes a"
                          " model frame (the session's chunk_period_ms) or is not audio, at"
                          " most this long from its oldest command, so each append carries a"
                          " frame; 0: append at once",
                  "accepts": NON_NEGATIVE},
    )
    first_message_timeout_s: float = field(
        default=10.0,
        metadata={"help": "wait this long for the first client message", "accepts": POSITIVE},
    )
    open_timeout_s: float = field(
        default=5.0,
        metadata={"help": "give up placing a session after this long", "accepts": POSITIVE},
    )
    attach_lease_s: float = field(
        default=DEFAULT_ATTACHMENT_LEASE_MS / 1000,
        metadata={"help": "sessions attached through this gateway are detached by any reaper"
                          " once it has not renewed its lease for this long (killed, paused,"
                          " cut off); renewed every fifth of it, once per worker",
                  "accepts": POSITIVE},
    )
    disconnect_grace_s: float = field(
        default=30.0, metadata={"help": "a detached session expires after this long"}
    )
    departed_grace_s: float = field(
        default=2.0,
        metadata={"help": "a session whose client closed its socket normally (1000) without"
                          " session.close (the openai SDK's way of leaving) expires after this"
                          " long instead of DISCONNECT_GRACE_S; 0: the full grace"},
    )
    idle_ttl_s: float = field(
        default=300.0,
        metadata={"help": "a session with no activity expires after this long",
                  "accepts": POSITIVE},
    )
    output_log_max_entries: int = field(
        default=4096,
        metadata={"help": "events kept per session for replay", "accepts": POSITIVE_COUNT},
    )
    input_log_max_entries: int = field(
        default=4096,
        metadata={"help": "input log entries a session's worker may have unread (one command"
                          " each, or a frame backend's commands of one append); more:"
                          " input_backpressure",
                  "accepts": POSITIVE_COUNT},
    )
    # The seed's max_pending_input_bytes_per_session: what one session's unread input may
    # hold in Redis, however few commands carry it. A command as large as a frame must fit an
    # empty input log, or a client sending one would be refused input_backpressure, resume,
    # resend it and be refused again forever.
    input_log_max_bytes: int = field(
        default=16 << 20,
        metadata={"help": "bytes of Redis memory a session's unread input may take (at least"
                          " MAX_FRAME_BYTES); more: input_backpressure; 0: no limit",
                  "relation": AtLeastOrZero("max_frame_bytes")},
    )
    # The seed's pending-output bounds (max_pending_output_events/_bytes_per_session).
    output_backpressure_events: int = field(
        default=512,
        metadata={"help": "events a client may leave untaken (in the log after the last one"
                          " its websocket accepted); more: the active response ends failed,"
                          " output_backpressure; 0: no limit"},
    )
    output_backpressure_bytes: int = field(
        default=2 * 1024 * 1024,
        metadata={"help": "bytes of those events as the client gets them, plus the socket's"
                          " write buffer; more: as OUTPUT_BACKPRESSURE_EVENTS; 0: no limit"},
    )
    output_stall_timeout_s: float = field(
        default=30.0,
        metadata={"help": "a send to a client that stays blocked this long (it reads nothing)"
                          " closes the connection 1013 output_stalled; the session is"
                          " detached, resumable; 0: never"},
    )
    socket_send_buffer_bytes: int = field(
        default=0,
        metadata={"help": "SO_SNDBUF of each websocket's socket: a small one shows a client"
                          " that does not read sooner (tests use it); 0: the OS's"},
    )
    # Audio is nearly all a session sends, and deflate shrinks base64 audio little (it mostly
    # undoes base64's 4/3) at a CPU cost per chunk larger than the relay's own
    # (docs/performance/notes/2026-12-05-relay-cpu.md), paid for every frame in and out, plus a
    # compression context per connection.
    ws_per_message_deflate: bool = field(
        default=False,
        metadata={"help": "negotiate permessage-deflate (RFC 7692) with clients that offer it"
                          " (browsers and the openai SDK do); off: frames go uncompressed, at"
                          " less CPU per frame; true or false"},
    )
    # An attached client that never acks keeps ~retention + 1 s of output in Redis: 3 s keeps a
    # 24 kHz stream under DESIGN §5's 256 KiB per session (bench relay: ~237 KiB; 5 s: ~373).
    delivered_retention_s: float = field(
        default=3.0,
        metadata={"help": "events delivered this long ago are trimmed from the log; 0: never"},
    )
    closed_retention_s: float = field(
        default=60.0, metadata={"help": "a closed session stays replayable this long"}
    )
    # A lost worker's sessions end within HEARTBEAT_TTL_S + one reaper pass: with the workers'
    # defaults (1 s beats, 1.5 s TTL) 0.25 s keeps that inside 2 beats with room to spare.
    reaper_interval_s: float = field(
        default=0.25,
        metadata={"help": "how often this gateway runs the expiry reaper", "accepts": POSITIVE},
    )
    # Three: a gateway that dies leaves each of its workers two reapers while its listing
    # runs out, so worker loss is still seen within one pass.
    reapers_per_worker: int = field(
        default=3,
        metadata={"help": "how many of the live gateways reap each worker",
                  "accepts": POSITIVE_COUNT},
    )
    log_poll_interval_s: float = field(
        default=1.0,
        metadata={"help": "safety read of the output log when pushes are quiet",
                  "accepts": POSITIVE},
    )
    # Off by default: a gateway in production serves the protocol only, and a page that asks
    # for the microphone is something an operator turns on (`dev` does).
    web_page: bool = field(
        default=False,
        metadata={"help": "serve the browser page (microphone, playback, transcripts, resume)"
                          " at / and its files under /web/; off: both are 404; true or false"},
    )
    redis_start_timeout_s: float = field(
        default=60.0,
        metadata={"help": "at start, wait this long for Redis to answer, then exit 2",
                  "accepts": POSITIVE},
    )

    def __post_init__(self) -> None:
        """Refuse a value out of its field's range, or two settings that contradict."""
        check_fields(self)

    @property
    def video_bounds(self) -> VideoBounds:
        """The bounds on camera frames these settings set."""
        return VideoBounds(max_frame_bytes=self.max_video_frame_bytes,
                           max_frames_per_s=self.max_video_frames_per_s)
