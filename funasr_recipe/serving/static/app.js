"use strict";
const $ = (id) => document.getElementById(id);
// audio: the File to send; decoded: its decoding (a promise); env: the waveform's per-pixel envelope.
const state = { audio: null, decoded: null, buffer: null, env: null, tokens: [], duration: 0, hot: -1,
                rec: null, stopAt: 0 };

// ---------- audio in the browser: decode for drawing, record ----------
async function decode(blob) {
  // An offline context opens no audio device; 16 kHz is plenty for a picture of the wave.
  const ctx = new OfflineAudioContext(1, 1, 16000);
  try { return await ctx.decodeAudioData(await blob.arrayBuffer()); } catch (e) { return null; }
}

// Recording in the browser's own format, as a phone or a web app would send it: MediaRecorder writes
// WebM/Opus in Chrome and Firefox, MP4/AAC in Safari; the server decodes both (serving/upload.py).
async function startRecording() {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1,
    echoCancellation: false, noiseSuppression: false, autoGainControl: false } });
  const recorder = new MediaRecorder(stream);
  const chunks = [];
  recorder.ondataavailable = (e) => { if (e.data.size) chunks.push(e.data); };
  const stopped = new Promise((resolve) => { recorder.onstop = resolve; });
  recorder.start();
  const started = performance.now();
  const timer = setInterval(() => {
    $("rec-time").textContent = `● ${((performance.now() - started) / 1000).toFixed(1)} s`;
  }, 100);
  return { stream, recorder, chunks, stopped, started, timer };
}

async function stopRecording(rec) {
  clearInterval(rec.timer);
  rec.recorder.stop();
  await rec.stopped;
  rec.stream.getTracks().forEach((t) => t.stop());
  const type = rec.recorder.mimeType || "audio/webm";
  const ext = type.includes("mp4") ? "m4a" : type.includes("ogg") ? "ogg" : "webm";
  const seconds = (performance.now() - rec.started) / 1000;
  $("rec-time").textContent = `${seconds.toFixed(1)} s recorded`;
  return new File(rec.chunks, `recording.${ext}`, { type });
}

function setAudio(blob) {
  Object.assign(state, { audio: blob, buffer: null, env: null, duration: 0, tokens: [] });
  const player = $("player");
  if (player.src) URL.revokeObjectURL(player.src);
  player.src = URL.createObjectURL(blob);
  player.hidden = false;
  $("audio-name").textContent = `${blob.name} · ${(blob.size / 1024).toFixed(1)} KiB`;
  $("transcribe").disabled = false;
  state.decoded = decode(blob).then((buffer) => {
    if (state.audio !== blob || !buffer) return;  // another file chosen meanwhile, or undecodable here
    Object.assign(state, { buffer, duration: buffer.duration });
    draw();
  });
  draw();
}

// Min and max of the samples under each pixel column (channel 0), scaled to the clip's peak so that a
// quiet recording still shows its shape; computed once per width, not on every redraw.
function envelope(w) {
  if (state.env && state.env.w === w) return state.env;
  const data = state.buffer.getChannelData(0), lo = new Float32Array(w), hi = new Float32Array(w);
  let peak = 1e-4;
  for (let px = 0; px < w; px++) {
    let a = 0, b = 0;
    const end = Math.floor((px + 1) * data.length / w);
    for (let i = Math.floor(px * data.length / w); i < end; i++) {
      if (data[i] < a) a = data[i]; else if (data[i] > b) b = data[i];
    }
    lo[px] = a; hi[px] = b; peak = Math.max(peak, -a, b);
  }
  return (state.env = { w, lo, hi, peak });
}

// ---------- drawing ----------
const SPAN_COLOURS = ["rgba(36,89,201,.16)", "rgba(224,122,20,.18)"];
const EDGE_COLOURS = ["#2459c9", "#c96a12"];

function draw() {
  const canvas = $("waveform");
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const labelH = 34, axisH = 20, top = labelH, bottom = h - axisH, mid = (top + bottom) / 2;
  const duration = state.duration;
  // Read by the test to probe the drawing: where the span band starts, the time axis' length.
  Object.assign(canvas.dataset, { spans: "0", spanTop: String(top), duration: String(duration) });
  g.font = "12px system-ui, sans-serif";
  if (!duration) {
    g.fillStyle = "#a3adba"; g.textAlign = "center";
    const note = state.audio ? "The browser could not decode this file" : "Choose or record audio";
    g.fillText(note, w / 2, h / 2);
    return;
  }
  const x = (t) => (t / duration) * w;
  // Token spans under the wave, labels above it in two staggered rows so neighbours do not collide.
  // A Paraformer's tokens come without times (start/end null): listed in the table, not drawn.
  const timed = state.tokens.filter((tok) => tok.start != null && tok.end != null);
  state.tokens.forEach((tok, i) => {
    if (tok.start == null || tok.end == null) return;
    const x0 = x(tok.start), x1 = Math.max(x(tok.end), x0 + 2);
    g.fillStyle = i === state.hot ? "rgba(36,89,201,.35)" : SPAN_COLOURS[i % 2];
    g.fillRect(x0, top, x1 - x0, bottom - top);
    g.fillStyle = EDGE_COLOURS[i % 2];
    g.fillRect(x0, top, 1, bottom - top);
    const label = tok.token.replace(/\u2581/g, "") || tok.token;
    g.textAlign = "center";
    g.fillText(label, Math.min(Math.max((x0 + x1) / 2, 20), w - 20), i % 2 ? 30 : 14);
  });
  canvas.dataset.spans = String(timed.length);
  g.fillStyle = "#34425a";
  if (state.buffer) {
    const env = envelope(w), half = ((bottom - top) / 2 - 2) / env.peak;
    for (let px = 0; px < w; px++) {
      g.fillRect(px, mid - env.hi[px] * half, 1, Math.max(1, (env.hi[px] - env.lo[px]) * half));
    }
  }
  g.fillStyle = "#dde3ea"; g.fillRect(0, bottom, w, 1);
  // Time axis: a tick every 0.1/0.2/0.5/1/2/5 s, whichever leaves at least 60 px between ticks.
  const step = [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60].find((s) => x(s) >= 60) || 120;
  g.fillStyle = "#5d6b7e"; g.textAlign = "center";
  for (let t = 0; t <= duration + 1e-9; t += step) {
    g.fillRect(x(t), bottom, 1, 4);
    g.fillText(`${+t.toFixed(2)} s`, Math.min(Math.max(x(t), 16), w - 16), h - 4);
  }
}

// ---------- results ----------
function fmtSeconds(s) { return s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(2)} s`; }

function clearResult() {
  $("text").textContent = ""; $("tags").replaceChildren(); $("error").hidden = true;
  $("error").textContent = "";
  for (const id of ["duration", "processing", "rtf"]) $(id).textContent = "–";
  $("tokens").tBodies[0].replaceChildren();
  $("no-tokens").hidden = false;
  state.tokens = []; state.hot = -1;
  draw();
}

function showResult(r) {
  $("text").textContent = r.text || "";
  const tags = [["Language", r.language], ["Emotion", r.emotion], ["Event", r.event]]
    .filter(([, v]) => v).map(([k, v]) => {
      const el = document.createElement("span"); el.className = "tag"; el.dataset.kind = k.toLowerCase();
      el.dataset.value = v;
      const b = document.createElement("b"); b.textContent = k; el.append(b, v); return el;
    });
  $("tags").replaceChildren(...tags);
  $("duration").textContent = fmtSeconds(r.duration);
  $("processing").textContent = fmtSeconds(r.processing_time);
  $("rtf").textContent = r.duration ? (r.processing_time / r.duration).toFixed(3) : "–";
  state.tokens = r.tokens || [];
  if (!state.duration) state.duration = r.duration;  // undecodable here: spans on the server's time axis
  const rows = state.tokens.map((t, i) => {
    const tr = document.createElement("tr");
    tr.dataset.index = i; tr.title = "Play this token";
    const timed = t.start != null && t.end != null, time = (f) => (timed ? f() : "–");
    const cells = [[i + 1, "num"], [t.token, "tok"], [time(() => t.start.toFixed(2)), "num"],
                   [time(() => t.end.toFixed(2)), "num"],
                   [time(() => ((t.end - t.start) * 1000).toFixed(0)), "num"]];
    for (const [v, cls] of cells) {
      const td = document.createElement("td"); td.className = cls; td.textContent = v; tr.append(td);
    }
    return tr;
  });
  $("tokens").tBodies[0].replaceChildren(...rows);
  $("no-tokens").hidden = rows.length > 0;
  draw();
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

// Every refusal is OpenAI's error shape: {error: {message, type, code, param}}.
function detailText(body, status) {
  const e = body && body.error;
  if (e && typeof e.message === "string") return e.message;
  return `HTTP ${status}`;
}

async function transcribe(ev) {
  ev.preventDefault();
  if (!state.audio) return;
  clearResult();
  const form = new FormData();
  form.append("file", state.audio, state.audio.name || "audio.wav");
  form.append("language", $("language").value);
  form.append("itn", $("itn").checked ? "true" : "false");
  $("transcribe").disabled = true;
  $("result").dataset.state = "busy";
  $("status").textContent = "Transcribing…";
  try {
    const key = $("api-key").value.trim();  // never stored: typed for this page's life only
    const headers = key ? { Authorization: `Bearer ${key}` } : {};
    const res = await fetch("v1/transcriptions", { method: "POST", body: form, headers });
    const body = await res.json().catch(() => null);
    if (res.ok && body) {
      await state.decoded;  // the spans go on this file's wave, not on the previous one's time axis
      showResult(body);
      $("result").dataset.state = "done";
      $("status").textContent = `Done in ${fmtSeconds(body.processing_time)}.`;
      return;
    }
    let msg = detailText(body, res.status);
    if (res.status === 503) {
      const after = res.headers.get("Retry-After");
      msg = `Server busy: ${msg}` + (after ? ` Try again in ${after} s.` : "");
    }
    showError(msg);
  } catch (e) {
    showError(`Could not reach the server: ${e.message}`);
  } finally {
    $("transcribe").disabled = false;
  }
  $("result").dataset.state = "error";
  $("status").textContent = "";
}

// ---------- wiring ----------
$("file").addEventListener("change", (e) => {
  if (e.target.files[0]) { clearResult(); setAudio(e.target.files[0]); }
});
$("form").addEventListener("submit", transcribe);
$("record").addEventListener("click", async () => {
  const btn = $("record");
  if (state.rec) {
    const rec = state.rec; state.rec = null;
    btn.textContent = "Record"; btn.setAttribute("aria-pressed", "false");
    clearResult();
    setAudio(await stopRecording(rec));
    return;
  }
  try {
    state.rec = await startRecording();
    btn.textContent = "Stop"; btn.setAttribute("aria-pressed", "true");
    $("file").value = "";
  } catch (e) {
    showError(`Microphone unavailable: ${e.message}`);
  }
});
$("tokens").addEventListener("mouseover", (e) => {
  const tr = e.target.closest("tbody tr");
  state.hot = tr ? +tr.dataset.index : -1; draw();
});
$("tokens").addEventListener("mouseleave", () => { state.hot = -1; draw(); });
$("tokens").addEventListener("click", (e) => {
  const tr = e.target.closest("tbody tr");
  const tok = tr && state.tokens[+tr.dataset.index], player = $("player");
  if (!tok || tok.start == null) return;
  clearTimeout(state.stopAt);  // a click on another token before this one ends plays that one in full
  player.currentTime = tok.start; player.play();
  state.stopAt = setTimeout(() => player.pause(), Math.max(150, (tok.end - tok.start) * 1000));
});
window.addEventListener("resize", draw);
fetch("health").then((r) => r.json().then((b) => [r.ok, b])).then(([ok, b]) => {
  const el = $("health");
  el.dataset.state = ok && b.status === "ok" ? "ok" : "down";
  const about = [b.family, b.file].filter((v) => typeof v === "string").join(", ");
  if (Array.isArray(b.languages)) {  // only the prompts this model takes (a Paraformer takes none)
    for (const opt of [...$("language").options]) if (!b.languages.includes(opt.value)) opt.remove();
    $("language").disabled = $("language").options.length < 2;
  }
  $("key-field").hidden = b.auth !== "bearer";  // the server asks for a key: offer the field
  el.textContent = ok && b.status === "ok" ? `Ready · ${b.model || "model"}${about ? ` (${about})` : ""}`
    : `Server: ${b.status || "not ready"}`;
}).catch(() => { $("health").dataset.state = "down"; $("health").textContent = "Server unreachable"; });
draw();
