// bulkhead's sidebar panel for ComfyUI: every bulkhead process on the
// machine (this ComfyUI, its workers, other instances and theirs) with what
// it holds, each device's total and free, and the recent releases and
// evictions.
//
// ComfyUI serves this directory (WEB_DIRECTORY in bulkhead/__init__.py) as
// /extensions/<package>/ and imports every .js file in it as a module.  The
// panel is a "custom" sidebar tab: render(el) builds plain DOM into el.  It
// polls GET /bulkhead/status (host/routes.py; the same document as
// `bulkhead status --json`) once a second while the tab is shown, and
// stops when ComfyUI unmounts it.  No build step, no external assets.
//
// Each process is one bar: the bytes it holds on its main device (the one
// it holds most on) relative to that device's total, with its models
// listed under it.  "Free worker memory" posts /bulkhead/free, which
// answers only after the workers released, with their before/after bytes;
// the panel shows the total and each worker's figures until the next press.
//
// Each poll is also a sample in a ring (module state, so it survives the
// tab being closed and opened; only shown time is sampled) of the last
// HISTORY_S seconds: per device, an SVG stacked area of what each process
// held, one series per process (this ComfyUI first, then by pid; a colour
// per pack that stays while the page lives), a legend, and the timeline's
// releases and evictions as marks on the time axis (hover: kind, process,
// bytes).  Labels wrap instead of being cut: ComfyUI's sidebar opens at
// 20 % of a splitter whose other panel asks for 100 %, which flexbox
// settles at about 16.5 % of the window (317 px at 1920 wide, 237 px at
// 1440; comfyui-frontend-package 1.27's LiteGraphCanvasSplitterOverlay).

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const POLL_MS = 1000;
const TOAST_LINE = 90;          // the most of one pack's line in the toast
const TIMELINE_SHOWN = 12;
const HISTORY_S = 300;          // the ring: the last 5 minutes of polls
const WINDOW_MIN_S = 30;        // the chart's time axis spans at least this
const GAP_S = 5;                // polls further apart than this: a gap in the chart
const CHART_H = 64;             // plot height in px (the axis goes below)
const HOST_COLOUR = "#e0a040";
const PALETTE = ["#4a9eff", "#5cc07a", "#c678dd", "#e06c75", "#56b6c2", "#d19a66",
  "#98c379", "#61afef", "#be5046", "#e5c07b"];

const STYLE = `
.bh-panel { font: 12px/1.4 var(--font-family, system-ui, sans-serif); color: var(--fg-color, #ddd);
  padding: 8px 10px; display: flex; flex-direction: column; gap: 10px; }
.bh-panel h3 { font-size: 12px; font-weight: 600; margin: 0 0 4px; text-transform: uppercase;
  letter-spacing: .04em; opacity: .75; }
.bh-row { display: grid; grid-template-columns: minmax(0, 1fr) auto; gap: 2px 8px; margin-bottom: 6px; }
.bh-label { min-width: 0; overflow-wrap: anywhere; }
.bh-sub { display: block; font-size: 11px; opacity: .6; }
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
.bh-freed { font-size: 11px; padding: 6px 8px; border-radius: 4px; background: var(--comfy-input-bg, #2b2b2b);
  border-left: 3px solid #5cc07a; }
.bh-freed-head { display: flex; gap: 8px; align-items: baseline; }
.bh-freed-head b { font-size: 12px; }
.bh-freed-head button { margin-left: auto; font: inherit; background: none; border: 0; color: inherit;
  opacity: .6; cursor: pointer; padding: 0 2px; }
.bh-freed ul { margin: 4px 0 0; padding-left: 14px; }
.bh-freed li { overflow-wrap: anywhere; font-variant-numeric: tabular-nums; }
.bh-freed .bh-kept { opacity: .8; }
.bh-chart { margin-bottom: 8px; }
.bh-chart-head { display: flex; justify-content: space-between; gap: 8px; font-size: 11px; opacity: .8;
  overflow-wrap: anywhere; }
.bh-chart svg { display: block; width: 100%; overflow: visible; }
.bh-chart svg text { fill: currentColor; font-size: 10px; opacity: .65; }
.bh-legend { list-style: none; margin: 2px 0 0; padding: 0; display: flex; flex-wrap: wrap; gap: 2px 10px;
  font-size: 11px; }
.bh-legend li { display: flex; align-items: baseline; gap: 4px; min-width: 0; overflow-wrap: anywhere; }
.bh-swatch { flex: none; width: 9px; height: 9px; border-radius: 2px; align-self: center; }
.bh-label .bh-swatch { display: inline-block; margin-right: 5px; }
.bh-error { color: #e07070; }
.bh-pack { grid-template-columns: minmax(0, 1fr) auto; border-left: 3px solid #5cc07a; padding-left: 6px; }
.bh-pack[data-state="in-process"] { border-left-color: #e0a040; }
.bh-pack[data-state="failed"], .bh-pack[data-state="refused"] { border-left-color: #e07070; }
.bh-pack[data-state="in-process"] .bh-figure { color: #e0a040; }
.bh-pack[data-state="failed"] .bh-figure, .bh-pack[data-state="refused"] .bh-figure { color: #e07070; }
.bh-pack[data-state="building"] { border-left-color: #6090d0; }
.bh-pack[data-state="building"] .bh-figure { color: #6090d0; }
.bh-pack .bh-meta { overflow-wrap: anywhere; user-select: text; }
.bh-progress { grid-column: 1 / -1; font-size: 11px; overflow-wrap: anywhere; color: #6090d0; }
.bh-progress .bh-sub { color: var(--fg-color, #ddd); }
.bh-pack-actions { grid-column: 1 / -1; display: flex; flex-wrap: wrap; gap: 4px 6px; margin-top: 2px; }
.bh-pack-actions button { font: inherit; font-size: 11px; padding: 1px 8px; cursor: pointer; border-radius: 4px;
  color: inherit; background: var(--comfy-input-bg, #333); border: 1px solid var(--border-color, #555); }
.bh-path { grid-column: 1 / -1; font: 11px/1.3 monospace; opacity: .75; overflow-wrap: anywhere;
  white-space: pre-wrap; user-select: all; }
.bh-log { font-size: 11px; padding: 6px 8px; border-radius: 4px; background: var(--comfy-input-bg, #2b2b2b);
  border-left: 3px solid #6090d0; min-width: 0; }
.bh-log pre { margin: 4px 0 0; max-height: 40vh; overflow: auto; white-space: pre-wrap; overflow-wrap: anywhere;
  font: 11px/1.3 monospace; user-select: text; }
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
      node("span", { class: "bh-label", title: d.name ? `${d.device} · ${d.name}` : d.device },
        d.device, d.name ? node("span", { class: "bh-sub" }, d.name) : null),
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
  const label = processLabel(doc, p);
  const since = p.idle_s === null || p.idle_s === undefined ? null : p.idle_s < 1 ? "<1" : String(Math.round(p.idle_s));
  const state = p.state === "idle" && since !== null ? `idle ${since} s` : p.state;
  const row = node("div", {
    class: "bh-row bh-proc" + (p.role === "worker" && p.host_pid ? " bh-worker" : ""),
    "data-bh-process": "", "data-pid": p.pid, "data-role": p.role, "data-pack": p.pack,
    "data-state": p.state, "data-held": p.held_bytes,
  },
  node("span", { class: "bh-label", title: `${label}: ${p.pack} (${p.role}, pid ${p.pid}, Python ${p.interpreter})` },
    node("span", { class: "bh-swatch", style: `background: ${colourOf(doc, p)}` }), label,
    node("span", { class: "bh-sub" }, `${p.role} · pid ${p.pid}`)),
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

// Newest first; a run of events of one kind and process that freed
// nothing (an idle worker's releases) is one line with its count, so the
// lines that moved bytes are the ones seen.
function foldEvents(events) {
  const out = [];
  for (const e of events) {
    const last = out[out.length - 1];
    if (!e.bytes && last && !last.bytes && last.kind === e.kind && last.process === e.process) last.count += 1;
    else out.push({ ...e, count: 1 });
  }
  return out;
}

function renderTimeline(doc) {
  const events = foldEvents((doc.timeline || []).slice().reverse()).slice(0, TIMELINE_SHOWN);
  const section = node("section", { class: "bh-events" }, node("h3", {}, "Releases and evictions"));
  if (!events.length) {
    section.append(node("div", { class: "bh-meta" }, "none yet"));
    return section;
  }
  const ol = node("ol", { class: "bh-timeline" });
  for (const e of events) {
    const t = new Date(e.time * 1000).toLocaleTimeString();
    ol.append(node("li", { "data-kind": e.kind, "data-count": e.count },
      `${t} ${e.kind} ${e.process}` + (e.bytes ? ` · ${formatBytes(e.bytes)}`
        : e.count > 1 ? ` ×${e.count} · nothing freed` : " · nothing freed")));
  }
  section.append(ol);
  return section;
}

// ------------------------------------------------------------ the history

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, String(v));
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

// The ring of samples: {t: unix seconds, held: {seriesKey: {device: bytes}}},
// oldest first, and what each series key names.  Module state: the tab can
// be closed and opened again without losing the last minutes.
const history = { samples: [], series: new Map(), colours: new Map() };

function seriesKey(p) {
  return `${p.role}:${p.pid}`;
}

// A stable colour: this ComfyUI's host is always orange; any other process
// gets the next palette colour the first time its pack (or, for another
// ComfyUI, its pid) is seen, and keeps it while the page lives -- a worker
// respawned with a new pid keeps its pack's colour.
function colourOf(doc, p) {
  if (p.role === "host" && p.pid === doc.host_pid) return HOST_COLOUR;
  const id = p.role === "host" ? `host:${p.pid}` : `pack:${p.pack}`;
  if (!history.colours.has(id)) history.colours.set(id, PALETTE[history.colours.size % PALETTE.length]);
  return history.colours.get(id);
}

function processLabel(doc, p) {
  if (p.role === "host") return p.pid === doc.host_pid ? "ComfyUI (this instance)" : "ComfyUI";
  return p.pack || p.role;
}

// The server's clock less this browser's, in seconds: the timeline's times
// are the server's, the samples are taken here.  From each status answer's
// Date header (whole seconds, so the largest of the recent differences is
// the closest); 0 until one is seen.
const skew = { recent: [] };

export function serverClockOffset(res, now = Date.now() / 1000) {
  const date = Date.parse(res && res.headers ? res.headers.get("Date") || "" : "") / 1000;
  if (Number.isFinite(date)) {
    skew.recent.push(date - now);
    if (skew.recent.length > 30) skew.recent.shift();
  }
  return skew.recent.length ? Math.max(...skew.recent) : 0;
}

// Adds one poll's document to the ring and drops what is older than HISTORY_S.
export function recordSample(doc, t = Date.now() / 1000) {
  const held = {};
  for (const p of doc.processes || []) {
    const key = seriesKey(p);
    const perDevice = {};
    for (const d of p.devices || []) {
      const row = deviceRow(doc.devices || [], d.device);
      const name = row ? row.device : d.device;
      perDevice[name] = (perDevice[name] || 0) + (d.held_bytes || 0);
    }
    held[key] = perDevice;
    history.series.set(key, { key, pid: p.pid, role: p.role, pack: p.pack, label: processLabel(doc, p),
      colour: colourOf(doc, p), host: p.role === "host" && p.pid === doc.host_pid });
  }
  history.samples.push({ t, held });
  const oldest = t - HISTORY_S;
  while (history.samples.length && history.samples[0].t < oldest) history.samples.shift();
  const live = new Set(history.samples.flatMap((smp) => Object.keys(smp.held)));
  for (const key of [...history.series.keys()]) if (!live.has(key)) history.series.delete(key);
}

// The series drawn on each device: every process seen in the window (one
// that holds nothing there draws an empty area and a "0 B" legend entry),
// this ComfyUI first, then other hosts, then workers, each by pid.
function seriesInWindow() {
  const rank = (s) => (s.host ? 0 : s.role === "host" ? 1 : 2);
  return [...history.series.values()].sort((a, b) => rank(a) - rank(b) || a.pid - b.pid);
}

function niceCeil(n) {
  if (n <= 0) return 1 << 20;
  const p = Math.pow(2, Math.floor(Math.log2(n)));
  for (const m of [1, 1.25, 1.5, 2]) if (p * m >= n) return p * m;
  return 2 * p;
}

function spanLabel(s) {
  return s >= 60 ? `−${Math.round(s / 60)} min` : `−${Math.round(s)} s`;
}

// One device's chart: stacked areas (one <path data-bh-series> per process),
// the timeline's events in the window as marks on the time axis, a legend.
function renderChart(doc, device, width) {
  const series = seriesInWindow();
  const samples = history.samples;
  const now = samples.length ? samples[samples.length - 1].t : Date.now() / 1000;
  const span = Math.min(HISTORY_S, Math.max(WINDOW_MIN_S, now - (samples.length ? samples[0].t : now)));
  const t0 = now - span;
  const W = Math.max(120, Math.floor(width));
  const H = CHART_H;
  const x = (t) => Math.max(0, Math.min(W, ((t - t0) / span) * W));
  let top = 0;
  for (const smp of samples) {
    let sum = 0;
    for (const s of series) sum += (smp.held[s.key] || {})[device] || 0;
    top = Math.max(top, sum);
  }
  const ymax = niceCeil(top * 1.05);
  const y = (b) => H - (b / ymax) * H;

  const plot = svg("g", {});
  plot.append(svg("line", { x1: 0, x2: W, y1: H + 0.5, y2: H + 0.5, stroke: "currentColor", "stroke-opacity": 0.35 }),
    svg("line", { x1: 0, x2: W, y1: 0.5, y2: 0.5, stroke: "currentColor", "stroke-opacity": 0.12,
      "stroke-dasharray": "2 3" }));
  const base = samples.map(() => 0);
  const runs = [];
  samples.forEach((smp, i) => {
    if (i && smp.t - samples[i - 1].t <= GAP_S) runs[runs.length - 1][1] = i;
    else runs.push([i, i]);
  });
  for (const s of series) {
    const upper = samples.map((smp, i) => base[i] + ((smp.held[s.key] || {})[device] || 0));
    // one closed area per run of samples: where the tab was hidden (no
    // polls) the area breaks instead of drawing a line across the gap; a
    // run of one sample is a 3 px bar, so a first look is not empty
    let d = "";
    for (const [a, b] of runs) {
      if (a === b) {
        const x1 = Math.max(3, x(samples[a].t));
        d += `M${(x1 - 3).toFixed(1)},${y(upper[a]).toFixed(1)}H${x1.toFixed(1)}V${y(base[a]).toFixed(1)}` +
          `H${(x1 - 3).toFixed(1)}Z`;
        continue;
      }
      for (let i = a; i <= b; i++) d += `${i === a ? "M" : "L"}${x(samples[i].t).toFixed(1)},${y(upper[i]).toFixed(1)}`;
      for (let i = b; i >= a; i--) d += `L${x(samples[i].t).toFixed(1)},${y(base[i]).toFixed(1)}`;
      d += "Z";
    }
    const now_b = upper[upper.length - 1] - base[base.length - 1];
    plot.append(svg("path", { d, fill: s.colour, "fill-opacity": 0.75, stroke: s.colour, "stroke-width": 1,
      "data-bh-series": "", "data-pid": s.pid, "data-pack": s.pack, "data-role": s.role },
    svg("title", {}, `${s.label} (${s.role}, pid ${s.pid}): ${formatBytes(now_b)} on ${device} now`)));
    upper.forEach((v, i) => { base[i] = v; });
  }
  const byPack = new Map([...history.series.values()].map((s) => [s.pack, s]));
  const marks = svg("g", {});
  let nmarks = 0;
  for (const e of doc.timeline || []) {
    if (e.time < t0 || e.time > now + 5) continue;
    const s = byPack.get(e.process);
    const colour = s ? s.colour : "#bbb";
    const cx = x(Math.min(e.time, now));
    const when = new Date(e.time * 1000).toLocaleTimeString();
    marks.append(svg("g", { "data-bh-mark": "", "data-kind": e.kind, "data-process": e.process, "data-bytes": e.bytes },
      svg("title", {}, `${when} ${e.kind} · ${e.process}` + (e.bytes ? ` · ${formatBytes(e.bytes)}` : "")),
      svg("line", { x1: cx, x2: cx, y1: 0, y2: H, stroke: colour, "stroke-opacity": 0.45, "stroke-dasharray": "2 2" }),
      svg("path", { d: `M${cx.toFixed(1)},${H + 1}l-4,7h8z`, fill: colour, stroke: "#111", "stroke-width": 0.5 }),
      // a wider invisible target, so the tooltip is easy to hover
      svg("rect", { x: cx - 5, y: 0, width: 10, height: H + 9, fill: "transparent" })));
    nmarks++;
  }
  const axis = svg("g", {},
    svg("text", { x: 0, y: H + 19 }, spanLabel(span)),
    svg("text", { x: W, y: H + 19, "text-anchor": "end" }, "now"));
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H + 22}`, width: W, height: H + 22, role: "img",
    "aria-label": `bytes held on ${device} by each process, the last ${spanLabel(span).slice(1)}`,
    "data-bh-chart": "", "data-device": device, "data-series": series.length, "data-marks": nmarks,
    "data-samples": samples.length }, plot, marks, axis);

  const legend = node("ul", { class: "bh-legend" });
  for (const s of series) {
    const last = samples.length ? (samples[samples.length - 1].held[s.key] || {})[device] || 0 : 0;
    legend.append(node("li", { "data-bh-legend": "", "data-pid": s.pid, "data-pack": s.pack,
      title: `${s.label} (${s.role}, pid ${s.pid}): ${formatBytes(last)} on ${device} now` },
    node("span", { class: "bh-swatch", style: `background: ${s.colour}` }),
    node("span", {}, `${s.role === "host" ? (s.host ? "ComfyUI" : "ComfyUI " + s.pid) : s.label} ${formatBytes(last)}`)));
  }
  return node("div", { class: "bh-chart", "data-device": device },
    node("div", { class: "bh-chart-head" }, node("span", {}, device), node("span", {}, `peak ${formatBytes(top)}`)),
    chart, series.length ? legend : node("div", { class: "bh-meta" }, "nothing held here in the window"));
}

// A chart per device that any process held bytes on in the window (the
// CPU's when none did, so the section is never empty).
function renderHistory(doc, width) {
  const section = node("section", { class: "bh-history" }, node("h3", {}, "Held over time"));
  const devices = new Set();
  for (const smp of history.samples) {
    for (const per of Object.values(smp.held)) for (const [dev, b] of Object.entries(per)) if (b > 0) devices.add(dev);
  }
  const order = (doc.devices || []).map((d) => d.device);
  const list = [...devices].sort((a, b) => order.indexOf(a) - order.indexOf(b));
  for (const dev of list.length ? list : ["cpu"]) section.append(renderChart(doc, dev, width));
  return section;
}

// ------------------------------------------------------------ what /free gave back

// What a worker still holds after its full release (state "released": the
// whole ladder ran) is what ComfyUI references: its cached node outputs,
// arrays in the worker's shared-memory blocks and objects behind handles,
// which no release can take while ComfyUI holds them.  They go when
// ComfyUI drops its cache ("Unload Models and Execution Cache" in its
// frontend, "Free model and node cache" in older ones: POST /free with
// free_memory).  Returns those bytes, or 0.
export function hostHeld(row) {
  return row.state === "released" && row.after_bytes > 0 ? row.after_bytes : 0;
}

// The /bulkhead/free answer as a box: the total, then each process's
// freed bytes (before -> after) or why it was not released.
export function renderFreed(r, onDismiss) {
  const rows = r.processes || [];
  const released = rows.filter((row) => row.freed_bytes > 0).length;
  const dismiss = node("button", { type: "button", title: "hide", "aria-label": "hide" }, "✕");
  if (onDismiss) dismiss.addEventListener("click", onDismiss);
  const box = node("div", { class: "bh-freed", "data-bh-freed": "", "data-freed-bytes": r.freed_bytes },
    node("div", { class: "bh-freed-head" },
      node("span", {}, "Freed ", node("b", {}, formatBytes(r.freed_bytes)),
        ` from ${released} of ${rows.length} worker${rows.length === 1 ? "" : "s"}`),
      dismiss));
  if (!rows.length) box.append(node("div", { class: "bh-meta" }, "this ComfyUI has no running workers"));
  const ul = node("ul", {});
  for (const row of rows) {
    const li = node("li", { "data-pid": row.pid, "data-pack": row.pack, "data-freed-bytes": row.freed_bytes,
      "data-state": row.state, title: row.error || null },
    `${row.pack} · pid ${row.pid}: ${formatBytes(row.freed_bytes)} ` +
      `(${formatBytes(row.before_bytes)} → ${formatBytes(row.after_bytes)})` +
      (row.state === "exited" ? " · idle, stopped: every byte back" : ""));
    if (row.error) li.append(node("span", { class: "bh-sub bh-error" }, `${row.state}: ${row.error}`));
    const kept = hostHeld(row);
    if (kept) {
      li.dataset.hostHeldBytes = kept;
      li.append(node("span", { class: "bh-sub bh-kept", "data-bh-kept": "" },
        `${formatBytes(kept)} stays: it is ComfyUI's cached node output, kept in this worker, ` +
          "and is freed when ComfyUI drops its cache (“Unload Models and Execution Cache”)."));
    }
    ul.append(li);
  }
  if (rows.length) box.append(ul);
  return box;
}

// Where each pack bulkhead serves stands (GET /bulkhead/status "packs",
// those not isolated first): isolated, with its interpreter and worker
// (and its update's rebuild, where its config changed); building, with
// its phase (its environment builds in the background);
// in-process (running in ComfyUI's own process, not in its environment),
// with why and the fix; refused (its nodes listed, refusing to run: ComfyUI's
// process is not the same as its environment), with why and the fix;
// failed, with why.
function renderPacks(doc) {
  const packs = doc.packs || [];
  if (!packs.length) return null;
  const section = node("section", { class: "bh-packs" }, node("h3", {}, "Packs"));
  for (const p of packs) {
    const label = node("span", { class: "bh-label" }, p.name);
    let figure;
    let meta;
    if (p.state === "isolated") {
      figure = "isolated";
      meta = `${p.python}${p.pid ? ` · worker ${p.pid}` : " · no worker running"}` +
        (p.sandbox ? ` · ${p.sandbox.words}` : "") +
        (p.rebuild ? ` · update: ${p.rebuild}` : "") +
        (p.warning ? ` · ${p.warning.replace(/\.?$/, ".")}${p.fix ? ` Fix: ${p.fix}` : ""}` : "");
    } else if (p.state === "building") {
      figure = "building";
      meta = `${p.reason}${p.phase ? ` · ${p.phase}` : ""}`;
    } else {
      figure = p.state === "failed" ? "FAILED" : p.state === "refused" ? "REFUSED: its nodes do not run" :
        "in-process, NOT isolated";
      meta = p.reason.replace(/\.?$/, ".") + (p.fix ? ` Fix: ${p.fix}` : "");
    }
    const row = node("div", { class: "bh-row bh-pack", "data-bh-pack": p.name, "data-state": p.state },
      label, node("span", { class: "bh-figure" }, figure),
      node("div", { class: (p.state === "isolated" && !p.warning) || p.state === "building" ? "bh-meta" : "bh-meta bh-error" },
        meta));
    row.append(...packBuild(p));
    section.append(row);
  }
  return section;
}

// What a pack's row shows of its builds (GET /bulkhead/status "actions",
// "log", "phase", "progress": host/building.py annotate): while one runs,
// its phase and the last line of the command it runs; the fix as a
// button where one exists (Build, Retry, Rebuild: POST /bulkhead/build)
// and "Show log" (GET /bulkhead/log) where it has a build log, whose path
// is shown whole, wrapped and selectable as one piece.
const ACTION_LABELS = { build: "Build", retry: "Retry", rebuild: "Rebuild" };

export function packBuild(p) {
  const out = [];
  if (p.building || (p.state === "building" && p.phase)) {
    out.push(node("div", { class: "bh-progress", "data-bh-progress": "" },
      p.building && p.building !== "new" ? `${p.building}: ${p.phase || "queued"}` : p.phase || "queued",
      p.progress ? node("span", { class: "bh-sub" }, p.progress) : null));
  }
  const buttons = (p.actions || []).map((a) => node("button", { type: "button", "data-bh-action": a,
    "data-pack": p.name, title: `POST /bulkhead/build: ${a} the environment of ${p.name} in the background` },
  ACTION_LABELS[a] || a));
  if (p.log) {
    buttons.push(node("button", { type: "button", "data-bh-action": "log", "data-pack": p.name,
      title: `GET /bulkhead/log: the whole output of ${p.name}'s newest build` }, "Show log"));
  }
  if (buttons.length) out.push(node("div", { class: "bh-pack-actions" }, ...buttons));
  if (p.log) out.push(node("code", { class: "bh-path", "data-bh-log-path": "", title: "its newest build's log" }, p.log));
  return out;
}

// A build log (GET /bulkhead/log) in a box of its own, kept across polls.
export function renderLog(r, onDismiss) {
  const dismiss = node("button", { type: "button", title: "hide", "aria-label": "hide" }, "✕");
  if (onDismiss) dismiss.addEventListener("click", onDismiss);
  return node("div", { class: "bh-log", "data-bh-log": "", "data-pack": r.pack },
    node("div", { class: "bh-freed-head" }, node("b", {}, `${r.pack}: build log`), dismiss),
    node("code", { class: "bh-path", "data-bh-log-path": "" }, r.path),
    r.truncated ? node("div", { class: "bh-meta" }, "(its end: the whole file is at the path above)") : null,
    node("pre", { "data-bh-log-text": "" }, r.text));
}

export function renderStatus(body, doc) {
  const width = body.clientWidth || 280;
  const procs = node("section", { class: "bh-processes" }, node("h3", {}, "Processes"));
  if (!(doc.processes || []).length) procs.append(node("div", { class: "bh-meta" }, "no bulkhead processes"));
  for (const p of doc.processes || []) procs.append(renderProcess(doc, p));
  const parts = [renderPacks(doc), renderDevices(doc), renderHistory(doc, width), procs, renderTimeline(doc)];
  body.replaceChildren(...parts.filter((x) => x !== null));
}

function mount(el) {
  const style = node("style", {}, STYLE);
  const body = node("div", { class: "bh-body" });
  const status = node("span", { class: "bh-status" }, "loading…");
  const free = node("button", { type: "button", "data-bh-free": "",
    title: "POST /bulkhead/free: every worker of this ComfyUI runs its full release" }, "Free worker memory");
  const freed = node("div", { class: "bh-freed-slot" });
  const logSlot = node("div", { class: "bh-log-slot" });
  const panel = node("div", { class: "bh-panel", "data-bh-panel": "" },
    node("div", { class: "bh-actions" }, free, status), freed, logSlot, body);
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
      recordSample(doc, Date.now() / 1000 + serverClockOffset(res));
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
    freed.replaceChildren();
    status.textContent = "freeing…";
    try {
      const res = await api.fetchApi("/bulkhead/free", { method: "POST", body: "{}",
        headers: { "Content-Type": "application/json" } });
      const r = await res.json();
      if (!res.ok) throw new Error(r.error || `HTTP ${res.status}`);
      freed.replaceChildren(renderFreed(r, () => freed.replaceChildren()));
      status.textContent = "";
      status.classList.remove("bh-error");
    } catch (e) {
      status.textContent = String(e.message || e);
      status.classList.add("bh-error");
    } finally {
      free.disabled = false;
      tick();
    }
  });
  // A pack's buttons (packBuild): its build asked, or its log shown.
  body.addEventListener("click", async (event) => {
    const button = event.target.closest && event.target.closest("[data-bh-action]");
    if (!button) return;
    const pack = button.dataset.pack;
    const action = button.dataset.bhAction;
    button.disabled = true;
    try {
      if (action === "log") {
        const res = await api.fetchApi(`/bulkhead/log?pack=${encodeURIComponent(pack)}`);
        const r = await res.json();
        if (!res.ok) throw new Error(r.error || `HTTP ${res.status}`);
        logSlot.replaceChildren(renderLog(r, () => logSlot.replaceChildren()));
        const pre = logSlot.querySelector("pre");
        if (pre) pre.scrollTop = pre.scrollHeight;      // its end first: where a build fails
        status.textContent = "";
      } else {
        const res = await api.fetchApi("/bulkhead/build", { method: "POST", body: JSON.stringify({ pack, action }),
          headers: { "Content-Type": "application/json" } });
        const r = await res.json();
        if (!res.ok) throw new Error(r.error || `HTTP ${res.status}`);
        status.textContent = `${pack}: ${action} started`;
      }
      status.classList.remove("bh-error");
    } catch (e) {
      status.textContent = String(e.message || e);
      status.classList.add("bh-error");
    } finally {
      button.disabled = false;
      tick();
    }
  });
  tick();
  timer = setInterval(tick, POLL_MS);
  return stop;
}

// Once per page load, a notice in ComfyUI's toast (the frontend's
// app.extensionManager.toast, where it has one) when a pack bulkhead serves
// is not isolated: it runs in ComfyUI's own process, or failed.  Not
// awaited by setup: the page never waits for it.
async function noticeNotIsolated() {
  const toast = app.extensionManager && app.extensionManager.toast;
  if (!toast || typeof toast.add !== "function") return;
  let doc;
  try {
    const res = await api.fetchApi("/bulkhead/status");
    if (!res.ok) return;
    doc = await res.json();
  } catch (e) {
    return; // the panel shows what went wrong when it is opened
  }
  const lost = (doc.packs || []).filter((p) => (p.state !== "isolated" || p.warning) && p.state !== "building");
  if (!lost.length) return;
  const lines = lost.map((p) => `${p.name}: ${p.state === "failed" ? "FAILED" : p.state === "isolated" ?
    "isolated, without torch" : p.state === "refused" ? "REFUSED, its nodes do not run" :
    "runs in ComfyUI's process"}` + (p.reason ? ` (${p.reason})` : ""));
  const partial = lost.every((p) => p.state === "isolated");
  toast.add({
    severity: lost.some((p) => p.state === "failed" || p.state === "refused") ? "error" : "warn",
    summary: partial ? `bulkhead: ${lost.length} pack${lost.length === 1 ? "" : "s"} cannot run every node` :
      `bulkhead: ${lost.length} pack${lost.length === 1 ? "" : "s"} NOT isolated`,
    // one short line per pack: the reason and the fix are the panel's (its Packs section)
    detail: lines.map((l) => (l.length > TOAST_LINE ? l.slice(0, TOAST_LINE - 1) + "…" : l)).join("\n") +
      "\nThe bulkhead panel (sidebar) has each one's reason, fix and buttons.",
    life: 20000,
  });
}

let unmount = null;

// A pack whose environment was built in the background is ready: its
// nodes are in ComfyUI's list now (bulkhead.pack_ready, host/building.py);
// the frontend reads its node definitions again, as its own refresh does.
function onPackReady(event) {
  const d = event.detail || {};
  console.info(`bulkhead: pack ${d.pack} is ready (${(d.nodes || []).length} node types)`);
  if (typeof app.refreshComboInNodes === "function") app.refreshComboInNodes();
}

app.registerExtension({
  name: "bulkhead.panel",
  async setup() {
    noticeNotIsolated();
    if (typeof api.addEventListener === "function") api.addEventListener("bulkhead.pack_ready", onPackReady);
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
