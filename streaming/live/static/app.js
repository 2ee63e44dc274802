// alaya-flash live page: shows the frames the server pushes, sends commands and held keys.
// Protocol: streaming/live/protocol.py (docs/live.md). window.alaya exposes counters for tests.
"use strict";

const $ = (id) => document.getElementById(id);
const HISTORY = 400; // frame records kept for inspection (kind, epoch, index, digest)
const alaya = (window.alaya = { connected: false, frames: 0, passes: 0, last: null, lastPasses: null,
                                 history: [], status: null, errors: [], clientFps: 0, rttMs: null,
                                 displayMs: [], video: "jpeg", videoNote: "", rtcFrames: 0, rtcMatched: 0 });
const DISPLAY_SAMPLES = 512; // capture -> display latencies kept (ms; same clock only on one machine)
let ws = null;
let recording = false;

function send(obj) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(obj));
}

async function digest(bytes) {
  if (window.crypto && crypto.subtle) {
    const h = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
    return Array.from(h.slice(0, 12), (b) => b.toString(16).padStart(2, "0")).join("");
  }
  let h = 2166136261; // FNV-1a when there is no SubtleCrypto
  for (const b of bytes) h = Math.imul(h ^ b, 16777619) >>> 0;
  return h.toString(16) + ":" + bytes.length;
}

const arrivals = [];
async function onFrame(buf) {
  const view = new DataView(buf);
  const n = view.getUint32(0);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, n)));
  const jpeg = new Uint8Array(buf, 4 + n);
  const record = { kind: header.kind, epoch: header.epoch, index: header.index, player: header.player,
                   digest: await digest(jpeg) };
  alaya.history.push(record);
  if (alaya.history.length > HISTORY) alaya.history.shift();
  if (header.kind === "rgb" && alaya.video === "webrtc") return; // overlap while the server switches
  const canvas = header.kind === "passes" ? $("passes") : $("view");
  const bitmap = await createImageBitmap(new Blob([jpeg], { type: "image/jpeg" }));
  if (canvas.width !== bitmap.width || canvas.height !== bitmap.height) {
    canvas.width = bitmap.width;
    canvas.height = bitmap.height;
  }
  canvas.getContext("2d").drawImage(bitmap, 0, 0);
  bitmap.close();
  if (header.kind === "passes") {
    alaya.passes += 1;
    alaya.lastPasses = record;
    return;
  }
  alaya.frames += 1;
  alaya.last = record;
  if (typeof header.captured_ms === "number") { // shown at the next paint: capture -> display
    requestAnimationFrame(() => {
      alaya.displayMs.push(performance.timeOrigin + performance.now() - header.captured_ms);
      if (alaya.displayMs.length > DISPLAY_SAMPLES) alaya.displayMs.shift();
    });
  }
  const now = performance.now();
  arrivals.push(now);
  if (arrivals.length > 64) arrivals.shift();
}

// ---- WebRTC video (streaming/live/webrtc.py): the server offers, the page answers over /ws ----------
// ?video=jpeg keeps the JPEG frames; ?video=webrtc (or nothing) tries WebRTC when the server has it and
// falls back to JPEG when it fails. Each frame's capture time comes on the data channel "frames",
// keyed by pts (the capture time on the 90 kHz RTP clock); the displayed frame's RTP timestamp is
// pts + one unknown per-stream constant, found as the one offset every recent frame agrees on.
const VIDEO_CHOICE = new URLSearchParams(location.search).get("video"); // "webrtc" | "jpeg" | null (auto)
const RTC_FIRST_FRAME_MS = 15000; // no WebRTC frame by then: back to JPEG
const METAS = 256; // frame metadata kept for matching
let rtc = null; // { pc, metas: Map(pts -> meta), offsets: Set | null, offset: number | null, agreed, timer }

function setVideo(mode, note = "") {
  alaya.video = mode;
  alaya.videoNote = note;
  $("video-mode").textContent = mode === "webrtc" ? "WebRTC" : "JPEG over WebSocket";
  $("video-mode").title = note;
  $("rtc").hidden = mode !== "webrtc";
  $("view").hidden = mode === "webrtc";
  $("switch-video").textContent = mode === "webrtc" ? "Use JPEG" : "Use WebRTC";
}

function closeRtc() {
  if (!rtc) return;
  clearTimeout(rtc.timer);
  rtc.pc.close();
  rtc = null;
}

function fallback(why) { // WebRTC failed or was refused: JPEG frames (the server resumes them)
  if (rtc) send({ type: "webrtc", on: false });
  closeRtc();
  setVideo("jpeg", `WebRTC: ${why}`);
}

function startRtc() {
  closeRtc();
  rtc = { pc: null, metas: new Map(), offsets: null, offset: null, agreed: 0,
          timer: setTimeout(() => fallback(`no frame within ${RTC_FIRST_FRAME_MS / 1000} s`), RTC_FIRST_FRAME_MS) };
  send({ type: "webrtc", on: true });
}

async function onOffer(sdp) {
  if (!rtc || rtc.pc) return;
  const pc = (rtc.pc = new RTCPeerConnection({ iceServers: [] })); // no STUN/TURN: this machine only
  pc.ontrack = (ev) => {
    const video = $("rtc");
    video.srcObject = ev.streams[0] || new MediaStream([ev.track]);
    video.play().catch(() => {});
    video.requestVideoFrameCallback(onVideoFrame);
  };
  pc.ondatachannel = (ev) => { ev.channel.onmessage = (m) => onMeta(JSON.parse(m.data)); };
  pc.onconnectionstatechange = () => { if (pc.connectionState === "failed") fallback("the connection failed"); };
  try {
    await pc.setRemoteDescription({ type: "offer", sdp });
    await pc.setLocalDescription(await pc.createAnswer());
    await new Promise((done) => { // every candidate in the answer (the server takes no trickled ones)
      if (pc.iceGatheringState === "complete") return done();
      pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === "complete") done(); };
      setTimeout(done, 3000);
    });
    if (rtc && rtc.pc === pc) send({ type: "answer", sdp: pc.localDescription.sdp });
  } catch (err) {
    fallback(`the offer could not be answered (${err.name})`);
  }
}

function onMeta(meta) {
  if (!rtc) return;
  rtc.metas.set(meta.pts, meta);
  if (rtc.metas.size > METAS) rtc.metas.delete(rtc.metas.keys().next().value);
}

function matchRtp(rtp) { // the frame metadata of a displayed frame, by its RTP timestamp
  if (typeof rtp !== "number") return null;
  if (rtc.offset === null) { // candidate offsets, intersected frame after frame until one is left
    const mine = new Set(Array.from(rtc.metas.keys(), (pts) => (rtp - pts) >>> 0));
    rtc.offsets = rtc.offsets === null ? mine : new Set([...rtc.offsets].filter((o) => mine.has(o)));
    rtc.agreed += 1;
    if (rtc.offsets.size === 0) { rtc.offsets = null; rtc.agreed = 0; } // a frame without its metadata: start over
    else if (rtc.offsets.size === 1 && rtc.agreed >= 5) rtc.offset = [...rtc.offsets][0];
    if (rtc.offset === null) return null;
  }
  return rtc.metas.get((rtp - rtc.offset) >>> 0) || null;
}

function onVideoFrame(now, info) {
  const video = $("rtc");
  if (!rtc || !video.srcObject) return;
  const shown = performance.timeOrigin + performance.now();
  if (alaya.video !== "webrtc") { clearTimeout(rtc.timer); setVideo("webrtc"); }
  alaya.rtcFrames += 1;
  alaya.frames += 1;
  arrivals.push(performance.now());
  if (arrivals.length > 64) arrivals.shift();
  const meta = matchRtp(info.rtpTimestamp);
  if (meta) {
    alaya.rtcMatched += 1;
    const record = { kind: "video", epoch: meta.epoch, index: meta.index, player: meta.player, digest: null };
    alaya.last = record;
    alaya.history.push(record);
    if (alaya.history.length > HISTORY) alaya.history.shift();
    alaya.displayMs.push(shown - meta.captured_ms);
    if (alaya.displayMs.length > DISPLAY_SAMPLES) alaya.displayMs.shift();
  }
  video.requestVideoFrameCallback(onVideoFrame);
}

function receiveFps() { // frames/s over the last 64 frames (at most 10 s), measured up to now
  const now = performance.now();
  while (arrivals.length && now - arrivals[0] > 10000) arrivals.shift();
  return arrivals.length > 1 ? (1000 * (arrivals.length - 1)) / (now - arrivals[0]) : 0;
}

function showStatus(s) {
  alaya.status = s;
  alaya.clientFps = receiveFps();
  $("state").textContent = s.state;
  $("fps").textContent = `${s.fps.toFixed(1)} (view ${alaya.clientFps.toFixed(1)})`;
  const net = alaya.rttMs == null ? 0 : alaya.rttMs / 2;
  $("latency").textContent = s.latency_ms == null ? "–" : `${Math.round(s.latency_ms + net)} ms`;
  $("dropped").textContent = String(s.dropped);
  $("frames").textContent = String(alaya.frames);
  $("viewers").textContent = String(s.viewers);
  if (s.sessions) { // this page's stream and each engine's, with its FPS
    $("sessions").textContent = String(s.sessions.length);
    $("sessions").title = s.sessions.map((x) => `${x.session} ${x.kind}: ${x.fps.toFixed(1)} FPS`).join("\n");
  }
  $("error").hidden = !s.error;
  $("error").textContent = s.error ? `${s.error} (Start or Reset tries again)` : "";
  recording = !!s.recording;
  $("record").textContent = recording ? "Stop recording" : "Record";
  $("record").classList.toggle("on", recording);
  $("recording").textContent = s.recording ? `recording to ${s.recording}` :
    (s.last_recording ? `saved ${s.last_recording}` : "");
  if (s.preset && $("preset").value !== s.preset) $("preset").value = s.preset;
  $("sun").disabled = !!s.light_problem; // this model's refiner reads no light: the sliders would do nothing
  $("sun-note").textContent = s.light_problem || "";
  if ($("source").value !== s.source) $("source").value = s.source;
}

function onHello(msg) {
  const presets = $("preset");
  presets.replaceChildren(new Option("(custom prompt)", ""));
  for (const name of Object.keys(msg.presets)) presets.add(new Option(name.replace(/_/g, " "), name));
  const sources = $("source");
  sources.replaceChildren();
  for (const name of msg.sources) sources.add(new Option(name === "world" ? "physics world (playable)" : "G-buffer file (looped)", name));
  $("record").hidden = false;
  $("prompt").value = msg.status.prompt;
  const bases = $("light-base"); // the sun sliders' sky, colours and fog: a named light (a lighting preset)
  bases.replaceChildren(new Option("(default light)", ""));
  for (const name of Object.keys(msg.presets)) bases.add(new Option(name.replace(/_/g, " "), name));
  bases.value = msg.status.preset || "";
  const light = msg.status.light;
  $("light-prompt").checked = !light;
  if (light) { showSun(light.sun_azimuth, light.sun_elevation); bases.value = ""; }
  alaya.presets = msg.presets;
  alaya.webrtc = !!msg.webrtc;
  if (msg.webrtc && VIDEO_CHOICE !== "jpeg" && typeof RTCPeerConnection === "function") startRtc();
  else setVideo("jpeg", msg.webrtc ? (VIDEO_CHOICE === "jpeg" ? "chosen (?video=jpeg)" : "this browser has no WebRTC")
                                   : `the server has no WebRTC: ${msg.webrtc_reason}`);
  showStatus({ ...msg.status, dropped: 0, viewers: "–" });
}

function connect() {
  ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => { alaya.connected = true; };
  ws.onclose = () => { alaya.connected = false; closeRtc(); $("state").textContent = "disconnected"; setTimeout(connect, 1000); };
  ws.onmessage = (ev) => {
    if (typeof ev.data !== "string") { onFrame(ev.data); return; }
    const msg = JSON.parse(ev.data);
    if (msg.type === "hello") onHello(msg);
    else if (msg.type === "status") showStatus(msg);
    else if (msg.type === "pong") alaya.rttMs = performance.now() - msg.t;
    else if (msg.type === "offer") onOffer(msg.sdp);
    else if (msg.type === "webrtc" && msg.state === "failed") fallback("the server's connection failed");
    else if (msg.type === "error") {
      alaya.errors.push(msg.message);
      if (alaya.errors.length > 50) alaya.errors.shift();
      if (rtc && /^(webrtc|answer):/.test(msg.message)) fallback(msg.message);
    }
  };
}

// ---- controls -----------------------------------------------------------------------------
$("start").onclick = () => send({ type: "control", action: "start" });
$("pause").onclick = () => send({ type: "control", action: "pause" });
$("reset").onclick = () => send({ type: "control", action: "reset" });
$("record").onclick = () => send({ type: "record", on: !recording });
$("apply").onclick = () => { const text = $("prompt").value.trim(); if (text) send({ type: "prompt", text }); };
$("preset").onchange = () => {
  const name = $("preset").value;
  if (!name) return;
  $("prompt").value = alaya.presets[name];
  send({ type: "preset", name });
};
// The sun: sliders set the session's light (a preset's sky and colours, the sun where the sliders put
// it) from the next chunk on, sent at most every LIGHT_MS while dragging; "from the prompt" hands the
// light back to the prompt (the light head's reading).
const LIGHT_MS = 100;
let lightTimer = null;
function showSun(az, el) {
  $("sun-azimuth").value = az;
  $("sun-elevation").value = el;
  $("sun-azimuth-value").textContent = String(Math.round(az));
  $("sun-elevation-value").textContent = String(Math.round(el));
}
function lightText() {
  const base = $("light-base").value;
  return `${base ? base + "," : ""}az=${$("sun-azimuth").value},el=${$("sun-elevation").value}`;
}
function sendLight() {
  lightTimer = null;
  alaya.light = $("light-prompt").checked ? null : lightText();
  send({ type: "light", light: alaya.light });
}
function moveSun() {
  showSun(Number($("sun-azimuth").value), Number($("sun-elevation").value));
  $("light-prompt").checked = false;
  if (!lightTimer) lightTimer = setTimeout(sendLight, LIGHT_MS);
}
$("sun-azimuth").oninput = moveSun;
$("sun-elevation").oninput = moveSun;
$("light-base").onchange = moveSun;
$("light-prompt").onchange = sendLight;
$("switch-video").onclick = () => { location.search = `?video=${alaya.video === "webrtc" ? "jpeg" : "webrtc"}`; };
$("source").onchange = () => send({ type: "source", name: $("source").value });
$("show-passes").onchange = () => {
  $("passes").hidden = !$("show-passes").checked;
  send({ type: "passes", on: $("show-passes").checked });
};

// Held keys -> one "input" message whenever the set changes (the server applies it every tick).
const held = new Set();
const KEYS = { KeyW: 1, KeyA: 1, KeyS: 1, KeyD: 1, ArrowLeft: 1, ArrowRight: 1, ArrowUp: 1, ArrowDown: 1,
               KeyQ: 1, KeyE: 1, Space: 1, KeyF: 1 };
function sendInput(extra = {}) {
  const axis = (plus, minus) => (held.has(plus) ? 1 : 0) - (held.has(minus) ? 1 : 0);
  send({ type: "input", move: [axis("KeyD", "KeyA"), axis("KeyW", "KeyS")],
         yaw: 3 * axis("ArrowLeft", "ArrowRight"), pitch: 2 * axis("ArrowUp", "ArrowDown"),
         zoom: 0.02 * axis("KeyE", "KeyQ"), jump: false, push: false, ...extra });
}
function typing(ev) {
  return ev.target instanceof HTMLTextAreaElement || ev.target instanceof HTMLSelectElement ||
         ev.target instanceof HTMLInputElement; // the sun's sliders take the arrow keys
}
document.addEventListener("keydown", (ev) => {
  if (typing(ev) || !(ev.code in KEYS)) return;
  ev.preventDefault();
  if (ev.repeat) return;
  held.add(ev.code);
  sendInput({ jump: ev.code === "Space", push: ev.code === "KeyF" });
});
document.addEventListener("keyup", (ev) => {
  if (!(ev.code in KEYS) || !held.delete(ev.code)) return;
  sendInput();
});
window.addEventListener("blur", () => { if (held.size) { held.clear(); sendInput(); } });
setInterval(() => send({ type: "ping", t: performance.now() }), 1000);
connect();
