// alaya-flash live page: shows the frames the server pushes, sends commands and held keys.
// Protocol: streaming/live/protocol.py (docs/live.md). window.alaya exposes counters for tests.
"use strict";

const $ = (id) => document.getElementById(id);
const HISTORY = 400; // frame records kept for inspection (kind, epoch, index, digest)
const alaya = (window.alaya = { connected: false, frames: 0, passes: 0, last: null, lastPasses: null,
                                 history: [], status: null, errors: [], clientFps: 0, rttMs: null,
                                 displayMs: [] });
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
  alaya.presets = msg.presets;
  showStatus({ ...msg.status, dropped: 0, viewers: "–" });
}

function connect() {
  ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => { alaya.connected = true; };
  ws.onclose = () => { alaya.connected = false; $("state").textContent = "disconnected"; setTimeout(connect, 1000); };
  ws.onmessage = (ev) => {
    if (typeof ev.data !== "string") { onFrame(ev.data); return; }
    const msg = JSON.parse(ev.data);
    if (msg.type === "hello") onHello(msg);
    else if (msg.type === "status") showStatus(msg);
    else if (msg.type === "pong") alaya.rttMs = performance.now() - msg.t;
    else if (msg.type === "error") { alaya.errors.push(msg.message); if (alaya.errors.length > 50) alaya.errors.shift(); }
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
function typing(ev) { return ev.target instanceof HTMLTextAreaElement || ev.target instanceof HTMLSelectElement; }
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
