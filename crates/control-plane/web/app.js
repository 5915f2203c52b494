// The edgeprof dashboard: talks to the control plane's REST API (DESIGN.md
// §5) and draws the viewer model computed by the wasm (edgeprof-viewer-web).
// The canvas carries `data-frames` (the drawn frames' names, row by row),
// `data-blocks` (their rectangles) and `data-focus`, so tests and tools can
// read what is shown.
import init, { WebView } from "/assets/viewer.js";

const $ = (id) => document.getElementById(id);
const ROW = 18;
const state = { account: "", token: "", script: "", view: null, sort: "self", blocks: [], polling: null };

function showError(message) {
  const e = $("error");
  e.textContent = message;
  e.hidden = !message;
}

async function api(path, options = {}) {
  const headers = Object.assign({ Authorization: `Bearer ${state.token}` }, options.headers || {});
  const resp = await fetch(`/v1/accounts/${encodeURIComponent(state.account)}${path}`, Object.assign({}, options, { headers }));
  if (!resp.ok) {
    let message = `${resp.status} ${resp.statusText}`;
    try {
      const body = await resp.json();
      if (body.error) message = body.error.message;
    } catch (_) { /* not JSON */ }
    if (resp.status === 429) {
      const retry = resp.headers.get("Retry-After");
      message = `Too many captures running for this script: ${message}${retry ? ` (retry in ${retry} s)` : ""}`;
    }
    throw new Error(message);
  }
  return resp;
}

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
    showError(`Sign-in failed: ${e.message}`);
  }
}

async function openScript(name) {
  state.script = name;
  $("script-name").textContent = name;
  $("observability").hidden = false;
  try {
    const { versions } = await (await api(`/scripts/${encodeURIComponent(name)}/versions`)).json();
    const select = $("version");
    select.replaceChildren(new Option("Latest", "latest"));
    for (const v of versions) select.append(new Option(`#${v.seq} ${v.id.slice(0, 8)}`, v.id));
    await loadHistory();
  } catch (e) {
    showError(e.message);
  }
}

async function loadHistory() {
  const { profiles } = await (await api(`/profiles?script=${encodeURIComponent(state.script)}`)).json();
  const body = $("history").tBodies[0];
  body.replaceChildren();
  for (const p of profiles) {
    const tr = body.insertRow();
    tr.dataset.id = p.id;
    for (const text of [new Date(p.created_at_ms).toLocaleString(), p.profile_type, p.version || "latest",
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
  const duration = Number($("duration").value);
  if (!Number.isInteger(duration) || duration < 1000 || duration > 50000) {
    showError(`Duration: must be a whole number of milliseconds between 1000 and 50000 (got ${$("duration").value}).`);
    return;
  }
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
      status.textContent = `Capturing… ${Math.round(elapsed * 100)}%${machines}`;
      progress.value = elapsed;
      if (s.status === "done" || s.status === "partial") {
        status.textContent = s.status === "partial" ? `Partial capture: missing ${s.missing_machines.join(", ")}` : "Captured";
        await loadHistory();
        await openCapture(id);
        break;
      }
      if (s.status === "failed") throw new Error(`Capture failed: ${s.error}`);
      await new Promise((r) => setTimeout(r, 250));
    }
  } catch (e) {
    status.textContent = "";
    showError(e.message);
  } finally {
    button.disabled = false;
    progress.hidden = true;
  }
}

async function openCapture(id) {
  try {
    const resp = await api(`/profiles/${id}/pprof`);
    const bytes = new Uint8Array(await resp.arrayBuffer());
    const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
    const link = $("download");
    link.href = url;
    link.download = `${state.script}-${id}.pprof`;
    link.hidden = false;
    showProfile(bytes, `${state.script}: capture ${id}`);
  } catch (e) {
    showError(e.message);
  }
}

function showProfile(bytes, title) {
  let view;
  try {
    view = new WebView(bytes, "");
  } catch (e) {
    showError(`Cannot open the profile: ${e}`);
    return;
  }
  if (state.view) state.view.free();
  state.view = view;
  const summary = JSON.parse(view.summary());
  $("profile-title").textContent = `${title} — ${summary.sample_type} ${summary.total_text}`;
  $("profile").hidden = false;
  $("search").value = "";
  $("search-share").textContent = "";
  showError("");
  redraw();
}

function color(name, matched) {
  if (matched) return "#e040a0";
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return `hsl(${20 + (h % 40)}, 80%, ${55 + (h % 15)}%)`;
}

function redraw() {
  const view = state.view;
  if (!view) return;
  const canvas = $("flame");
  const blocks = JSON.parse(view.layout(canvas.width, 1));
  state.blocks = blocks;
  const depth = blocks.reduce((d, b) => Math.max(d, b.depth + 1), 1);
  canvas.height = depth * ROW;
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
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
  canvas.dataset.frames = JSON.stringify(blocks.filter((b) => !b.folded).map((b) => b.name));
  canvas.dataset.blocks = JSON.stringify(blocks.map(({ name, x, width, depth }) => ({ name, x, width, depth })));
  const crumbs = JSON.parse(view.breadcrumbs());
  canvas.dataset.focus = crumbs[crumbs.length - 1].name;
  const nav = $("breadcrumbs");
  nav.replaceChildren();
  for (const c of crumbs) {
    const a = document.createElement("a");
    a.textContent = c.name;
    a.onclick = () => { view.focus(c.node); redraw(); };
    nav.append(a);
  }
  drawTable();
}

function blockAt(ev) {
  const canvas = $("flame");
  const rect = canvas.getBoundingClientRect();
  const x = (ev.clientX - rect.left) * (canvas.width / rect.width);
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
    redraw();
  }
}

function search() {
  if (!state.view) return;
  try {
    const r = JSON.parse(state.view.search($("search").value));
    $("search-share").textContent = r ? `${r.matching_nodes} frames match, ${r.covered_percent.toFixed(1)}% of the profile` : "";
    showError("");
  } catch (e) {
    showError(String(e));
  }
  redraw();
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
  $("table-pane").hidden = !table;
  $("flame-pane").hidden = table;
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
  $("flame").addEventListener("mousemove", hover);
  $("flame").addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
  $("flame").addEventListener("click", click);
  $("reset").onclick = () => { if (state.view) { state.view.reset(); redraw(); } };
  $("search").addEventListener("input", search);
  $("tab-flame").onclick = () => tab(false);
  $("tab-table").onclick = () => tab(true);
  for (const th of $("functions").tHead.rows[0].cells) {
    if (th.dataset.sort) th.onclick = () => { state.sort = th.dataset.sort; drawTable(); };
  }
  $("file").addEventListener("change", (ev) => openFile(ev.target.files[0]));
  document.addEventListener("dragover", (ev) => ev.preventDefault());
  document.addEventListener("drop", (ev) => { ev.preventDefault(); openFile(ev.dataTransfer.files[0]); });
  document.body.dataset.ready = "true";
}

main().catch((e) => showError(`The dashboard failed to start: ${e}`));
