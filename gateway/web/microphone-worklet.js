// The microphone, as the gateway wants it: mono pcm16 at 24 kHz, in 40 ms chunks.
//
// Runs on the audio rendering thread. The context runs at the device's rate (often 48 kHz,
// sometimes 44.1 kHz or 16 kHz); each input sample is low-pass filtered below the new Nyquist
// rate (so downsampling does not fold high frequencies into speech), then read at 24 kHz by
// linear interpolation. Chunks go to the page as transferred Int16Array buffers.

const TARGET_RATE = 24000;
const CHUNK_SAMPLES = 960; // 40 ms at 24 kHz
const FILTER_TAPS = 31;

// A Hann-windowed sinc low-pass with its cutoff at `cutoff` cycles per sample, unit DC gain.
function lowPassTaps(cutoff) {
  const taps = new Float32Array(FILTER_TAPS);
  const middle = (FILTER_TAPS - 1) / 2;
  let sum = 0;
  for (let i = 0; i < FILTER_TAPS; i++) {
    const x = i - middle;
    const sinc = x === 0 ? 2 * cutoff : Math.sin(2 * Math.PI * cutoff * x) / (Math.PI * x);
    const window = 0.5 - 0.5 * Math.cos((2 * Math.PI * i) / (FILTER_TAPS - 1));
    taps[i] = sinc * window;
    sum += taps[i];
  }
  for (let i = 0; i < FILTER_TAPS; i++) taps[i] /= sum;
  return taps;
}

class MicrophoneProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    // `sampleRate` is the context's rate, a global of the worklet scope.
    this.step = sampleRate / TARGET_RATE; // input samples per output sample
    // Downsampling only: at or below 24 kHz there is nothing above the new Nyquist rate.
    this.taps = this.step > 1 ? lowPassTaps(0.45 / this.step) : null;
    this.history = new Float32Array(FILTER_TAPS);
    this.historyAt = 0;
    this.previous = 0; // the last filtered input sample
    this.position = 1; // where the next output sample lies after `previous`, in input samples
    this.chunk = new Int16Array(CHUNK_SAMPLES);
    this.filled = 0;
  }

  filter(sample) {
    if (this.taps === null) return sample;
    this.history[this.historyAt] = sample;
    let sum = 0;
    let at = this.historyAt;
    for (let i = 0; i < FILTER_TAPS; i++) {
      sum += this.taps[i] * this.history[at];
      at = at === 0 ? FILTER_TAPS - 1 : at - 1;
    }
    this.historyAt = (this.historyAt + 1) % FILTER_TAPS;
    return sum;
  }

  emit(sample) {
    const clipped = Math.max(-1, Math.min(1, sample));
    this.chunk[this.filled++] = Math.round(clipped * 32767);
    if (this.filled === CHUNK_SAMPLES) {
      this.port.postMessage(this.chunk, [this.chunk.buffer]);
      this.chunk = new Int16Array(CHUNK_SAMPLES);
      this.filled = 0;
    }
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true; // no input connected yet
    const frames = channels[0].length;
    for (let i = 0; i < frames; i++) {
      let mixed = 0;
      for (const channel of channels) mixed += channel[i];
      const current = this.filter(mixed / channels.length);
      // Every output sample between the previous input sample and this one.
      while (this.position <= 1) {
        this.emit(this.previous + (current - this.previous) * this.position);
        this.position += this.step;
      }
      this.position -= 1;
      this.previous = current;
    }
    return true;
  }
}

registerProcessor("microphone-24k", MicrophoneProcessor);
