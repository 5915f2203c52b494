// The edgeprof dashboard: talks to the control plane's REST API (docs/api.md)
// and draws the viewer model computed by the wasm (edgeprof-viewer-web).
//
// What is shown is also readable by tests and tools: the canvas carries
// `data-focus`, `data-width` and the timings of its last redraw
// (`data-redraw-ms`, `data-layout-ms`, `data-draw-ms`, `data-blocks`), and
// `window.edgeprof.blocks()` returns the drawn blocks (name, x, width,
// depth, in CSS pixels). Memory cells carry their raw bytes in `data-bytes`.
import init, { WebView } from "/assets/viewer.js";

const $ = (id) => document.getElementById(id);
const ROW = 18;
const MIB = 1024 * 1024;
// Agents cap each isolate's linear memory at `--isolate-memory-mib`, 128 MiB
// unless an operator changes it. Heartbeats do not carry the limit, so the
// page shows the platform default.
const MEMORY_LIMIT_BYTES = 128 * MIB;
const MEMORY_REFRESH_MS = 10000;

const state = {
  account: "", token: "", script: "", versions: [],
  view: null, bytes: null, sort: "self", blocks: [],
  drawnWidth: 0, tableShown: false, memoryTimer: null,
};

// Tests and tools read what the flamegraph shows from here.
window.edgeprof = { blocks: () => state.blocks.map(({ name, x, width, depth, folded }) => ({ name, x, width, depth, folded })) };

function showError(message) {
  const e = $("error");
  e.textContent = message;
  e.hidden = !message;
}

/// An error answer of the REST API: `{"error": {"code", "message"}}`.
class ApiError extends Error {
  constructor(status, code, message, retryAfter) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }

  /// What the page shows: the API's own message (it names the field and
  /// the limit), the status, and when to retry for 429.
  describe() {
    let text = `${this.message} (HTTP ${this.status}`;
    if (this.retryAfter) text += `, Retry-After ${this.retryAfter} s`;
    return `${text})`;
  }
}

async function api(path, options = {}) {
  const headers = Object.assign({ Authorization: `Bearer ${state.token}` }, options.headers || {});
  let resp;
  try {
    resp = await fetch(`/v1/accounts/${encodeURIComponent(state.account)}${path}`, Object.assign({}, options, { headers }));
  } catch (e) {
    throw new Error(`cannot reach the control plane: ${e.message}`);
  }
  if (!resp.ok) {
    let code = "";
    let message = resp.statusText || "request failed";
    try {
      const body = await resp.json();
      if (body.error) ({ code, message } = body.error);
    } catch (_) { /* not JSON */ }
    throw new ApiError(resp.status, code, message, resp.headers.get("Retry-After"));
  }
  return resp;
}

const describe = (e) => (e instanceof ApiError ? e.describe() : e.message || String(e));

async function signIn(ev) {
  ev.preventDefault();
  state.account = $("account").value.trim();
  state.token = $("token").value.trim();
  try {
    const { scripts } = await (await api("/scripts")).json();
    showError("");
    $("who").textContent = `account ${state.account}`;
    const list = $("script-list");
    list.replaceChildren();
    for (const s of scripts) {
      const li = document.createElement("li");
      const a = document.createElement("a");
      a.textContent = s.name;
      a.dataset.script = s.name;
      a.onclick = () => openScript(s.name);
      li.append(a, ` (${s.versions} version${s.versions === 1 ? "" : "s"})`);
      list.append(li);
    }
    if (scripts.length === 0) list.textContent = "No scripts yet: deploy one with `edgeprof deploy`.";
    $("signin").hidden = true;
    $("scripts").hidden = false;
  } catch (e) {
    showError(`Sign-in failed: ${describe(e)}`);
  }
}

function versionLabel(id) {
  const v = state.versions.find((x) => x.id === id);
  return v ? `#${v.seq} ${v.id.slice(0, 8)}` : id.slice(0, 8);
}

async function openScript(name) {
  state.script = name;
  $("script-name").textContent = name;
  $("observability").hidden = false;
  $("profile").hidden = true;
  $("capture-status").textContent = "";
  showError("");
  clearInterval(state.memoryTimer);
  try {
    const { versions } = await (await api(`/scripts/${encodeURIComponent(name)}/versions`)).json();
    state.versions = versions;
    const select = $("version");
    select.replaceChildren(new Option("Latest", "latest"));
    for (const v of versions) {
      select.append(new Option(`${versionLabel(v.id)} (weight ${v.weight} %)`, v.id));
    }
    await Promise.all([loadHistory(), loadMemory()]);
    state.memoryTimer = setInterval(() => loadMemory().catch(() => {}), MEMORY_REFRESH_MS);
  } catch (e) {
    showError(describe(e));
  }
}

function mib(bytes) {
  return bytes === null || bytes === undefined ? "–" : `${(bytes / MIB).toFixed(1)} MiB`;
}

function bytesCell(tr, bytes) {
  const td = tr.insertCell();
  td.textContent = mib(bytes);
  td.dataset.bytes = bytes === null || bytes === undefined ? "" : String(bytes);
  if (bytes >= MEMORY_LIMIT_BYTES) td.classList.add("over");
  return td;
}

/// The memory panel: per version, its isolates now and the percentiles of
/// the agents' readings over the window, against the limit.
async function loadMemory() {
  const script = state.script;
  let doc;
  try {
    doc = await (await api(`/scripts/${encodeURIComponent(script)}/memory`)).json();
  } catch (e) {
    $("memory-empty").hidden = false;
    $("memory-empty").textContent = `Memory view unavailable: ${describe(e)}`;
    throw e;
  }
  if (script !== state.script) return;
  $("memory-limit").textContent = mib(MEMORY_LIMIT_BYTES);
  const body = $("memory-table").tBodies[0];
  body.replaceChildren();
  for (const v of doc.versions) {
    const tr = body.insertRow();
    tr.dataset.version = v.version_id;
    tr.insertCell().textContent = versionLabel(v.version_id);
    const isolates = tr.insertCell();
    isolates.className = "isolates";
    isolates.dataset.count = String(v.isolates.length);
    isolates.append(`${v.isolates.length}`);
    for (const i of v.isolates) {
      const d = document.createElement("div");
      d.className = "isolate";
      d.dataset.isolate = i.isolate;
      d.dataset.bytes = String(i.memory_bytes);
      d.textContent = `${i.data_center}/${i.machine}/${i.isolate}: ${mib(i.memory_bytes)}`;
      isolates.append(d);
    }
    const m = v.memory_bytes;
    for (const [key, value] of [["p50", m.p50], ["p99", m.p99], ["p999", m.p999], ["max", m.max]]) {
      bytesCell(tr, value).dataset.stat = key;
    }
    const readings = tr.insertCell();
    readings.dataset.stat = "samples";
    readings.textContent = String(m.samples);
    const exceeded = tr.insertCell();
    exceeded.dataset.stat = "exceeded_memory";
    exceeded.textContent = String(v.evictions.exceeded_memory);
    if (v.evictions.exceeded_memory > 0) exceeded.classList.add("over");
    const all = tr.insertCell();
    all.dataset.stat = "evictions";
    all.textContent = String(v.evictions.total);
    const limit = tr.insertCell();
    limit.dataset.stat = "p999_of_limit";
    const meter = document.createElement("meter");
    Object.assign(meter, { min: 0, max: 1, low: 0.75, high: 0.9, optimum: 0, value: Math.min(1, (m.p999 || 0) / MEMORY_LIMIT_BYTES) });
    limit.append(meter, ` ${Math.round(((m.p999 || 0) * 100) / MEMORY_LIMIT_BYTES)} %`);
    tr.classList.toggle("over-limit", (m.max || 0) >= MEMORY_LIMIT_BYTES || v.evictions.exceeded_memory > 0);
  }
  if (doc.versions.length > 0) $("memory-window").textContent = `${Math.round(doc.versions[0].window_s / 60)} min`;
  $("memory-empty").hidden = doc.versions.length > 0;
  $("memory-empty").textContent = "No agent has reported an isolate of this script in the window: it has served no recent traffic.";
  $("memory").dataset.loaded = String(Date.now());
}

async function loadHistory() {
  const { profiles } = await (await api(`/profiles?script=${encodeURIComponent(state.script)}`)).json();
  const body = $("history").tBodies[0];
  body.replaceChildren();
  for (const p of profiles) {
    const tr = body.insertRow();
    tr.dataset.id = p.id;
    tr.dataset.status = p.status;
    const version = versionLabel(p.version_id) + (p.version === "latest" ? " (latest)" : "");
    for (const text of [new Date(p.created_at_ms).toLocaleString(), p.profile_type, version,
      `${p.duration_ms} ms`, p.error ? `${p.status}: ${p.error}` : p.status]) {
      tr.insertCell().textContent = text;
    }
    const cell = tr.insertCell();
    if (p.status === "done" || p.status === "partial") {
      const b = document.createElement("button");
      b.textContent = "Open";
      b.className = "open-capture";
      b.onclick = () => openCapture(p.id);
      cell.append(b);
    }
  }
}

async function capture(ev) {
  ev.preventDefault();
  // The API validates the duration and says why it refuses one; an empty or
  // non-numeric field is sent as typed rather than silently defaulted.
  const raw = $("duration").value.trim();
  const duration = raw !== "" && Number.isFinite(Number(raw)) ? Number(raw) : raw;
  showError("");
  const button = $("capture");
  const status = $("capture-status");
  const progress = $("capture-progress");
  button.disabled = true;
  try {
    const body = { script: state.script, duration_ms: duration, profile_type: $("profile-type").value, version: $("version").value };
    const { id } = await (await api("/profiles", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })).json();
    const started = Date.now();
    progress.hidden = false;
    for (;;) {
      const s = await (await api(`/profiles/${id}`)).json();
      const elapsed = Math.min(1, (Date.now() - started) / duration);
      const machines = s.progress.machines_total ? ` ${s.progress.machines_answered}/${s.progress.machines_total} machines` : "";
      status.textContent = s.status === "merging" ? `Merging…${machines}` : `Capturing… ${Math.round(elapsed * 100)}%${machines}`;
      progress.value = elapsed;
      if (s.status === "done" || s.status === "partial") {
        status.textContent = s.status === "partial" ? `Partial capture: missing ${s.missing_machines.join(", ")}` : "Captured";
        await loadHistory();
        await openCapture(id);
        break;
      }
      if (s.status === "failed") {
        await loadHistory();
        throw new Error(`the capture failed: ${s.error}`);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  } catch (e) {
    status.textContent = "";
    showError(`Cannot capture: ${describe(e)}`);
  } finally {
    button.disabled = false;
    progress.hidden = true;
  }
}

async function openCapture(id) {
  try {
    const resp = await api(`/profiles/${id}/pprof`);
    const bytes = new Uint8Array(await resp.arrayBuffer());
    const link = $("download");
    if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
    link.href = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
    link.download = `${state.script}-${id}.pprof`;
    link.hidden = false;
    showProfile(bytes, `${state.script}: capture ${id}`);
  } catch (e) {
    showError(`Cannot open capture ${id}: ${describe(e)}`);
  }
}

/// Builds the view of `sampleType` ("" = the profile's default) and draws it.
function openView(sampleType) {
  const t0 = performance.now();
  const view = new WebView(state.bytes, sampleType);
  const openMs = performance.now() - t0;
  if (state.view) state.view.free();
  state.view = view;
  $("flame").dataset.openMs = openMs.toFixed(1);
  return JSON.parse(view.summary());
}

function showProfile(bytes, title) {
  const previous = state.bytes;
  state.bytes = bytes;
  let summary;
  try {
    summary = openView("");
  } catch (e) {
    state.bytes = previous;
    showError(`Cannot open the profile: ${e}`);
    return;
  }
  state.title = title;
  const select = $("sample-type");
  select.replaceChildren();
  for (const [type, unit] of summary.sample_types) {
    const o = new Option(`${type} (${unit})`, type);
    o.selected = type === summary.sample_type;
    select.append(o);
  }
  $("profile").hidden = false;
  $("search").value = "";
  showError("");
  showSummary(summary);
  search();
}

function showSummary(summary) {
  $("profile-title").textContent = `${state.title} — ${summary.sample_type} ${summary.total_text}`;
}

function changeSampleType() {
  try {
    showSummary(openView($("sample-type").value));
  } catch (e) {
    showError(`Cannot show ${$("sample-type").value}: ${e}`);
    return;
  }
  search();
}

function color(name, matched) {
  if (matched) return "#e040a0";
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return `hsl(${20 + (h % 40)}, 80%, ${55 + (h % 15)}%)`;
}

/// Lays out and draws the flamegraph at the pane's width, and times it.
function redraw() {
  const view = state.view;
  if (!view) return;
  const canvas = $("flame");
  const width = Math.floor($("flame-pane").clientWidth);
  if (width <= 0) return; // hidden (table tab); drawn when shown again
  const dpr = window.devicePixelRatio || 1;
  const t0 = performance.now();
  const blocks = JSON.parse(view.layout(width, 1));
  const t1 = performance.now();
  const depth = blocks.reduce((d, b) => Math.max(d, b.depth + 1), 1);
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(depth * ROW * dpr);
  canvas.style.height = `${depth * ROW}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, depth * ROW);
  ctx.font = "12px sans-serif";
  for (const b of blocks) {
    const y = b.depth * ROW; // root (the focus) on top
    ctx.fillStyle = b.folded ? "#ccc" : color(b.name, b.matched);
    ctx.fillRect(b.x, y, Math.max(1, b.width - 1), ROW - 1);
    if (b.width > 30) {
      ctx.fillStyle = "#000";
      ctx.save();
      ctx.beginPath();
      ctx.rect(b.x, y, b.width - 2, ROW);
      ctx.clip();
      ctx.fillText(b.name, b.x + 3, y + 13);
      ctx.restore();
    }
  }
  // Reading one pixel makes the canvas finish its drawing, so the time
  // includes rasterization and not only the queued commands.
  ctx.getImageData(0, 0, 1, 1);
  const t2 = performance.now();
  state.blocks = blocks;
  state.drawnWidth = width;
  Object.assign(canvas.dataset, {
    width: String(width),
    blocks: String(blocks.length),
    layoutMs: (t1 - t0).toFixed(2),
    drawMs: (t2 - t1).toFixed(2),
    redrawMs: (t2 - t0).toFixed(2),
  });
  $("redraw-time").textContent =
    `Redraw ${(t2 - t0).toFixed(1)} ms (layout ${(t1 - t0).toFixed(1)} ms, draw ${(t2 - t1).toFixed(1)} ms) for ${blocks.length} blocks at ${width} px; model built in ${canvas.dataset.openMs} ms`;
  const crumbs = JSON.parse(view.breadcrumbs());
  canvas.dataset.focus = crumbs[crumbs.length - 1].name;
  const nav = $("breadcrumbs");
  nav.replaceChildren();
  for (const c of crumbs) {
    const a = document.createElement("a");
    a.textContent = c.name;
    a.onclick = () => { view.focus(c.node); refresh(); };
    nav.append(a);
  }
}

/// Redraws what is visible: the flamegraph, or the table.
function refresh() {
  redraw();
  if (state.tableShown) drawTable();
}

function blockAt(ev) {
  const canvas = $("flame");
  const rect = canvas.getBoundingClientRect();
  const x = (ev.clientX - rect.left) * (state.drawnWidth / rect.width);
  const depth = Math.floor((ev.clientY - rect.top) / ROW);
  return state.blocks.find((b) => b.depth === depth && x >= b.x && x < b.x + b.width);
}

function hover(ev) {
  const tip = $("tooltip");
  const b = blockAt(ev);
  if (!b || b.folded || !state.view) {
    tip.hidden = true;
    return;
  }
  const d = JSON.parse(state.view.details(b.node));
  tip.textContent = `${d.function}\n${d.location || "(no source)"}\nself ${d.self} (${d.self_percent.toFixed(1)}%)\ntotal ${d.total} (${d.total_percent.toFixed(1)}%)\n${d.samples} samples`;
  tip.style.left = `${ev.offsetX + 12}px`;
  tip.style.top = `${ev.offsetY + 12}px`;
  tip.hidden = false;
}

function click(ev) {
  const b = blockAt(ev);
  if (b && !b.folded && state.view) {
    state.view.focus(b.node);
    refresh();
  }
}

function search() {
  if (!state.view) return;
  const share = $("search-share");
  try {
    const r = JSON.parse(state.view.search($("search").value, $("search-regex").checked));
    share.textContent = r ? `${r.matching_nodes} frames match, ${r.covered_percent.toFixed(1)}% of the profile` : "";
    share.classList.remove("bad");
  } catch (e) {
    // The previous search stays in effect; say why this one is refused.
    share.textContent = String(e);
    share.classList.add("bad");
    return;
  }
  refresh();
}

function drawTable() {
  const rows = JSON.parse(state.view.table(state.sort));
  const body = $("functions").tBodies[0];
  body.replaceChildren();
  for (const r of rows) {
    const tr = body.insertRow();
    for (const text of [r.function, r.location, r.self, r.total, `${r.self_percent.toFixed(1)}%`]) tr.insertCell().textContent = text;
  }
  for (const th of $("functions").tHead.rows[0].cells) th.classList.toggle("sorted", th.dataset.sort === state.sort && th.textContent !== "%");
  $("functions").dataset.sort = state.sort;
}

function tab(table) {
  state.tableShown = table;
  $("table-pane").hidden = !table;
  $("flame-pane").hidden = table;
  $("tab-table").classList.toggle("active", table);
  $("tab-flame").classList.toggle("active", !table);
  if (state.view) refresh();
}

async function openFile(file) {
  if (!file) return;
  try {
    const bytes = new Uint8Array(await file.arrayBuffer());
    $("download").hidden = true;
    showProfile(bytes, file.name);
  } catch (e) {
    showError(`Cannot read ${file.name}: ${e}`);
  }
}

async function main() {
  await init();
  $("signin-form").addEventListener("submit", signIn);
  $("capture-form").addEventListener("submit", capture);
  $("memory-refresh").onclick = () => loadMemory().catch(() => {});
  $("flame").addEventListener("mousemove", hover);
  $("flame").addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
  $("flame").addEventListener("click", click);
  $("reset").onclick = () => { if (state.view) { state.view.reset(); refresh(); } };
  $("search").addEventListener("input", search);
  $("search-regex").addEventListener("change", search);
  $("sample-type").addEventListener("change", changeSampleType);
  $("tab-flame").onclick = () => tab(false);
  $("tab-table").onclick = () => tab(true);
  for (const th of $("functions").tHead.rows[0].cells) {
    if (th.dataset.sort) th.onclick = () => { state.sort = th.dataset.sort; drawTable(); };
  }
  // The canvas follows its container: redraw when the pane's width changes
  // (window resize, layout change), once per animation frame.
  let pending = false;
  new ResizeObserver(() => {
    if (pending || !state.view) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      if (Math.floor($("flame-pane").clientWidth) !== state.drawnWidth) redraw();
    });
  }).observe($("flame-pane"));
  $("file").addEventListener("change", (ev) => openFile(ev.target.files[0]));
  document.addEventListener("dragover", (ev) => ev.preventDefault());
  document.addEventListener("drop", (ev) => { ev.preventDefault(); openFile(ev.dataTransfer.files[0]); });
  document.body.dataset.ready = "true";
}

main().catch((e) => showError(`The dashboard failed to start: ${e}`));
