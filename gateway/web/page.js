// The browser page: the microphone in, the answer out, over the same Realtime protocol as any
// client (docs/reference/protocol.md), with the duplex extensions: playback.ack as the answer plays,
// session.resume after a lost connection, session.event_ack and session.heartbeat.
//
// No framework and no build step. What the page saw is kept in `window.duplexPage` (every
// server_event_seq received, the states it went through, the acknowledged playback), so a
// person in the developer tools, or a test, can check that nothing was lost or repeated.

const RATE = 24000; // pcm16 mono, both ways
const SESSION = {
  type: "realtime",
  audio: {
    input: {
      // The cascade transcribes with Whisper and takes turns with its own VAD; other
      // backends take server_vad from here, so every backend answers a spoken turn.
      transcription: { model: "whisper-tiny.en" },
      turn_detection: { type: "server_vad" },
    },
  },
};
const PLAYBACK_ACK_EVERY_MS = 200;
const EVENT_ACK_EVERY_MS = 1000;
const HEARTBEAT_AFTER_MS = 10000;
// Commands kept for resending after a resume: about 30 s of 40 ms microphone chunks. The
// gateway says which ones its log holds (session.resumed.last_client_seq).
const RESEND_LIMIT = 750;
const RESUME_DEADLINE_MS = 30000;
const BACKOFF_BASE_MS = 100;
const BACKOFF_CAP_MS = 2000;
// Close codes that mean "keep my session, I will resume" (full disconnect grace).
const CLOSE_KEEP_SESSION = 4000;
// Refusals of a resume that no retry can mend.
const FATAL_RESUME_CODES = new Set([
  "session_resume_expired", "invalid_resume_token", "invalid_session_resume",
  "session_resume_conflict", "unsupported_session_resume",
]);

// ------------------------------------------------------------------ the page's record

// Of the current session (a new one starts it afresh).
const record = {};

function resetRecord() {
  Object.assign(record, {
    seqs: [], // every server_event_seq received, in order, duplicates included
    states: [], // every state shown, in order
    acknowledged: [], // every playback.acknowledged: {response_id, played_ms, playback}
    responses: {}, // response id -> its status in response.done
    audioMs: {}, // response id -> milliseconds of its audio received, once it is done
    transcripts: [], // {speaker: "user" | "assistant", item_id, text}
    errors: [], // every error shown
    interrupted: [], // responses whose playback a barge-in cut short
    resumes: 0,
  });
}
resetRecord();
window.duplexPage = record;

// ------------------------------------------------------------------ the page

const $ = (id) => document.getElementById(id);

function showState(state) {
  const output = $("state");
  output.textContent = state;
  output.dataset.state = state;
  record.states.push(state);
}

function showError(text) {
  record.errors.push(text);
  const item = document.createElement("li");
  item.textContent = text;
  $("errors").append(item);
}

function transcriptEntry(speaker, itemId) {
  let entry = document.querySelector(`#transcript li[data-item="${CSS.escape(itemId)}"]`);
  if (entry === null) {
    entry = document.createElement("li");
    entry.dataset.item = itemId;
    entry.dataset.speaker = speaker;
    const who = document.createElement("span");
    who.className = "speaker";
    who.textContent = speaker === "user" ? "You: " : "Model: ";
    const text = document.createElement("span");
    text.className = "text";
    entry.append(who, text);
    $("transcript").append(entry);
  }
  return entry;
}

function setTranscript(speaker, itemId, text, { append = false } = {}) {
  const span = transcriptEntry(speaker, itemId).querySelector(".text");
  span.textContent = append ? span.textContent + text : text;
  let kept = record.transcripts.find((t) => t.item_id === itemId);
  if (kept === undefined) {
    kept = { speaker, item_id: itemId, text: "" };
    record.transcripts.push(kept);
  }
  kept.text = span.textContent;
}

// ------------------------------------------------------------------ audio helpers

function encodePcm16(samples) {
  // Little-endian, as the protocol's audio/pcm is, whatever the machine's byte order.
  const bytes = new Uint8Array(samples.length * 2);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < samples.length; i++) view.setInt16(i * 2, samples[i], true);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x2000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x2000));
  }
  return btoa(binary);
}

function decodePcm16(base64) {
  const binary = atob(base64);
  const samples = new Float32Array(binary.length >> 1);
  for (let i = 0; i < samples.length; i++) {
    let value = binary.charCodeAt(2 * i) | (binary.charCodeAt(2 * i + 1) << 8);
    if (value >= 0x8000) value -= 0x10000;
    samples[i] = value / 32768;
  }
  return samples;
}

function randomId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// Schedules each response's audio back to back on the context's clock, and knows how much of
// each response the listener has heard: the part whose scheduled time the output has passed.
class Player {
  constructor(context) {
    this.context = context;
    this.nextStart = 0;
    this.sources = new Set();
    this.ledgers = new Map(); // response id -> {itemId, samples, segments, stoppedAt, ackedMs}
  }

  // The context time being heard now (the output's own latency taken off where known).
  now() {
    const stamp = this.context.getOutputTimestamp ? this.context.getOutputTimestamp() : null;
    return stamp && stamp.contextTime > 0 ? stamp.contextTime : this.context.currentTime;
  }

  ledger(responseId, itemId) {
    let ledger = this.ledgers.get(responseId);
    if (ledger === undefined) {
      ledger = { itemId, samples: 0, segments: [], stoppedAt: null, ackedMs: 0, acked: false,
        done: false };
      this.ledgers.set(responseId, ledger);
      // The server keeps the 16 newest responses' ledgers; so does the page.
      while (this.ledgers.size > 16) this.ledgers.delete(this.ledgers.keys().next().value);
    }
    return ledger;
  }

  enqueue(responseId, itemId, samples) {
    const ledger = this.ledger(responseId, itemId);
    if (ledger.stoppedAt !== null || samples.length === 0) return; // interrupted: dropped
    const buffer = this.context.createBuffer(1, samples.length, RATE);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const start = Math.max(this.nextStart, this.context.currentTime + 0.05);
    source.start(start);
    this.nextStart = start + samples.length / RATE;
    ledger.segments.push({ start, length: samples.length });
    ledger.samples += samples.length;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
  }

  playedSamples(ledger) {
    const now = ledger.stoppedAt ?? this.now();
    let played = 0;
    for (const segment of ledger.segments) {
      played += Math.min(Math.max((now - segment.start) * RATE, 0), segment.length);
    }
    return Math.floor(played);
  }

  playedMs(ledger) {
    return Math.floor((this.playedSamples(ledger) * 1000) / RATE);
  }

  // Barge-in: silence at once and drop everything queued; each response keeps what was heard.
  // Returns the ids of the responses it cut short.
  stopAll() {
    const now = this.now();
    const cut = [];
    for (const [responseId, ledger] of this.ledgers) {
      if (ledger.stoppedAt === null && this.playedSamples(ledger) < ledger.samples) {
        ledger.stoppedAt = now;
        cut.push(responseId);
      }
    }
    for (const source of this.sources) {
      source.onended = null;
      source.stop();
      source.disconnect();
    }
    this.sources.clear();
    this.nextStart = 0;
    return cut;
  }

  // A response the server ended early: none of its audio still to come may play.
  stopResponse(responseId) {
    const ledger = this.ledgers.get(responseId);
    if (ledger !== undefined && this.playedSamples(ledger) < ledger.samples) this.stopAll();
    if (ledger !== undefined && ledger.stoppedAt === null) ledger.stoppedAt = this.now();
  }

  // {responseId, itemId, playedMs} for every response heard further than acknowledged, and
  // for every response cut short and never acknowledged, even at 0 ms: the server keeps an
  // interrupted answer whole until told how much of it was heard, so a barge-in that comes
  // before its first sample plays must still say "none of it".
  unacknowledged() {
    const due = [];
    for (const [responseId, ledger] of this.ledgers) {
      const playedMs = this.playedMs(ledger);
      const cutUnsaid = ledger.stoppedAt !== null && !ledger.acked;
      if (playedMs > ledger.ackedMs || cutUnsaid) due.push({ responseId, ledger, playedMs });
    }
    return due;
  }

  // A playback.ack saying playedMs went out for this ledger.
  acknowledged(ledger, playedMs) {
    ledger.ackedMs = playedMs;
    ledger.acked = true;
  }
}

// The microphone through the AudioWorklet: 40 ms chunks of pcm16 24 kHz to `onChunk`.
async function openMicrophone(context, onChunk) {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true,
      autoGainControl: true },
  });
  await context.audioWorklet.addModule("/web/microphone-worklet.js");
  const source = context.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(context, "microphone-24k",
    { numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1] });
  node.port.onmessage = (message) => onChunk(message.data);
  source.connect(node);
  node.connect(context.destination); // it writes silence; connected so it is always pulled
  return () => {
    for (const track of stream.getTracks()) track.stop();
    source.disconnect();
    node.disconnect();
  };
}

// ------------------------------------------------------------------ the session

class Talk {
  constructor(key) {
    this.key = key;
    this.ws = null;
    this.live = false; // the socket is open and the session attached on it
    this.sessionId = null;
    this.resumeToken = null;
    this.lastSeq = 0;
    this.ackedSeq = 0;
    this.clientSeq = 0;
    this.sentSeq = 0; // the highest client_seq sent on the current socket
    this.unconfirmed = []; // [client_seq, text] the gateway may not hold yet
    this.ended = false;
    this.resumeDeadline = 0;
    this.resumeControlId = null;
    this.resumeAttempt = 0;
    this.lastErrorCode = null;
    this.lastSentAt = 0;
    this.context = null;
    this.player = null;
    this.closeMicrophone = null;
    this.timers = [];
  }

  async start() {
    showState("connecting");
    this.context = new AudioContext({ latencyHint: "interactive" });
    await this.context.resume();
    this.player = new Player(this.context);
    // First in the log, so the session opens configured; the microphone's chunks follow.
    this.command({ type: "session.update", session: SESSION });
    this.closeMicrophone = await openMicrophone(this.context, (chunk) => {
      this.command({ type: "input_audio_buffer.append", audio: encodePcm16(chunk) });
    });
    this.timers.push(setInterval(() => this.acknowledgePlayback(), PLAYBACK_ACK_EVERY_MS));
    this.timers.push(setInterval(() => this.housekeeping(), EVENT_ACK_EVERY_MS));
    this.dial(null);
  }

  url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}/v1/realtime`;
  }

  // The browser cannot set headers: the key travels as a subprotocol (never in the URL).
  protocols() {
    return this.key ? ["realtime", `openai-insecure-api-key.${this.key}`] : ["realtime"];
  }

  // Open a socket: `resume` null opens the session with the commands queued; otherwise the
  // first frame is that session.resume.
  dial(resume) {
    const ws = new WebSocket(this.url(), this.protocols());
    this.ws = ws;
    this.live = false;
    this.sentSeq = 0;
    ws.onopen = () => {
      if (resume === null) {
        this.live = true;
        this.flush();
      } else {
        this.sendNow(resume);
      }
    };
    ws.onmessage = (message) => this.receive(JSON.parse(message.data));
    ws.onclose = (closed) => this.lost(ws, closed);
  }

  // ---- sending

  sendNow(message) {
    if (this.ws === null || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(typeof message === "string" ? message : JSON.stringify(message));
    this.lastSentAt = performance.now();
    return true;
  }

  // A numbered command, kept until a resume shows the gateway holds it.
  command(message) {
    this.clientSeq += 1;
    const text = JSON.stringify({ ...message, client_seq: this.clientSeq });
    this.unconfirmed.push([this.clientSeq, text]);
    if (this.unconfirmed.length > RESEND_LIMIT) this.unconfirmed.shift();
    if (this.live) this.flush();
  }

  flush() {
    for (const [seq, text] of this.unconfirmed) {
      if (seq <= this.sentSeq) continue;
      if (!this.sendNow(text)) return;
      this.sentSeq = seq;
    }
  }

  // Acknowledgements and heartbeats go out once, only while attached: the next one covers it.
  unsequenced(message) {
    return this.live && this.sendNow(message);
  }

  acknowledgePlayback() {
    if (this.player === null) return;
    for (const { responseId, ledger, playedMs } of this.player.unacknowledged()) {
      const sent = this.unsequenced({ type: "playback.ack", response_id: responseId,
        item_id: ledger.itemId, played_ms: playedMs });
      if (sent) this.player.acknowledged(ledger, playedMs);
    }
  }

  housekeeping() {
    if (this.lastSeq > this.ackedSeq
        && this.unsequenced({ type: "session.event_ack", server_event_seq: this.lastSeq })) {
      this.ackedSeq = this.lastSeq;
    }
    if (performance.now() - this.lastSentAt > HEARTBEAT_AFTER_MS) {
      this.unsequenced({ type: "session.heartbeat" });
    }
  }

  // ---- receiving

  receive(event) {
    const seq = event.server_event_seq;
    if (typeof seq === "number") {
      record.seqs.push(seq);
      $("event-count").textContent = String(record.seqs.length);
      if (seq <= this.lastSeq) return; // already had it before a reconnect
      this.lastSeq = seq;
      $("last-seq").textContent = String(seq);
    }
    const handler = HANDLERS[event.type];
    if (handler !== undefined) handler.call(this, event);
  }

  created(event) {
    this.sessionId = event.session_id;
    this.resumeToken = event.resume_token;
    $("session-id").textContent = event.session_id;
    $("drop").disabled = false;
    $("end").disabled = false;
    showState("connected");
  }

  resumed(event) {
    this.resumeToken = event.resume_token;
    // Where the replay starts: below our position only after a lossy failover, when the next
    // events reuse numbers we had (session.resync_required says so).
    this.lastSeq = event.replay_from - 1;
    this.ackedSeq = Math.min(this.ackedSeq, this.lastSeq);
    const confirmed = event.last_client_seq;
    this.unconfirmed = this.unconfirmed.filter(([seq]) => seq > confirmed);
    if (this.unconfirmed.length > 0 && this.unconfirmed[0][0] > confirmed + 1) {
      showError("some microphone audio from before the drop was lost (resend buffer full)");
    }
    this.clientSeq = Math.max(this.clientSeq, confirmed);
    this.sentSeq = confirmed;
    this.live = true;
    this.resumeControlId = null;
    record.resumes += 1;
    this.flush();
    $("drop").disabled = false;
    showState("resumed");
  }

  // The user speaks over the answer (or the server cleared it): silence now, and tell the
  // server how much was heard, which is all the conversation keeps of an interrupted answer.
  bargeIn() {
    for (const responseId of this.player.stopAll()) record.interrupted.push(responseId);
    this.acknowledgePlayback();
  }

  audioDelta(event) {
    this.player.enqueue(event.response_id, event.item_id, decodePcm16(event.delta));
  }

  responseDone(event) {
    const response = event.response;
    record.responses[response.id] = response.status;
    const ledger = this.player.ledgers.get(response.id);
    record.audioMs[response.id] = ledger ? Math.floor((ledger.samples * 1000) / RATE) : 0;
    if (response.status !== "completed") {
      this.player.stopResponse(response.id);
      const item = response.output && response.output[0];
      if (item) transcriptEntry("assistant", item.id).classList.add("interrupted");
    }
  }

  acknowledged(event) {
    record.acknowledged.push({ response_id: event.response_id, played_ms: event.played_ms,
      playback: event.playback });
    const heard = event.playback;
    $("played").textContent = `${heard.played_ms} of ${heard.generated_ms} ms`
      + ` (response ${event.response_id})`;
  }

  error(event) {
    const error = event.error || {};
    this.lastErrorCode = error.code || null;
    showError(`${error.code || "error"}: ${error.message || ""}`);
  }

  terminal(event) {
    this.finish(`${event.type} (${event.reason})`);
  }

  // ---- losing and resuming the connection

  // The "drop connection" button: the socket goes at once, without session.close (code 4000:
  // the session keeps its full grace), and the session resumes on a new socket.
  drop() {
    if (this.ws === null || this.sessionId === null || this.ended) return;
    const ws = this.ws;
    ws.onmessage = null; // anything still arriving on it is replayed on the new one
    ws.onclose = null;
    ws.close(CLOSE_KEEP_SESSION, "dropped by the page");
    this.ws = null;
    this.startResuming();
  }

  lost(ws, closed) {
    if (ws !== this.ws || this.ended) return;
    const wasAttached = this.live; // else it was a resume still waiting for its answer
    this.ws = null;
    this.live = false;
    if (this.sessionId === null) {
      const why = closed.code === 1006
        ? "the gateway refused the connection (a wrong or missing API key?) or is unreachable"
        : `closed ${closed.code} ${closed.reason}`;
      this.finish(`could not open a session: ${why}`);
    } else if (closed.code === 1000 || closed.code === 1008
               || FATAL_RESUME_CODES.has(this.lastErrorCode)) {
      this.finish(`connection closed ${closed.code} ${closed.reason || this.lastErrorCode || ""}`);
    } else if (wasAttached) {
      this.startResuming();
    } else {
      this.retryResume();
    }
  }

  startResuming() {
    this.live = false;
    $("drop").disabled = true;
    showState("resuming");
    this.resumeDeadline = performance.now() + RESUME_DEADLINE_MS;
    // One id for this resume, kept across its tries: a try whose answer was lost is answered
    // again the same way, and a late copy of an earlier try cannot take the session back.
    this.resumeControlId = randomId();
    this.resumeAttempt = 0;
    this.resumeOnce();
  }

  resumeOnce() {
    this.resumeAttempt += 1;
    this.lastErrorCode = null;
    this.dial({ type: "session.resume", session_id: this.sessionId,
      resume_token: this.resumeToken, last_received_server_event_seq: this.lastSeq,
      control_id: this.resumeControlId, attempt: this.resumeAttempt });
  }

  retryResume() {
    const backoff = Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** this.resumeAttempt);
    const pause = Math.random() * backoff; // full jitter
    if (performance.now() + pause > this.resumeDeadline) {
      this.finish("could not resume the session within 30 s");
      return;
    }
    setTimeout(() => { if (!this.ended) this.resumeOnce(); }, pause);
  }

  // ---- ending

  end() {
    this.command({ type: "session.close", reason: "client_close" });
  }

  finish(why) {
    if (this.ended) return;
    this.ended = true;
    this.live = false;
    for (const timer of this.timers) clearInterval(timer);
    if (this.closeMicrophone !== null) this.closeMicrophone();
    if (this.player !== null) this.player.stopAll();
    if (this.ws !== null) {
      this.ws.onclose = null;
      this.ws.close();
    }
    $("drop").disabled = true;
    $("end").disabled = true;
    $("start").disabled = false;
    if (!why.startsWith("session.closed")) showError(`session ended: ${why}`);
    showState("ended");
  }
}

const HANDLERS = {
  "session.created": Talk.prototype.created,
  "session.resumed": Talk.prototype.resumed,
  "session.resync_required"(event) {
    this.lastSeq = event.replay_from - 1;
    showError(`events were lost (${event.reason}); going on from ${event.replay_from}`);
  },
  "session.replaced"() { this.finish("another connection resumed this session"); },
  "session.closed": Talk.prototype.terminal,
  "session.expired": Talk.prototype.terminal,
  error: Talk.prototype.error,
  // Barge-in: the user speaks over the answer, so it stops now; the server cancels it.
  "input_audio_buffer.speech_started": Talk.prototype.bargeIn,
  "output_audio_buffer.cleared": Talk.prototype.bargeIn,
  "conversation.item.input_audio_transcription.completed"(event) {
    setTranscript("user", event.item_id, event.transcript);
  },
  "conversation.item.input_audio_transcription.failed"(event) {
    setTranscript("user", event.item_id, "(not understood)");
  },
  "response.output_audio.delta": Talk.prototype.audioDelta,
  "response.output_audio_transcript.delta"(event) {
    setTranscript("assistant", event.item_id, event.delta, { append: true });
  },
  "response.output_audio_transcript.done"(event) {
    setTranscript("assistant", event.item_id, event.transcript);
  },
  "response.output_text.done"(event) {
    setTranscript("assistant", event.item_id, event.text);
  },
  "response.done": Talk.prototype.responseDone,
  "playback.acknowledged": Talk.prototype.acknowledged,
};

// ------------------------------------------------------------------ wiring

let talk = null;

// A key may come in the fragment (#key=ek_...), which no server ever sees; it is taken out
// of the address bar at once.
function takeKeyFromFragment() {
  const key = new URLSearchParams(location.hash.slice(1)).get("key");
  if (key === null) return;
  $("key").value = key;
  history.replaceState(null, "", location.pathname + location.search);
}

function wire() {
  takeKeyFromFragment();
  window.addEventListener("hashchange", takeKeyFromFragment);
  $("controls").addEventListener("submit", async (submitted) => {
    submitted.preventDefault();
    $("start").disabled = true;
    resetRecord();
    $("errors").replaceChildren();
    $("transcript").replaceChildren();
    talk = new Talk($("key").value.trim());
    try {
      await talk.start();
    } catch (failure) {
      talk.finish(`could not start: ${failure.message || failure}`);
    }
  });
  $("drop").addEventListener("click", () => talk && talk.drop());
  $("end").addEventListener("click", () => talk && talk.end());
}

wire();

// For the browser test that drives a Player on a silent (offline) context.
export { Player };
