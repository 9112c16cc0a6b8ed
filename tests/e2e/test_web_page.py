"""The browser page in headless Chromium on a real stack (issue 14 acceptance): a fake
microphone speaks a Piper sentence, the cascade answers, the page plays and acknowledges the
answer, and a dropped connection resumes with every event once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import urllib.request
import wave
from collections.abc import Iterator
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.stack import Proc, Stack, log_dir
from tests.worker.speech import normalize, padded, synthesize

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SENTENCE = "The quick brown fox jumps over the lazy dog."
# Chromium loops the file: the sentence, then silence long enough for the answer to play out
# before the next loop speaks again (which would be a barge-in).
MIC_RATE = 48_000
SILENCE_AFTER_S = 14.0
# ...and a loop whose next question comes while the answer (longer than it) still plays.
BARGE_IN_SILENCE_S = 1.0
INSTALL = "apt-get install -y chromium chromium-driver"
#: Set to write the quickstart's screenshot (DOCS_SCREENSHOT) as well as the log folder's.
DOCS_SCREENSHOT_VARIABLE = "DUPLEX_WRITE_DOCS_SCREENSHOT"
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "getting-started" / "web-page.png"


def browser_binaries() -> tuple[str, str]:
    """Debian's chromium and its chromedriver; the test fails (never skips) without them."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail(f"the browser test needs Debian's chromium and chromedriver: {INSTALL}",
                    pytrace=False)
    return chromium, driver


def write_microphone_wav(path: Path, silence_after_s: float) -> None:
    """The fake microphone's input: Piper speaking SENTENCE, 16-bit mono."""
    speech, rate = synthesize(SENTENCE, MIC_RATE)
    audio = padded(speech, rate, before_s=0.5, after_s=silence_after_s)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes())


@pytest.fixture
def page_stack(stack: Stack) -> Stack:
    """The stack with the page on (through its variable, as `dev` sets it), and a heartbeat TTL
    of 3 s for its workers (2.75 s of slack at the stack's 0.25 s beats, not 0.75): Chromium
    shares this machine's cores with them, and these tests are about the page, not about how
    soon a starved worker is declared lost (the failover tests are)."""
    stack.env["DUPLEX_GATEWAY_WEB_PAGE"] = "true"
    stack.env["DUPLEX_GATEWAY_HEARTBEAT_TTL_S"] = "3.0"
    return stack


@pytest.fixture
def page_gateway(page_stack: Stack) -> Proc:
    """A gateway serving the page, and a cascade worker."""
    stack = page_stack
    gateway = stack.gateway()
    stack.worker(slots=2, backend="cascade")
    return gateway


@contextlib.contextmanager
def headless_chromium(silence_after_s: float) -> Iterator[webdriver.Chrome]:
    """Headless Chromium whose microphone loops the Piper WAV, its console log kept."""
    binary, driver_path = browser_binaries()
    with tempfile.TemporaryDirectory(prefix="duplex-chromium-") as scratch:
        wav = Path(scratch) / "question.wav"
        write_microphone_wav(wav, silence_after_s)
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                         f"--use-file-for-fake-audio-capture={wav}",
                         "--autoplay-policy=no-user-gesture-required",
                         f"--user-data-dir={Path(scratch) / 'profile'}",
                         "--window-size=900,1000"):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # Its log stays in the scratch folder: it quotes the URLs opened, fragments (keys)
        # included, which have no place in the scanned process logs.
        service = Service(executable_path=driver_path,
                          log_output=str(Path(scratch) / "chromedriver.log"))
        browser = webdriver.Chrome(options=options, service=service)
        try:
            yield browser
        finally:
            browser.quit()


@pytest.fixture
def chromium() -> Iterator[webdriver.Chrome]:
    """Chromium whose microphone leaves the answer time to play out between questions."""
    with headless_chromium(SILENCE_AFTER_S) as browser:
        yield browser


def page_record(browser: webdriver.Chrome) -> dict[str, Any]:
    """What the page saw (window.duplexPage): seqs, states, acks, responses, transcripts."""
    seen: dict[str, Any] = browser.execute_script("return window.duplexPage")
    return seen


def wait_until(browser: webdriver.Chrome, what: str, condition: Any, timeout: float) -> Any:
    """Wait (a deadline, no sleep) until ``condition(record)`` is truthy; returns its value."""
    return WebDriverWait(browser, timeout, poll_frequency=0.1).until(
        lambda b: condition(page_record(b)), message=f"timed out waiting for {what}")


def heard_the_sentence(text: str) -> bool:
    """Whisper heard SENTENCE: every word in order, but for at most one."""
    said, got = normalize(SENTENCE).split(), normalize(text).split()
    same = sum(block.size for block in SequenceMatcher(None, said, got).get_matching_blocks())
    return same >= len(said) - 1


def user_turns(seen: dict[str, Any]) -> list[str]:
    return [t["text"] for t in seen["transcripts"] if t["speaker"] == "user"]


def fully_played(seen: dict[str, Any]) -> set[str]:
    """Completed responses whose whole answer (all the audio the page received for it) the
    page played and the server acknowledged, within one acknowledgement period."""
    return {ack["response_id"] for ack in seen["acknowledged"]
            if seen["responses"].get(ack["response_id"]) == "completed"
            and seen["audioMs"][ack["response_id"]] > 0
            and ack["played_ms"] >= seen["audioMs"][ack["response_id"]] - 50}


def console_errors(browser: webdriver.Chrome) -> list[str]:
    """The console's errors since the last call (uncaught exceptions, failed loads, CSP)."""
    entries: list[dict[str, Any]] = browser.get_log("browser")  # type: ignore[no-untyped-call]
    return [entry["message"] for entry in entries if entry["level"] == "SEVERE"]


def save_screenshot(browser: webdriver.Chrome) -> None:
    browser.save_screenshot(str(log_dir() / "web-page.png"))
    if os.environ.get(DOCS_SCREENSHOT_VARIABLE):
        browser.save_screenshot(str(DOCS_SCREENSHOT))


def test_talk_play_acknowledge_drop_and_resume_in_chromium(
        page_gateway: Proc, chromium: webdriver.Chrome) -> None:
    """The page hears the spoken sentence (user transcript), plays the answer to its end and
    the gateway acknowledges it; the drop button resumes the session (resuming, then resumed),
    the conversation goes on, and the server_event_seq values received are 1, 2, 3, ...
    across the drop, none missing or repeated; no console error, no error shown."""
    chromium.get(page_gateway.http_url + "/")
    chromium.find_element(By.ID, "start").click()
    wait_until(chromium, "the session to open", lambda r: "connected" in r["states"], 30)
    wait_until(chromium, "the user's words in the transcript",
               lambda r: any(heard_the_sentence(t) for t in user_turns(r)), 120)
    wait_until(chromium, "an answer played out and acknowledged", fully_played, 60)

    chromium.find_element(By.ID, "drop").click()
    wait_until(chromium, "the resumed session", lambda r: r["states"][-1] == "resumed", 30)
    resumed = page_record(chromium)
    assert resumed["states"][-2:] == ["resuming", "resumed"]
    turns = len(user_turns(resumed))
    # The microphone file loops: the next turn, heard and answered on the new connection.
    wait_until(chromium, "a turn after the resume",
               lambda r: len(user_turns(r)) > turns and len(fully_played(r)) > 1, 120)
    save_screenshot(chromium)

    seen = page_record(chromium)
    assert seen["resumes"] == 1
    assert seen["seqs"] == list(range(1, len(seen["seqs"]) + 1)), seen["seqs"]
    assert seen["errors"] == []
    assert console_errors(chromium) == []
    chromium.find_element(By.ID, "end").click()
    wait_until(chromium, "the session to end", lambda r: r["states"][-1] == "ended", 30)
    assert page_record(chromium)["errors"] == []
    assert console_errors(chromium) == []


API_KEY = "page-test-key"


def mint_client_secret(gateway: Proc, api_key: str) -> str:
    """``POST /v1/realtime/client_secrets`` as the browser guide shows it; the ``ek_...`` value."""
    request = urllib.request.Request(
        gateway.http_url + "/v1/realtime/client_secrets", method="POST",
        data=json.dumps({"expires_after": {"anchor": "created_at", "seconds": 600},
                         "session": {"type": "realtime"}}).encode(),
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        value: str = json.load(answer)["value"]
    return value


def test_with_api_keys_a_client_secret_in_the_fragment_opens_a_session(
        page_stack: Stack, chromium: webdriver.Chrome) -> None:
    """With API keys on, a client secret passed in the URL's fragment (never the query
    string) opens a session through the browser subprotocol, and is taken out of the address
    bar; a wrong key ends the page's session with a message saying the connection was refused.
    On the loopback worker, so the page's session.update suits a backend other than the
    cascade too (no error shown)."""
    stack = page_stack
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = API_KEY
    gateway = stack.gateway()
    stack.worker(slots=2)
    secret = mint_client_secret(gateway, API_KEY)
    chromium.get(f"{gateway.http_url}/#key={secret}")
    assert chromium.execute_script("return location.hash") == ""
    chromium.find_element(By.ID, "start").click()
    wait_until(chromium, "the session to open", lambda r: "connected" in r["states"], 30)
    wait_until(chromium, "session.updated", lambda r: len(r["seqs"]) >= 1, 30)
    assert page_record(chromium)["errors"] == []
    assert console_errors(chromium) == []
    chromium.find_element(By.ID, "end").click()
    wait_until(chromium, "the session to end", lambda r: r["states"][-1] == "ended", 30)

    chromium.get(f"{gateway.http_url}/#key=not-a-key")
    chromium.find_element(By.ID, "start").click()
    ended = wait_until(chromium, "the refused session to end",
                       lambda r: r["states"][-1] == "ended" and r, 30)
    assert "connected" not in ended["states"]
    assert any("refused the connection" in error for error in ended["errors"]), ended["errors"]


def test_an_answer_cut_before_it_is_heard_is_acknowledged_at_zero(
        page_stack: Stack, chromium: webdriver.Chrome) -> None:
    """The page's Player on an offline context (its clock stands still): an answer queued and
    cut before its first sample plays is due a ``playback.ack`` of 0 ms, once; an answer never
    cut and not yet heard is not due one. Without the 0 ms ack the server would keep the whole
    unheard answer in the conversation (an interrupted answer keeps what was acknowledged)."""
    gateway = page_stack.gateway()
    chromium.get(gateway.http_url + "/")
    due = chromium.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import("/web/page.js").then(({ Player }) => {
          const player = new Player(new OfflineAudioContext(1, 24000, 24000));
          const due = () => player.unacknowledged().map((d) => [d.responseId, d.playedMs]);
          player.enqueue("resp_cut", "item_cut", new Float32Array(2400));
          const before = due();
          const cut = player.stopAll();
          player.enqueue("resp_next", "item_next", new Float32Array(2400));
          const after = due();
          for (const d of player.unacknowledged()) player.acknowledged(d.ledger, d.playedMs);
          done({ before, cut, after, again: due() });
        }, (failure) => done({ failure: String(failure) }));
    """)
    assert due == {"before": [], "cut": ["resp_cut"], "after": [["resp_cut", 0]],
                   "again": []}, due
    assert console_errors(chromium) == []


def test_speaking_over_the_answer_stops_its_playback(
        page_gateway: Proc) -> None:
    """Barge-in: the microphone's next question comes while the answer still plays; the page
    silences it at once, drops the rest, and acknowledges only what was heard, so the
    gateway's ledger shows less played than the page received."""
    with headless_chromium(BARGE_IN_SILENCE_S) as browser:
        browser.get(page_gateway.http_url + "/")
        browser.find_element(By.ID, "start").click()
        cut = wait_until(browser, "an answer cut short by the next question",
                         lambda r: r["interrupted"], 120)[0]
        seen = wait_until(browser, "the cut answer acknowledged and done",
                          lambda r: cut in r["responses"] and any(
                              a["response_id"] == cut for a in r["acknowledged"]) and r, 60)
        # 0 ms when the question came before the answer's first sample played (a loaded
        # machine): the page still says so, or the server would keep the unheard answer whole.
        heard = max(a["played_ms"] for a in seen["acknowledged"] if a["response_id"] == cut)
        assert 0 <= heard < seen["audioMs"][cut], (heard, seen["audioMs"], seen["responses"])
        assert seen["errors"] == []
        assert console_errors(browser) == []
