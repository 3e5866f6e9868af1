"""The ComfyUI sidebar panel (web/bulkhead.js) in a real headless Chromium.

A host process with two real workers holding RAM serves, on localhost, the
stub PromptServer with bulkhead installed (its /api/bulkhead/status reads
the real ledger), the panel from the built package's web/ directory as
ComfyUI would (/extensions/bulkhead/), and a page with a tiny stand-in for
ComfyUI's frontend: /scripts/app.js (registerExtension, and
extensionManager.registerSidebarTab) and /scripts/api.js (fetchApi with the
/api prefix).  Chromium (Debian's package; `make chromium` installs it when
absent) loads the page with a virtual-time budget, so the panel's
one-second polling runs several times, and dumps the DOM; the test checks
one bar per process with its pack, its models and the eviction in the
timeline; then, with the page pressing "Free worker memory" (?press=<ms>),
the freed bytes shown, the history chart's series and marks, and that no
label is cut at the sidebar's default width (SIDEBAR_PX).  A screenshot is
taken too: BULKHEAD_PANEL_SCREENSHOT=<path> keeps it;
BULKHEAD_PANEL_SCREENSHOT_FREED=<path> takes one of a worker growing while
the panel watches, then the button pressed (docs/panel.png was made that
way).
"""

import html.parser
import json
import os
import shutil

import pytest

from routes_env import routes_scenario

MiB = 1 << 20
# ComfyUI's sidebar opens at 20 % of its splitter beside a panel asking for
# 100 %: flexbox settles it at ~16.5 % of the window, 317 px at 1920 wide
# (comfyui-frontend-package 1.27, LiteGraphCanvasSplitterOverlay).
SIDEBAR_PX = 317

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (`make chromium` installs "
                                                "Debian's package when it can: root and network needed)"),
]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>bulkhead panel</title>
<style>
  :root { --fg-color: #e0e0e0; --comfy-input-bg: #2b2b2b; --border-color: #4a4a4a;
          --p-primary-color: #4a9eff; }
  body { margin: 0; background: #202020; }
  #sidebar { width: %dpx; min-height: 100vh; background: #171717; border-right: 1px solid #333; }
</style></head>
<body><div id="sidebar"></div>
<script type="module">
  import { app } from "/scripts/app.js";
  await import("/extensions/bulkhead/bulkhead.js");
  await app.ready;
  const tab = app.extensionManager.tabs.find((t) => t.id === "bulkhead");
  document.body.dataset.tabs = app.extensionManager.tabs.map((t) => `${t.id}:${t.type}`).join(",");
  tab.render(document.getElementById("sidebar"));
  // ?press=<ms>: press "Free worker memory" that long after the panel shows
  const press = Number(new URLSearchParams(location.search).get("press") || 0);
  if (press) setTimeout(() => document.querySelector("[data-bh-free]").click(), press);
  // what a user cannot read: a box whose content is wider than it (inline
  // boxes have no client width: their block parents are measured)
  const measure = () => {
    const cut = [];
    for (const e of document.querySelectorAll("[data-bh-panel], [data-bh-panel] *")) {
      if (e instanceof SVGElement || !e.clientWidth) continue;
      if (e.scrollWidth > e.clientWidth) cut.push(`${e.tagName}.${e.className}: ${e.textContent.slice(0, 60)}`);
    }
    document.body.dataset.cut = JSON.stringify(cut);
    document.body.dataset.toasts = JSON.stringify(app.extensionManager.toast.added);
    document.body.dataset.measured = String(Number(document.body.dataset.measured || 0) + 1);
  };
  setInterval(measure, 250);
</script></body></html>
""" % SIDEBAR_PX

# What the panel imports from ComfyUI's frontend, reduced to what it uses.
APP_JS = """
const tabs = [];
const setups = [];
export const app = {
  extensions: [],
  // the frontend's toast store: what was added, in order
  extensionManager: { tabs, registerSidebarTab(tab) { tabs.push(tab); }, toast: { added: [], add(m) { this.added.push(m); } } },
  registerExtension(ext) {
    this.extensions.push(ext);
    setups.push(Promise.resolve(ext.setup ? ext.setup(this) : undefined));
  },
  get ready() { return Promise.all(setups); },
};
"""
API_JS = """
export const api = { fetchApi: (route, options) => fetch("/api" + route, options) };
"""

SERVE_PAGE = f"""
PAGE, APP_JS, API_JS = {PAGE!r}, {APP_JS!r}, {API_JS!r}
polls = []

frees = []   # the /bulkhead/free answers the panel got
on_poll = []  # callables run (off the loop) with the poll's count, before it is answered

@web.middleware
async def count_polls(request, handler):
    if request.path == "/api/bulkhead/status":
        polls.append(time.monotonic())
        for fn in on_poll:
            await asyncio.get_running_loop().run_in_executor(None, fn, len(polls))
    response = await handler(request)
    if request.path == "/api/bulkhead/free":
        frees.append(json.loads(response.body))
    return response
srv.app.middlewares.append(count_polls)

async def page(request):
    return web.Response(text=PAGE, content_type="text/html")

async def app_js(request):
    return web.Response(text=APP_JS, content_type="text/javascript")

async def api_js(request):
    return web.Response(text=API_JS, content_type="text/javascript")

srv.routes.get("/")(page)
srv.routes.get("/scripts/app.js")(app_js)
srv.routes.get("/scripts/api.js")(api_js)
# what ComfyUI's load_custom_node does with the package's WEB_DIRECTORY
nodes.EXTENSION_WEB_DIRS["bulkhead"] = os.path.join(os.path.dirname(bulkhead.__file__), bulkhead.WEB_DIRECTORY)
"""


def two_workers(pack_b):
    """Scenario lines: workers a ("pack-a", 672 MiB in two models) and b
    (pack_b, 256 MiB held of 352), whose "Scratch" ComfyUI evicted through
    its stand-in as upstream's free_memory does (unloaded, then dropped
    from the list): the timeline has the eviction.  One line: the caller
    indents it."""
    return "; ".join([
        f'a, b = worker("pack-a"), worker({pack_b!r})',
        'a.call("bh_mempack:load", "UNetA", 512 * MiB)', 'a.call("bh_mempack:load", "VAEA", 160 * MiB)',
        'b.call("bh_mempack:load", "ClipB", 256 * MiB)', 'b.call("bh_mempack:load", "Scratch", 96 * MiB)',
        "hm.reconcile()",
        's = next(s_ for s_ in hm.standins(b) if s_.model.__class__.__name__ == "Scratch")',
        "lm = next(lm for lm in mm.current_loaded_models if lm.model is s)",
        "lm.model_unload()", "mm.current_loaded_models.remove(lm)"])


def chromium_flags(tmp_path, budget_ms, window):
    """The headless Chromium command line (a Python list literal) for a
    page in virtual time: budget_ms of it, a window of "W,H" pixels."""
    return repr([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--hide-scrollbars", "--no-first-run", "--disable-extensions", "--mute-audio",
                 "--user-data-dir=" + str(tmp_path / "chromium"), f"--virtual-time-budget={budget_ms}",
                 f"--window-size={window}", "--force-device-scale-factor=1"])


class Dom(html.parser.HTMLParser):
    """The rows the panel rendered: per process its attributes, bar width
    and models; the device rows; the timeline entries."""

    def __init__(self):
        super().__init__()
        self.stack = []
        self.procs, self.devices, self.events, self.body = [], [], [], {}

    def _inside(self, key):
        for _tag, attrs, ctx in reversed(self.stack):
            if key in ctx:
                return ctx[key]
        return None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        ctx = {}
        cls = (a.get("class") or "").split()
        if tag == "body":
            self.body = a
        if "data-bh-process" in a:
            ctx["proc"] = dict(a, models=[], width=None)
            self.procs.append(ctx["proc"])
        elif "bh-device" in cls:
            ctx["dev"] = dict(a, width=None, text="")
            self.devices.append(ctx["dev"])
        if "bh-fill" in cls:
            width = float(a["style"].split("width:")[1].strip().rstrip(";").rstrip("%"))
            owner = self._inside("proc") or self._inside("dev")
            if owner is not None:
                owner["width"] = width
        if tag == "li" and "data-model" in a and self._inside("proc") is not None:
            self._inside("proc")["models"].append(a["data-model"])
        if tag == "li" and "data-kind" in a:
            ctx["event"] = {"kind": a["data-kind"], "text": ""}
            self.events.append(ctx["event"])
        if tag not in ("meta", "br", "img", "input", "link"):
            self.stack.append((tag, a, ctx))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        event = self._inside("event")
        if event is not None:
            event["text"] += data
        dev = self._inside("dev")
        if dev is not None:
            dev["text"] += data


def test_panel_renders_every_process_in_chromium(tmp_path, monkeypatch):
    shot = tmp_path / "panel.png"
    r = routes_scenario(tmp_path, f"""
        import shutil, subprocess
        {two_workers("pack-b")}
        from bulkhead.host import release as _rl
        for _ in range(5):
            _rl.note(hm, "release", "pack-a", 0)   # an idle worker's releases that freed nothing
        doc = routes.status()
        url = "http://127.0.0.1:%d/" % port
        flags = {chromium_flags(tmp_path, 4500, "400,760")}
        dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=180)
        polls_in_dump = len(polls)
        png = subprocess.run(flags + ["--screenshot=" + {str(shot)!r}, url], capture_output=True,
                             text=True, timeout=180)
        out(dict(dom=dom.stdout, rc=dom.returncode, err=dom.stderr[-3000:], png_rc=png.returncode,
                 png_err=png.stderr[-2000:], polls=polls_in_dump, doc=doc,
                 pids=dict(me=os.getpid(), a=a.pid, b=b.pid)))
        finish(a, b)
    """, monkeypatch, before_serve=SERVE_PAGE)
    assert r["rc"] == 0 and "data-bh-panel" in r["dom"], r["err"]
    dom = Dom()
    dom.feed(r["dom"])
    pids = r["pids"]
    assert dom.body.get("data-tabs") == "bulkhead:custom"

    # one bar per process: this host and its two workers, labelled by pack
    procs = {int(p["data-pid"]): p for p in dom.procs}
    assert set(procs) == {pids["me"], pids["a"], pids["b"]}, dom.procs
    host, pa, pb = procs[pids["me"]], procs[pids["a"]], procs[pids["b"]]
    assert host["data-role"] == "host" and pa["data-role"] == pb["data-role"] == "worker"
    assert pa["data-pack"] == "pack-a" and pb["data-pack"] == "pack-b"
    assert int(pa["data-held"]) == 672 * MiB and int(pb["data-held"]) == 256 * MiB
    # the bar is the bytes held relative to the device's total
    cpu_total = next(d for d in r["doc"]["devices"] if d["device"] == "cpu")["total_bytes"]
    for p, held in ((pa, 672 * MiB), (pb, 256 * MiB)):
        assert p["width"] == pytest.approx(100.0 * held / cpu_total, abs=0.051), p
    assert pa["width"] > pb["width"] > 0
    assert sorted(pa["models"]) == ["UNetA", "VAEA"] and sorted(pb["models"]) == ["ClipB", "Scratch"]

    # device totals, and the eviction in the timeline
    cpu = next(d for d in dom.devices if d["data-device"] == "cpu")
    assert "free of" in cpu["text"] and cpu["width"] > 0
    # with the bytes the worker's receipt freed (#23: main noted 0)
    assert any(e["kind"] == "evict" and "pack-b" in e["text"] and "· 96" in e["text"] for e in dom.events), dom.events
    # the five releases that freed nothing are one line (#25)
    folded = [e for e in dom.events if e["kind"] == "release" and "pack-a" in e["text"]]
    assert len(folded) == 1 and "×5 · nothing freed" in folded[0]["text"], dom.events
    # it polled once a second while shown (4.5 s of virtual time)
    assert r["polls"] >= 3, r["polls"]

    assert r["png_rc"] == 0, r["png_err"]
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    keep = os.environ.get("BULKHEAD_PANEL_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)


class Marked(html.parser.HTMLParser):
    """Every element carrying one of `keys` (data-bh-chart, ...), with its
    attributes and its text: {key: [dict(attrs, text=...)]}."""

    def __init__(self, *keys):
        super().__init__()
        self.keys, self.found, self.open = keys, {k: [] for k in keys}, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        hits = [k for k in self.keys if k in a]
        entry = dict(a, tag=tag, text="")
        for k in hits:
            self.found[k].append(entry)
        if tag not in ("meta", "br", "img", "input", "link"):
            self.open.append((tag, entry if hits else None))

    def handle_endtag(self, tag):
        while self.open:
            if self.open.pop()[0] == tag:
                break

    def handle_data(self, data):
        for _tag, entry in self.open:
            if entry is not None:
                entry["text"] += data


def test_panel_charts_history_and_shows_what_free_gave_back(tmp_path, monkeypatch):
    shot = os.environ.get("BULKHEAD_PANEL_SCREENSHOT_FREED")
    long_pack = "comfyui-impact-subpack-b"   # a real-world length: must not be cut
    r = routes_scenario(tmp_path, f"""
        import subprocess
        {two_workers(long_pack)}
        url = "http://127.0.0.1:%d/?press=2500" % port
        flags = {chromium_flags(tmp_path, 5000, "420,1100")}
        dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=180)
        res = dict(dom=dom.stdout, rc=dom.returncode, err=dom.stderr[-3000:], frees=list(frees),
                   pids=dict(me=os.getpid(), a=a.pid, b=b.pid))
        if {shot!r} is not None:
            a.call("bh_mempack:load", "UNetA", 512 * MiB)
            b.call("bh_mempack:load", "ClipB", 256 * MiB)
            start = len(polls)
            def grow(n):   # pack-b grows while the panel watches, as during a prompt
                if n == start + 2:
                    b.call("bh_mempack:load", "Grow", 192 * MiB)
            on_poll.append(grow)
            subprocess.run(flags + ["--screenshot=" + {shot!r}, url], capture_output=True, timeout=180)
        out(res)
        finish(a, b)
    """, monkeypatch, before_serve=SERVE_PAGE)
    assert r["rc"] == 0 and "data-bh-panel" in r["dom"], r["err"]
    pids = r["pids"]
    found = Marked("data-bh-chart", "data-bh-series", "data-bh-legend", "data-bh-mark", "data-bh-freed",
                   "data-freed-bytes", "data-cut", "data-bh-process")
    found.feed(r["dom"])
    f = found.found

    # the button: the route's answer, shown in total and per worker
    assert len(r["frees"]) == 1, r["frees"]
    answer = r["frees"][0]
    rows = {row["pid"]: row for row in answer["processes"]}
    assert set(rows) == {pids["a"], pids["b"]} and answer["freed_bytes"] == 672 * MiB + 256 * MiB
    [box] = f["data-bh-freed"]
    assert int(box["data-freed-bytes"]) == answer["freed_bytes"]
    assert "Freed 928 MiB from 2 of 2 workers" in " ".join(box["text"].split()), box["text"]
    shown = {int(e["data-pid"]): e for e in f["data-freed-bytes"] if "data-pid" in e}
    assert set(shown) == set(rows)
    for pid, row in rows.items():
        assert int(shown[pid]["data-freed-bytes"]) == row["freed_bytes"] > 0
        assert row["pack"] in shown[pid]["text"] and f"pid {pid}" in shown[pid]["text"]
        assert "→ 0 B" in shown[pid]["text"], shown[pid]["text"]

    # the history: one CPU chart, one series and one legend entry per process
    [chart] = [c for c in f["data-bh-chart"] if c["data-device"] == "cpu"]
    assert int(chart["data-series"]) == 3 and int(chart["data-samples"]) >= 3, chart
    series = {int(s["data-pid"]) for s in f["data-bh-series"]}
    assert series == {pids["me"], pids["a"], pids["b"]}
    assert len(f["data-bh-series"]) == 3 * len(f["data-bh-chart"])
    legend = {int(e["data-pid"]): e for e in f["data-bh-legend"]}
    assert set(legend) == set(series) and "pack-a" in legend[pids["a"]]["text"]
    # the eviction and the releases are marks on its time axis, hover text naming them
    marks = [(m["data-kind"], m["data-process"]) for m in f["data-bh-mark"]]
    assert ("evict", long_pack) in marks and ("release", "pack-a") in marks and ("release", long_pack) in marks \
        and ("free", "2 workers") in marks, marks
    evict = next(m for m in f["data-bh-mark"] if m["data-kind"] == "evict")
    assert "evict" in evict["text"] and long_pack in evict["text"]

    # nothing cut at the sidebar's default width, and the full names are there
    body = next(e for e in f["data-cut"])
    assert json.loads(body["data-cut"]) == [], body["data-cut"]
    procs = {int(p["data-pid"]): p for p in f["data-bh-process"]}
    assert long_pack in procs[pids["b"]]["text"] and f"pid {pids['b']}" in procs[pids["b"]]["text"]
    assert "ComfyUI (this instance)" in procs[pids["me"]]["text"]


def test_panel_shows_each_packs_isolation_first_those_not_isolated(tmp_path, monkeypatch):
    """A pack isolated in its worker, one that fell back in-process (its
    environment failed to build) and one that failed outright: the Packs
    section tops the panel, the two not isolated first, each with why and
    the fix, as GET /bulkhead/status lists them."""
    # the lost pack in a folder whose name has no break opportunity (no '/', '-' or space): its
    # fix's path must wrap anywhere rather than be cut at the panel's edge (#36)
    good, lost = tmp_path / "good_pack", tmp_path / "my_custom_nodes_folder_with_a_rather_long_name_x" / "lost_pack"
    for d in (good, lost):
        d.mkdir(parents=True)
        (d / "nodes.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    shot = tmp_path / "packs.png"
    r = routes_scenario(tmp_path, f"""
        import subprocess
        from bulkhead.host import nodes as bh, states
        bh.load_pack({str(good)!r}, sys.executable, options={{"cache": False}})
        states.fallback({str(lost)!r}, states.ENV_NOT_BUILT,
                        detail="missing: building it at start failed: pip found no bh-nowhere")
        states.failed("/nowhere/broken_pack", "broken_pack", "No module named 'bh_missing'")
        doc = routes.status()
        url = "http://127.0.0.1:%d/" % port
        flags = {chromium_flags(tmp_path, 2500, "400,700")}
        dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=180)
        png = subprocess.run(flags + ["--screenshot=" + {str(shot)!r}, url], capture_output=True, timeout=180)
        out(dict(dom=dom.stdout, rc=dom.returncode, err=dom.stderr[-3000:], packs=doc["packs"], png=png.returncode))
        bh.close_all()
    """, monkeypatch, before_serve=SERVE_PAGE)
    assert r["rc"] == 0 and "data-bh-panel" in r["dom"], r["err"]
    assert [(p["name"], p["state"]) for p in r["packs"]] == [
        ("broken_pack", "failed"), ("lost_pack", "in-process"), ("good_pack", "isolated")], r["packs"]
    m = Marked("data-bh-pack", "data-bh-packs-first", "data-cut")
    m.feed(r["dom"])
    rows = m.found["data-bh-pack"]
    # the reasons and the fix's long path wrap at the sidebar's width: nothing cut, all of it there (#36)
    assert json.loads(m.found["data-cut"][0]["data-cut"]) == [], m.found["data-cut"][0]["data-cut"]
    assert f"bulkhead install {os.path.realpath(str(lost))}" in " ".join(rows[1]["text"].split()), rows[1]["text"]
    assert [(e["data-bh-pack"], e["data-state"]) for e in rows] == [
        ("broken_pack", "failed"), ("lost_pack", "in-process"), ("good_pack", "isolated")], rows
    assert "NOT isolated" in rows[1]["text"] and "pip found no bh-nowhere" in rows[1]["text"]
    assert "bulkhead install" in rows[1]["text"] and "FAILED" in rows[0]["text"]
    assert "isolated" in rows[2]["text"] and sys_python_name() in rows[2]["text"]
    # and whether its worker is sandboxed (#38), as GET /bulkhead/status says
    assert r["packs"][2]["sandbox"]["words"] in rows[2]["text"], (r["packs"][2], rows[2]["text"])
    # the section comes first in the panel
    assert r["dom"].index("data-bh-pack") < r["dom"].index("bh-devices")
    # and one notice in ComfyUI's toast at load names the two not isolated
    import html
    import re
    toasts = json.loads(html.unescape(re.search(r'data-toasts="([^"]*)"', r["dom"]).group(1)))
    assert len(toasts) == 1 and toasts[0]["severity"] == "error", toasts
    assert toasts[0]["summary"] == "bulkhead: 2 packs NOT isolated", toasts
    assert "broken_pack: FAILED" in toasts[0]["detail"] and "lost_pack: runs in ComfyUI's process" in toasts[0]["detail"]
    # one short line per pack (the reason and the fix are the panel's), then where to look
    lines = toasts[0]["detail"].splitlines()
    assert "good_pack" not in toasts[0]["detail"] and len(lines) == 3 and all(len(l) <= 90 for l in lines), lines
    assert "bulkhead panel" in lines[-1], lines
    assert r["png"] == 0
    keep = os.environ.get("BULKHEAD_PANEL_SCREENSHOT_PACKS")
    if keep:
        shutil.copyfile(shot, keep)


def sys_python_name():
    import sys
    return os.path.basename(sys.executable)


def test_panel_says_what_comfyui_keeps_in_a_worker(tmp_path, monkeypatch):
    """#25: bytes a worker's full release cannot free because ComfyUI still
    holds them (a node's output in ComfyUI's cache: here a 48 MiB array
    the host keeps, living in the worker's shared-memory block) are named
    in the panel with their figure: ComfyUI's cached node output, kept in
    the worker, freed when ComfyUI drops its cache."""
    shot = tmp_path / "kept.png"
    r = routes_scenario(tmp_path, f"""
        import subprocess
        c = worker("pack-c")
        kept = c.call("numpy:ones", 6 * MiB)          # 48 MiB in the worker's block, held here
        deadline = time.monotonic() + 10               # the worker's recount publishes the block
        while time.monotonic() < deadline and held(c.pid) < 48 * MiB:
            time.sleep(0.05)
        url = "http://127.0.0.1:%d/?press=1500" % port
        flags = {chromium_flags(tmp_path, 3500, "400,600")}
        dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=180)
        png = subprocess.run(flags + ["--screenshot=" + {str(shot)!r}, url], capture_output=True, timeout=180)
        out(dict(dom=dom.stdout, rc=dom.returncode, err=dom.stderr[-3000:], frees=list(frees), png=png.returncode,
                 pid=c.pid, kept=int(kept.nbytes)))
        del kept
        finish(c)
    """, monkeypatch, before_serve=SERVE_PAGE)
    assert r["rc"] == 0 and "data-bh-panel" in r["dom"], r["err"]
    assert r["kept"] == 48 * MiB
    [row] = [row for row in r["frees"][0]["processes"] if row["pid"] == r["pid"]]   # the DOM dump's press
    assert row["state"] == "released" and row["after_bytes"] >= 48 * MiB, r["frees"]
    found = Marked("data-host-held-bytes", "data-bh-kept")
    found.feed(r["dom"])
    [li] = found.found["data-host-held-bytes"]
    assert int(li["data-pid"]) == r["pid"] and int(li["data-host-held-bytes"]) == row["after_bytes"]
    [kept] = found.found["data-bh-kept"]
    text = " ".join(kept["text"].split())
    assert text.startswith(f"{row['after_bytes'] / MiB:.1f} MiB stays: it is ComfyUI's cached node output, "
                           "kept in this worker"), text
    # the button's name in ComfyUI's frontend (1.27.10): "Free model and node cache" is no more
    assert "freed when ComfyUI drops its cache (“Unload Models and Execution Cache”)" in text, text
    assert r["png"] == 0
    keep = os.environ.get("BULKHEAD_PANEL_SCREENSHOT_KEPT")
    if keep:
        shutil.copyfile(shot, keep)
