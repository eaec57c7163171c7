// The newsroom page: drives serve's JSON API (the same routes curl uses). The token, when the server needs one, is
// asked for once, kept in sessionStorage and sent as the Authorization header; never put in a URL. Images and
// downloads are fetched with that header and shown from blob: URLs. Everything shown is set as text, never as HTML.
"use strict";

const POLL_MS = 700;
const TOKEN_KEY = "ditto-fast-token";
const $ = (id) => document.getElementById(id);
const state = { profiles: {}, jobs: new Map(), polling: false, settings: null };

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}

class Unauthorized extends Error {}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = headers(opts.headers);
  const r = await fetch(path, opts);
  if (r.status === 401) throw new Unauthorized("token");
  return r;
}

async function json(path, options) {
  const r = await api(path, options);
  const body = await r.json().catch(() => ({ error: r.status + " " + r.statusText }));
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}

function base(path) { return String(path || "").split("/").pop(); }

function seconds(s) {
  if (s === null || s === undefined) return "";
  if (s < 60) return s.toFixed(1) + " s";
  return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
}

async function blobUrl(path) {
  const r = await api(path);
  if (!r.ok) return null;
  return URL.createObjectURL(await r.blob());
}

// ------------------------------------------------------------------ the token
function askToken(message) {
  $("newsroom").hidden = true;
  $("token-panel").hidden = false;
  $("token-error").textContent = message || "";
  $("server-state").textContent = "needs the token";
  $("token").focus();
}

async function start() {
  try {
    await json("/v1/settings").then((s) => { state.settings = s; });
  } catch (e) {
    if (e instanceof Unauthorized) {
      const tried = Boolean(sessionStorage.getItem(TOKEN_KEY));
      sessionStorage.removeItem(TOKEN_KEY);
      askToken(tried ? "That token was refused." : "");
      return;
    }
    $("server-state").textContent = "cannot reach the server: " + e.message;
    return;
  }
  $("token-panel").hidden = true;
  $("newsroom").hidden = false;
  $("forget-token").hidden = !sessionStorage.getItem(TOKEN_KEY);
  fillEmotions();
  await Promise.all([loadAvatars(), loadProfiles()]).catch(showProblem);
  if (!state.polling) { state.polling = true; poll(); }
}

function showProblem(e) {
  if (e instanceof Unauthorized) { sessionStorage.removeItem(TOKEN_KEY); askToken("The token was refused."); return; }
  $("server-state").textContent = e.message;
}

// ------------------------------------------------------------------ choices: anchors, profiles, emotions
function fillEmotions() {
  const select = $("emotion");
  if (select.options.length > 1) return;
  for (const name of state.settings.emotions) select.append(new Option(name, name));
}

async function loadAvatars() {
  const { avatars } = await json("/v1/avatars");
  const select = $("avatar"), cards = $("avatars");
  select.replaceChildren();
  cards.replaceChildren();
  if (!avatars.length) cards.append(el("p", "muted", "No anchors registered: `ditto-fast register SOURCE` makes one."));
  for (const a of avatars) {
    const card = el("div", "card");
    card.dataset.avatar = a.name;
    card.append(el("div", "name", a.name));
    if (a.error) { card.append(el("div", "error", a.error)); cards.append(card); continue; }
    select.append(new Option(a.name, a.name));
    card.append(el("div", "muted", a.frames + " frames, " + a.resolution + (a.is_image ? ", still image" : "")
      + (a.random_weights ? ", random weights" : "")));
    const img = el("img");
    img.alt = "contact sheet of " + a.name;
    card.append(img);
    cards.append(card);
    blobUrl("/v1/avatars/" + encodeURIComponent(a.name) + "/preview").then((url) => { if (url) img.src = url; });
  }
}

async function loadProfiles() {
  const { profiles } = await json("/v1/profiles");
  const select = $("delivery"), body = $("profiles").tBodies[0];
  body.replaceChildren();
  for (const p of profiles) {
    state.profiles[p.name] = p;
    if (![...select.options].some((o) => o.value === p.name)) select.append(new Option(p.name, p.name));
    const row = el("tr");
    const loud = p.loudness ? p.loudness.lufs + " LUFS, " + p.loudness.true_peak + " dBTP" : "as spoken";
    for (const v of [p.name, p.container, p.video, p.size, p.rate, loud]) row.append(el("td", null, v));
    body.append(row);
  }
}

// ------------------------------------------------------------------ the queue
async function poll() {
  try {
    const [list, health] = await Promise.all([json("/v1/jobs?limit=50"), json("/healthz").catch(() => null)]);
    showJobs(list.jobs);
    showLive(list.live || []);
    if (health) {
      const engines = (health.engines || []).map((e) => e.state).join(", ");
      $("server-state").textContent = (health.ok ? "ready" : "NOT READY") + (engines ? " · engines " + engines : "")
        + (health.device ? " · " + health.device : "");
    }
  } catch (e) {
    showProblem(e);
    if (e instanceof Unauthorized) { state.polling = false; return; }
  }
  setTimeout(poll, POLL_MS);
}

function showJobs(jobs) {
  const queue = $("queue");
  if (!jobs.length) return;
  if (queue.querySelector("p.muted")) queue.replaceChildren();
  const counts = {};
  jobs.forEach((job, i) => {
    counts[job.status] = (counts[job.status] || 0) + 1;
    let row = state.jobs.get(job.id);
    if (!row) { row = jobRow(job); state.jobs.set(job.id, row); }
    updateRow(row, job);
    if (queue.children[i] !== row.root) queue.insertBefore(row.root, queue.children[i] || null);
  });
  $("queue-counts").textContent = Object.entries(counts).map(([k, v]) => v + " " + k).join(" · ");
}

function jobRow(job) {
  const r = { root: el("div", "job") };
  r.root.dataset.job = job.id;
  const left = el("div");
  r.what = el("div", "what");
  r.meta = el("div", "meta");
  r.badges = el("div");
  left.append(r.badges, r.what, r.meta);
  r.actions = el("div", "actions");
  r.bar = el("div", "bar");
  r.progress = el("progress");
  r.progress.max = 1;
  r.progress.value = 0;
  r.stage = el("span", "stage");
  r.bar.append(r.progress, r.stage);
  r.err = el("div", "err");
  r.root.append(left, r.actions, r.bar, r.err);
  return r;
}

function updateRow(r, job) {
  const req = job.request || {};
  r.root.dataset.status = job.status;
  const badges = [];
  if (job.priority >= 100) badges.push(["breaking", "BREAKING"]);
  else if (job.priority) badges.push(["", "priority " + job.priority]);
  badges.push([job.status, job.status]);
  if (r.badgeText !== JSON.stringify(badges)) {
    r.badgeText = JSON.stringify(badges);
    r.badges.replaceChildren(...badges.map(([cls, text]) => el("span", "badge " + cls, text)));
  }
  r.what.textContent = (req.avatar || "?") + " · " + base(req.audio);
  const bits = [req.delivery ? "delivery " + req.delivery : "no delivery profile"];
  if (req.emotion) bits.push("emotion " + req.emotion);
  bits.push("→ " + base(job.output));
  const end = job.finished || (job.status === "running" || job.status === "queued" ? Date.now() / 1000 : null);
  const said = job.finished ? "turnaround " : job.status === "running" ? "submitted " : "waiting ";
  if (end && job.created) bits.push(said + seconds(end - job.created) + (job.finished ? "" : job.status === "running"
    ? " ago" : ""));
  r.meta.textContent = bits.join(" · ");
  // progress: by stage while running, full once done
  const p = job.progress;
  if (job.status === "done") { r.progress.value = 1; r.stage.textContent = "done"; }
  else if (p && p.total) {
    r.progress.value = p.done / p.total;
    r.stage.textContent = p.stage + " " + p.done + " / " + p.total;
  } else {
    r.progress.value = 0;
    r.stage.textContent = job.status === "running" ? "starting" : job.status;
  }
  r.progress.dataset.done = p ? p.done : 0;
  r.err.textContent = job.status === "failed" || job.status === "cancelled" ? (job.error || "") : "";
  // actions: cancel while it may run, download once done
  const want = job.status === "queued" || job.status === "running" ? "cancel" : job.status === "done" ? "done" : "";
  if (r.actionsFor !== want) {
    r.actionsFor = want;
    r.actions.replaceChildren();
    if (want === "cancel") {
      const b = el("button", "cancel", "Cancel");
      b.addEventListener("click", () => cancel(job.id, b));
      r.actions.append(b);
    } else if (want === "done" && job.links && job.links.output) {
      const b = el("button", "download", "Download");
      b.addEventListener("click", () => download(job, b));
      r.actions.append(b);
    }
  }
  const qc = job.timings && job.timings.delivery ? job.timings.delivery.qc : null;
  if (qc && !r.qc) {
    r.qc = el("div", "qc" + (/fail/i.test(String(qc)) ? " fail" : ""), "QC: " + qc);
    r.root.append(r.qc);
  }
  if (job.links && job.links.preview && !r.preview) {
    r.preview = el("img", "preview");
    r.preview.alt = "preview of job " + job.id;
    r.root.append(r.preview);
    blobUrl(job.links.preview).then((url) => { if (url) r.preview.src = url; });
  }
}

async function cancel(id, button) {
  button.disabled = true;
  try {
    const r = await api("/v1/jobs/" + id, { method: "DELETE" });
    if (!r.ok && r.status !== 202) {
      const body = await r.json().catch(() => ({}));
      $("form-status").textContent = body.error || "cancel refused";
    }
  } catch (e) { showProblem(e); }
}

async function download(job, button) {
  button.disabled = true;
  try {
    const r = await api(job.links.output);
    if (!r.ok) {
      const body = await r.json().catch(() => ({}));
      throw new Error(body.error || "download refused");
    }
    const a = el("a");
    a.href = URL.createObjectURL(await r.blob());
    a.download = base(job.output);
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 60000);
  } catch (e) { $("form-status").textContent = e.message; }
  button.disabled = false;
}

function showLive(sessions) {
  $("live-panel").hidden = !sessions.length;
  const body = $("live").tBodies[0];
  body.replaceChildren();
  for (const s of sessions) {
    const row = el("tr");
    const state = s.state + (s.client_connected ? ", client connected" : "") + (s.error ? ": " + s.error : "");
    const latency = s.latency_s ? (s.latency_s.median * 1000).toFixed(0) + " ms" : "";
    for (const v of [s.id, s.avatar, state, s.out || "viewers only", latency]) {
      row.append(el("td", null, v === undefined || v === null ? "" : String(v)));
    }
    const cell = el("td");
    if (["starting", "streaming", "idle"].includes(s.state)) {
      const button = el("button", "watch", viewer.id === s.id ? "watching" : "watch");
      button.disabled = viewer.id === s.id;
      button.addEventListener("click", () => watch(s.id));
      cell.append(button);
    }
    row.append(cell);
    body.append(row);
    if (viewer.id === s.id) viewer.session = s;
  }
  if (viewer.id && !sessions.some((s) => s.id === viewer.id && ["starting", "streaming", "idle"].includes(s.state))) {
    stopWatching("the session has ended");
  }
}

// ------------------------------------------------------------------ watching a live session (WebRTC, WHEP)
const viewer = { id: null, pc: null, location: null, session: null, timer: null, stats: null, heardFrom: null };

function iceGathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { if (pc.iceGatheringState === "complete") resolve(); };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, 2000);                   // host candidates come at once; none from the internet is needed
  });
}

async function watch(id) {
  await stopWatching();
  const pc = new RTCPeerConnection();
  Object.assign(viewer, { id: id, pc: pc, session: null, stats: null, heardFrom: null });
  $("viewer-panel").hidden = false;
  $("viewer-stats").textContent = "Connecting to " + id + "…";
  const stream = new MediaStream();
  $("viewer").srcObject = stream;
  pc.addEventListener("track", (event) => stream.addTrack(event.track));
  pc.addTransceiver("video", { direction: "recvonly" });
  pc.addTransceiver("audio", { direction: "recvonly" });
  try {
    await pc.setLocalDescription(await pc.createOffer());
    await iceGathered(pc);
    const r = await api("/v1/live/" + id + "/whep", { method: "POST", headers: { "Content-Type": "application/sdp" },
                                                      body: pc.localDescription.sdp });
    const text = await r.text();
    if (r.status !== 201) throw new Error(JSON.parse(text).error || r.status + " " + r.statusText);
    viewer.location = r.headers.get("Location");
    await pc.setRemoteDescription({ type: "answer", sdp: text });
    viewer.timer = setInterval(showViewerStats, 1000);
  } catch (e) {
    if (e instanceof Unauthorized) showProblem(e);
    await stopWatching(e.message);
  }
}

async function stopWatching(why) {
  const { pc, location } = viewer;
  if (viewer.timer) clearInterval(viewer.timer);
  Object.assign(viewer, { id: null, pc: null, location: null, session: null, timer: null });
  if (pc) pc.close();
  if (location) api(location, { method: "DELETE" }).catch(() => {});
  $("viewer").srcObject = null;
  $("viewer-panel").hidden = !why;
  $("viewer-stats").textContent = why || "";
}

// what the viewer sees, from WebRTC's own figures (getStats) and the session's: speech in to the frame sent (the
// session's latency), then the network's jitter buffer and the decode; their sum is the glass-to-glass delay
async function showViewerStats() {
  if (!viewer.pc) return;
  const report = await viewer.pc.getStats();
  let video = null, audio = null;
  report.forEach((r) => {
    if (r.type === "inbound-rtp" && r.kind === "video") video = r;
    if (r.type === "inbound-rtp" && r.kind === "audio") audio = r;
  });
  if (!video || !video.framesDecoded) return;
  const jitter = video.jitterBufferEmittedCount ? video.jitterBufferDelay / video.jitterBufferEmittedCount : 0;
  const decode = video.totalDecodeTime / video.framesDecoded;
  const s = viewer.session, session = s && s.latency_s ? s.latency_s.median : null;
  viewer.stats = { frames_decoded: video.framesDecoded, width: video.frameWidth, height: video.frameHeight,
                   fps: video.framesPerSecond || 0, jitter_buffer_s: jitter, decode_s: decode,
                   session_latency_s: session,
                   glass_to_glass_s: session === null ? null : session + jitter + decode,
                   audio: audio ? heard(audio, video) : null };
  window.dittoViewerStats = viewer.stats;
  const parts = [video.frameWidth + "×" + video.frameHeight, (video.framesPerSecond || 0).toFixed(0) + " fps",
                 "jitter buffer " + (jitter * 1000).toFixed(0) + " ms", "decode " + (decode * 1000).toFixed(1) + " ms"];
  if (session !== null) parts.push("speech to picture " + (session * 1000).toFixed(0) + " ms",
                                   "glass to glass ≈ " + (viewer.stats.glass_to_glass_s * 1000).toFixed(0) + " ms");
  $("viewer-stats").textContent = "Watching " + viewer.id + ": " + parts.join(", ");
}

// what the viewer hears (getStats' audio): packets discarded; since its first second, the share of samples concealed
// (played with no audio come in time), the seconds of audio heard, and the packets come and frames decoded meanwhile
function heard(a, video) {
  const now = { samples: a.totalSamplesReceived || 0, concealed: a.concealedSamples || 0, t: a.timestamp,
                frames: video.framesDecoded, packets: a.packetsReceived || 0 };
  const rate = now.samples && a.totalSamplesDuration ? now.samples / a.totalSamplesDuration : 48000;
  if (!viewer.heardFrom && now.samples >= rate) viewer.heardFrom = now;
  const from = viewer.heardFrom || now, samples = now.samples - from.samples, concealed = now.concealed - from.concealed;
  return { packets_received: a.packetsReceived, packets_discarded: a.packetsDiscarded || 0,
           packets_lost: a.packetsLost || 0, samples_received: now.samples, concealed_samples: now.concealed,
           concealed_after_first_s: samples > 0 ? concealed / samples : null,
           audio_s_after_first_s: (samples - concealed) / rate, watched_s_after_first_s: (now.t - from.t) / 1000,
           frames_decoded_after_first_s: now.frames - from.frames, packets_after_first_s: now.packets - from.packets };
}

// ------------------------------------------------------------------ the form
function outputFor(audio, avatar, delivery) {
  const folder = audio.slice(0, audio.lastIndexOf("/") + 1);
  const stem = base(audio).replace(/\.[^.]*$/, "");
  const ext = delivery && state.profiles[delivery] ? state.profiles[delivery].extension : ".mp4";
  const t = new Date(), pad = (n) => String(n).padStart(2, "0");
  return folder + stem + "_" + avatar + "_" + pad(t.getHours()) + pad(t.getMinutes()) + pad(t.getSeconds()) + ext;
}

// an upload with its progress shown (fetch cannot report an upload's progress; XMLHttpRequest can)
function upload(file, status) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest(), form = new FormData();
    form.append("file", file, file.name);
    xhr.open("POST", "/v1/uploads");
    for (const [k, v] of Object.entries(headers())) xhr.setRequestHeader(k, v);
    xhr.setRequestHeader("X-Requested-With", "ditto-fast");  // what a web form cannot send: serve wants it on an upload
    xhr.responseType = "json";
    xhr.upload.onprogress = (e) => {
      if (!e.lengthComputable) return;
      status.textContent = "Uploading " + file.name + "… " + Math.floor(100 * e.loaded / e.total) + " %";
    };
    xhr.onload = () => {
      if (xhr.status === 401) reject(new Unauthorized("token"));
      else if (xhr.status === 201 && xhr.response) resolve(xhr.response.path);
      else reject(new Error((xhr.response && xhr.response.error) || "upload refused: " + xhr.status));
    };
    xhr.onerror = () => reject(new Error("the upload failed: the server could not be reached"));
    status.textContent = "Uploading " + file.name + "…";
    xhr.send(form);
  });
}

async function submitJob(event) {
  event.preventDefault();
  const status = $("form-status"), button = $("submit");
  const file = $("audio-file").files[0], typed = $("audio-path").value.trim();
  if (!file && !typed) { status.textContent = "Choose a speech file, or give a path on the server."; return; }
  button.disabled = true;
  try {
    let audio = typed;
    if (file) {
      audio = await upload(file, status);
    }
    const avatar = $("avatar").value, delivery = $("delivery").value, emotion = $("emotion").value;
    const job = { avatar: avatar, audio: audio, output: outputFor(audio, avatar, delivery),
                  priority: $("breaking").checked ? "breaking" : "normal" };
    if (delivery) job.delivery = delivery;
    if (emotion) job.emotion = emotion;
    const queued = await json("/v1/jobs", { method: "POST", headers: { "Content-Type": "application/json" },
                                            body: JSON.stringify(job) });
    status.textContent = "Queued as " + queued.id + ".";
    $("audio-file").value = "";
  } catch (e) {
    if (e instanceof Unauthorized) showProblem(e); else status.textContent = e.message;
  }
  button.disabled = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    start();
  });
  $("forget-token").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); location.reload(); });
  $("job-form").addEventListener("submit", submitJob);
  $("viewer-close").addEventListener("click", () => stopWatching());
  start();
});
