// bulkhead's sidebar panel for ComfyUI: every bulkhead process on the
// machine (this ComfyUI, its workers, other instances and theirs) with what
// it holds, each device's total and free, and the recent releases and
// evictions.
//
// ComfyUI serves this directory (WEB_DIRECTORY in bulkhead/__init__.py) as
// /extensions/<package>/ and imports every .js file in it as a module.  The
// panel is a "custom" sidebar tab: render(el) builds plain DOM into el.  It
// polls GET /bulkhead/status (comfy_routes.py; the same document as
// `bulkhead status --json`) once a second while the tab is shown, and
// stops when ComfyUI unmounts it.  No build step, no external assets.
//
// Each process is one bar: the bytes it holds on its main device (the one
// it holds most on) relative to that device's total, with its models
// listed under it.  "Free worker memory" posts /bulkhead/free, which
// answers only after the workers released, with their before/after bytes.

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const POLL_MS = 1000;
const TIMELINE_SHOWN = 12;

const STYLE = `
.bh-panel { font: 12px/1.4 var(--font-family, system-ui, sans-serif); color: var(--fg-color, #ddd);
  padding: 8px 10px; display: flex; flex-direction: column; gap: 10px; }
.bh-panel h3 { font-size: 12px; font-weight: 600; margin: 0 0 4px; text-transform: uppercase;
  letter-spacing: .04em; opacity: .75; }
.bh-row { display: grid; grid-template-columns: minmax(0, 1fr) auto; gap: 2px 8px; margin-bottom: 6px; }
.bh-label { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.bh-figure { text-align: right; white-space: nowrap; opacity: .85; font-variant-numeric: tabular-nums; }
.bh-bar { grid-column: 1 / -1; height: 8px; border-radius: 4px;
  background: var(--comfy-input-bg, #333); overflow: hidden; }
.bh-fill { height: 100%; background: var(--p-primary-color, #4a9eff); min-width: 1px; }
.bh-device .bh-fill { background: #8a8f98; }
.bh-proc[data-role="host"] .bh-fill { background: #e0a040; }
.bh-proc[data-state="busy"] .bh-fill { background: #5cc07a; }
.bh-proc[data-state="releasing"] .bh-fill { background: #d06060; }
.bh-worker { padding-left: 12px; }
.bh-meta { grid-column: 1 / -1; opacity: .7; font-size: 11px; }
.bh-models { grid-column: 1 / -1; margin: 0; padding-left: 14px; font-size: 11px; opacity: .85; }
.bh-timeline { margin: 0; padding-left: 16px; font-size: 11px; }
.bh-timeline li { font-variant-numeric: tabular-nums; }
.bh-actions { display: flex; gap: 8px; align-items: center; }
.bh-actions button { font: inherit; padding: 3px 10px; cursor: pointer; border-radius: 4px;
  color: inherit; background: var(--comfy-input-bg, #333); border: 1px solid var(--border-color, #555); }
.bh-status { font-size: 11px; opacity: .7; }
.bh-error { color: #e07070; }
`;

export function formatBytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return (i === 0 ? String(v) : v.toFixed(v >= 100 ? 0 : 1)) + " " + units[i];
}

function node(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("data-")) e.setAttribute(k, String(v));
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function bar(fraction) {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  return node("div", { class: "bh-bar" }, node("div", { class: "bh-fill", style: `width: ${pct.toFixed(1)}%` }));
}

// The device row a process's device name refers to: by name ("cpu",
// "cuda:0"), or by UUID for names of the form "cuda:GPU-...".
function deviceRow(devices, name) {
  const byName = devices.find((d) => d.device === name);
  if (byName) return byName;
  if (name && name.startsWith("cuda:")) {
    const id = name.slice(5).toLowerCase();
    return devices.find((d) => d.uuid && d.uuid.toLowerCase() === id) || null;
  }
  return null;
}

function mainDevice(proc) {
  let best = null;
  for (const d of proc.devices || []) if (!best || d.held_bytes > best.held_bytes) best = d;
  return best;
}

function renderDevices(doc) {
  const section = node("section", { class: "bh-devices" }, node("h3", {}, "Devices"));
  for (const d of doc.devices || []) {
    const used = Math.max(0, d.total_bytes - d.free_bytes);
    section.append(node("div", { class: "bh-row bh-device", "data-device": d.device },
      node("span", { class: "bh-label", title: d.name || d.device }, d.name ? `${d.device} · ${d.name}` : d.device),
      node("span", { class: "bh-figure" }, `${formatBytes(d.free_bytes)} free of ${formatBytes(d.total_bytes)}`),
      bar(d.total_bytes ? used / d.total_bytes : 0)));
  }
  if (doc.gpu_error) {
    const short = doc.gpu_error.startsWith("no NVIDIA driver") ? "no NVIDIA driver: no GPU rows" : doc.gpu_error;
    section.append(node("div", { class: "bh-meta", title: doc.gpu_error }, short));
  }
  if (doc.ram_error) section.append(node("div", { class: "bh-meta bh-error" }, doc.ram_error));
  return section;
}

function renderProcess(doc, p) {
  const main = mainDevice(p);
  const dev = main ? deviceRow(doc.devices || [], main.device) : null;
  const total = dev ? dev.total_bytes : 0;
  const label = p.role === "host" ? (p.pid === doc.host_pid ? "ComfyUI (this instance)" : "ComfyUI") : p.pack || p.role;
  const since = p.idle_s === null || p.idle_s === undefined ? null : p.idle_s < 1 ? "<1" : String(Math.round(p.idle_s));
  const state = p.state === "idle" && since !== null ? `idle ${since} s` : p.state;
  const row = node("div", {
    class: "bh-row bh-proc" + (p.role === "worker" && p.host_pid ? " bh-worker" : ""),
    "data-bh-process": "", "data-pid": p.pid, "data-role": p.role, "data-pack": p.pack,
    "data-state": p.state, "data-held": p.held_bytes,
  },
  node("span", { class: "bh-label", title: `${p.pack} (${p.role}, pid ${p.pid}, Python ${p.interpreter})` },
    `${label} `, node("span", { class: "bh-meta-inline", style: "opacity:.6" }, `${p.role} · pid ${p.pid}`)),
  node("span", { class: "bh-figure" }, formatBytes(p.held_bytes) + (dev ? ` of ${dev.device}` : "")),
  bar(total ? p.held_bytes / total : 0),
  node("span", { class: "bh-meta" },
    `${state} · gen ${p.generation} · py ${p.interpreter}` +
    (p.release_count ? ` · ${p.release_count} release${p.release_count === 1 ? "" : "s"} (${formatBytes(p.released_bytes)})` : "")));
  if ((p.models || []).length) {
    const ul = node("ul", { class: "bh-models" });
    for (const m of p.models) {
      ul.append(node("li", { "data-model": m.name },
        `${m.name}: ${formatBytes(m.resident_bytes)} of ${formatBytes(m.size_bytes)} on ${m.device}`));
    }
    row.append(ul);
  }
  return row;
}

function renderTimeline(doc) {
  const events = (doc.timeline || []).slice(-TIMELINE_SHOWN).reverse();
  const section = node("section", { class: "bh-events" }, node("h3", {}, "Releases and evictions"));
  if (!events.length) {
    section.append(node("div", { class: "bh-meta" }, "none yet"));
    return section;
  }
  const ol = node("ol", { class: "bh-timeline" });
  for (const e of events) {
    const t = new Date(e.time * 1000).toLocaleTimeString();
    ol.append(node("li", { "data-kind": e.kind },
      `${t} ${e.kind} ${e.process}` + (e.bytes ? ` · ${formatBytes(e.bytes)}` : "")));
  }
  section.append(ol);
  return section;
}

export function renderStatus(body, doc) {
  const procs = node("section", { class: "bh-processes" }, node("h3", {}, "Processes"));
  if (!(doc.processes || []).length) procs.append(node("div", { class: "bh-meta" }, "no bulkhead processes"));
  for (const p of doc.processes || []) procs.append(renderProcess(doc, p));
  body.replaceChildren(renderDevices(doc), procs, renderTimeline(doc));
}

function mount(el) {
  const style = node("style", {}, STYLE);
  const body = node("div", { class: "bh-body" });
  const status = node("span", { class: "bh-status" }, "loading…");
  const free = node("button", { type: "button", title: "POST /bulkhead/free: every worker of this ComfyUI runs its full release" }, "Free worker memory");
  const panel = node("div", { class: "bh-panel", "data-bh-panel": "" },
    node("div", { class: "bh-actions" }, free, status), body);
  el.replaceChildren(style, panel);

  let timer = null;
  let inflight = false;

  const visible = () => el.isConnected && !document.hidden;
  const stop = () => {
    if (timer !== null) clearInterval(timer);
    timer = null;
  };
  const tick = async () => {
    if (!el.isConnected) return stop();
    if (!visible() || inflight) return;
    inflight = true;
    try {
      const res = await api.fetchApi("/bulkhead/status");
      if (!res.ok) throw new Error(`GET /bulkhead/status: HTTP ${res.status}`);
      const doc = await res.json();
      renderStatus(body, doc);
      status.textContent = `updated ${new Date().toLocaleTimeString()}`;
      status.classList.remove("bh-error");
    } catch (e) {
      status.textContent = String(e.message || e);
      status.classList.add("bh-error");
    } finally {
      inflight = false;
    }
  };
  free.addEventListener("click", async () => {
    free.disabled = true;
    status.textContent = "freeing…";
    try {
      const res = await api.fetchApi("/bulkhead/free", { method: "POST", body: "{}",
        headers: { "Content-Type": "application/json" } });
      const r = await res.json();
      if (!res.ok) throw new Error(r.error || `HTTP ${res.status}`);
      status.textContent = `freed ${formatBytes(r.freed_bytes)} from ${r.processes.length} workers`;
      status.classList.remove("bh-error");
    } catch (e) {
      status.textContent = String(e.message || e);
      status.classList.add("bh-error");
    } finally {
      free.disabled = false;
      tick();
    }
  });
  tick();
  timer = setInterval(tick, POLL_MS);
  return stop;
}

let unmount = null;

app.registerExtension({
  name: "bulkhead.panel",
  async setup() {
    app.extensionManager.registerSidebarTab({
      id: "bulkhead",
      icon: "pi pi-server",
      title: "bulkhead",
      tooltip: "bulkhead: memory of every process",
      type: "custom",
      render: (el) => {
        if (unmount) unmount();
        unmount = mount(el);
      },
      destroy: () => {
        if (unmount) unmount();
        unmount = null;
      },
    });
  },
});
