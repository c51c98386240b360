// ember VIZ: the kernel list, a layered graph view of each rewrite step, code panels, the rule table and the
// profiler timeline. Hand-written, no dependencies; it talks only to the server that sent it (/api/trace, /api/rewrite).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const state = { trace: null, kernel: -1, pass: -1, detail: null, step: 0, code: "ast", selected: -1 };
const cache = new Map();

// ** op kinds and their colours **
const KINDS = [
  ["buffer", "#c9e4ff", ["BUFFER", "PARAM", "DEFINE_VAR", "DEFINE_LOCAL", "DEFINE_ACC", "DEVICE", "BIND"]],
  ["const", "#e8e8e8", ["CONST"]],
  ["movement", "#ffe3a8", ["RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP"]],
  ["memory", "#ffc7c2", ["INDEX", "LOAD", "STORE", "COPY", "ASSIGN", "CONTIGUOUS", "CONTIGUOUS_BACKWARD", "DETACH"]],
  ["loop", "#d5c8f0", ["RANGE", "END", "SPECIAL", "BARRIER"]],
  ["reduce", "#ffb3d9", ["REDUCE_AXIS", "REDUCE", "WMMA", "SHUFFLE_XOR"]],
  ["cast", "#d7f0c8", ["CAST", "BITCAST"]],
  ["sink", "#b8bfcc", ["SINK", "NOOP"]],
];
const ALU_COLOR = "#bfeee4";
const KIND_OF = new Map();
for (const [kind, color, ops] of KINDS) for (const op of ops) KIND_OF.set(op, [kind, color]);
const colorOf = (op) => (KIND_OF.get(op) || ["alu", ALU_COLOR])[1];

function el(tag, attrs = {}, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG_NS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
const $ = (id) => document.getElementById(id);
const fmtTime = (s) => s == null ? "" : s < 1e-3 ? `${(s * 1e6).toFixed(1)} us` : `${(s * 1e3).toFixed(2)} ms`;

async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `${url}: HTTP ${response.status}`);
  return body;
}

// ** the kernel list **
function renderKernels() {
  const list = $("kernels");
  list.textContent = "";
  const filter = $("filter").value.trim().toLowerCase();
  state.trace.kernels.forEach((kernel, k) => {
    const passes = kernel.rewrites.map((r, i) => [r, i])
      .filter(([r]) => !filter || kernel.name.toLowerCase().includes(filter) || r.name.toLowerCase().includes(filter));
    if (filter && passes.length === 0) return;
    const item = el("li", { class: "kernel" + (k === state.kernel ? " open" : ""), "data-index": k });
    const head = el("div", { class: "head" });
    head.append(el("span", { class: "name" }, kernel.name), el("span", { class: "kind" }, kernel.device || kernel.kind),
      el("span", { class: "time" }, fmtTime(kernel.time_s)));
    head.addEventListener("click", () => selectKernel(k));
    const ol = el("ol", { class: "passes" });
    for (const [r, i] of passes) {
      const li = el("li", { class: "pass" + (r.matches ? "" : " zero") + (k === state.kernel && i === state.pass ? " active" : ""),
                            "data-index": i, title: `${r.nodes_before} -> ${r.nodes_after} nodes` });
      li.append(el("span", { class: "pass-name" }, r.name), el("span", { class: "count" }, `${r.matches}`));
      li.addEventListener("click", () => selectPass(k, i));
      ol.append(li);
    }
    item.append(head, ol);
    list.append(item);
  });
}

function selectKernel(k) {
  const kernel = state.trace.kernels[k];
  // open the first pass with rewrites, else the first pass (a kernel's AST, a schedule's tensor graph)
  const first = kernel.rewrites.findIndex((r) => r.matches > 0);
  selectPass(k, state.kernel === k && state.pass >= 0 ? state.pass : Math.max(first, 0));
}

async function selectPass(k, i) {
  state.kernel = k;
  state.pass = i;
  state.selected = -1;
  renderKernels();
  renderCode();
  const key = `${k}/${i}`;
  $("status").textContent = "loading pass...";
  if (!cache.has(key)) cache.set(key, await getJSON(`/api/rewrite?kernel=${k}&rewrite=${i}`));
  state.detail = cache.get(key);
  $("status").textContent = "";
  setStep(state.detail.steps.length > 1 ? 1 : 0, true);
}

// ** stepping **
function setStep(step, fit) {
  const detail = state.detail;
  if (!detail) return;
  state.step = Math.max(0, Math.min(step, detail.steps.length - 1));
  const kernel = state.trace.kernels[state.kernel];
  const pass = kernel.rewrites[state.pass];
  const s = detail.steps[state.step];
  $("pass-title").textContent = `${kernel.name} / ${pass.name}`;
  $("step-label").textContent = `step ${state.step} / ${detail.steps.length - 1}` + (pass.truncated ? " (truncated)" : "");
  $("prev").disabled = state.step === 0;
  $("next").disabled = state.step >= detail.steps.length - 1;
  const before = state.step > 0 ? detail.steps[state.step - 1].nodes : s.nodes;
  $("nodes").textContent = `${s.nodes} nodes` + (state.step > 0 ? ` (was ${before})` : "");
  if (s.rule === null) {
    $("rule-name").textContent = state.step === 0 && detail.steps.length > 1 ? "the graph before any rule" :
      "no rule fired in this pass";
    $("rule-location").textContent = "";
    $("rule-match").textContent = "";
  } else {
    const rule = state.trace.rules[s.rule];
    const m = s.match === null ? null : detail.nodes[s.match];
    const r = detail.nodes[s.replacement];
    $("rule-name").textContent = rule.name;
    $("rule-location").textContent = rule.location;
    $("rule-match").textContent = m ? `: ${m.op} #${s.match} -> ${r.op} #${s.replacement}` : `: -> ${r.op}`;
  }
  drawGraph(fit);
}

// ** the graph: a layered layout (longest path layers, barycentre ordering with virtual nodes on long edges) **
const NODE_H = 44, LAYER_GAP = 46, NODE_GAP = 14, CHAR_W = 6.7, MIN_SCALE = 0.75;

function reachable(nodes, sink) {
  const seen = new Set(), stack = [sink];
  while (stack.length) {
    const n = stack.pop();
    if (seen.has(n)) continue;
    seen.add(n);
    for (const s of nodes[n].src) stack.push(s);
  }
  return seen;
}

function nodeLines(id, node) {
  const second = [node.dtype, node.shape].filter((x) => x).join(" ");
  return [`${node.op} #${id}`, second, node.arg].filter((x) => x !== "");
}

function layout(nodes, ids) {
  const layer = new Map();
  const order = [...ids].sort((a, b) => a - b);  // table order: sources before users
  for (const id of order) layer.set(id, Math.max(-1, ...nodes[id].src.map((s) => layer.get(s))) + 1);
  // a leaf (constant, buffer, variable) sits just above its first user, not in the top row with long edges down
  const firstUse = new Map();
  for (const id of order) for (const s of nodes[id].src) firstUse.set(s, Math.min(firstUse.get(s) ?? Infinity, layer.get(id)));
  for (const id of order) if (nodes[id].src.length === 0 && firstUse.has(id)) layer.set(id, firstUse.get(id) - 1);
  // virtual nodes carry long edges through the layers between, so the ordering keeps them straight
  const nLayers = Math.max(...layer.values()) + 1;
  const layers = Array.from({ length: nLayers }, () => []);
  const preds = new Map(), edges = [];
  const addPred = (v, u) => { if (!preds.has(v)) preds.set(v, []); preds.get(v).push(u); };
  for (const id of order) layers[layer.get(id)].push(id);
  let virtual = 0;
  for (const id of order) {
    for (const s of new Set(nodes[id].src)) {
      const path = [s];
      for (let l = layer.get(s) + 1; l < layer.get(id); l++) {
        const v = `v${virtual++}`;
        layer.set(v, l);
        layers[l].push(v);
        path.push(v);
      }
      path.push(id);
      for (let j = 1; j < path.length; j++) addPred(path[j], path[j - 1]);
      edges.push(path);
    }
  }
  const succs = new Map();
  for (const [v, us] of preds) for (const u of us) { if (!succs.has(u)) succs.set(u, []); succs.get(u).push(v); }
  const pos = new Map();
  const index = () => layers.forEach((ls) => ls.forEach((v, i) => pos.set(v, i)));
  index();
  const sweep = (range, neighbours) => {
    for (const l of range) {
      const bary = new Map(layers[l].map((v) => {
        const ns = neighbours.get(v) || [];
        return [v, ns.length ? ns.reduce((a, u) => a + pos.get(u), 0) / ns.length : pos.get(v)];
      }));
      layers[l].sort((a, b) => bary.get(a) - bary.get(b));
      layers[l].forEach((v, i) => pos.set(v, i));
    }
  };
  const down = [...Array(nLayers).keys()].slice(1), up = [...Array(nLayers).keys()].reverse().slice(1);
  for (let it = 0; it < 4; it++) { sweep(down, preds); sweep(up, succs); }
  // x: each layer packed left to right, then centred; real nodes are as wide as their longest line
  const width = (v) => typeof v === "string" ? 8 : Math.max(48, ...nodeLines(v, nodes[v]).map((t) => t.length * CHAR_W + 12));
  const xy = new Map();
  let maxW = 0;
  const rowW = layers.map((ls) => ls.reduce((a, v) => a + width(v) + NODE_GAP, 0));
  maxW = Math.max(...rowW);
  layers.forEach((ls, l) => {
    let x = (maxW - rowW[l]) / 2;
    for (const v of ls) {
      const w = width(v);
      xy.set(v, { x: x + w / 2, y: l * (NODE_H + LAYER_GAP) + NODE_H / 2, w });
      x += w + NODE_GAP;
    }
  });
  return { xy, edges, width: maxW, height: nLayers * (NODE_H + LAYER_GAP) };
}

function edgePath(points) {
  let d = `M${points[0].x},${points[0].y + NODE_H / 2}`;
  for (let j = 1; j < points.length; j++) {
    const a = points[j - 1], b = points[j];
    const ay = a.y + (j === 1 ? NODE_H / 2 : 0), by = b.y - (j === points.length - 1 ? NODE_H / 2 : 0);
    const my = (ay + by) / 2;
    d += ` C${a.x},${my} ${b.x},${my} ${b.x},${by}`;
    if (j < points.length - 1) d += ` L${b.x},${b.y}`;
  }
  return d;
}

const view = { x: 0, y: 0, w: 800, h: 600 };
function applyView() { $("graph").setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`); }

function drawGraph(fit) {
  const svg = $("graph");
  svg.textContent = "";
  svg.classList.remove("focus");
  const detail = state.detail, step = detail.steps[state.step];
  const ids = reachable(detail.nodes, step.sink);
  const prev = state.step > 0 ? reachable(detail.nodes, detail.steps[state.step - 1].sink) : ids;
  const replacement = step.rule === null ? new Set() : reachable(detail.nodes, step.replacement);
  // the node the next step's rule will rewrite, outlined dashed: the graph "before" that rewrite
  const nextMatch = state.step + 1 < detail.steps.length ? detail.steps[state.step + 1].match : null;
  const { xy, edges, width, height } = layout(detail.nodes, ids);
  const edgeLayer = el("svg:g"), nodeLayer = el("svg:g");
  for (const path of edges) {
    const src = path[0], dst = path[path.length - 1];
    edgeLayer.append(el("svg:path", { class: "edge", d: edgePath(path.map((v) => xy.get(v))), "data-src": src, "data-dst": dst }));
  }
  for (const id of ids) {
    const node = detail.nodes[id], p = xy.get(id);
    const cls = "node" + (id === step.replacement ? " replacement" : replacement.has(id) && !prev.has(id) ? " new" : "") +
      (id === nextMatch ? " matched" : "");
    const g = el("svg:g", { class: cls, "data-id": id, transform: `translate(${p.x - p.w / 2},${p.y - NODE_H / 2})` });
    g.append(el("svg:rect", { width: p.w, height: NODE_H, fill: colorOf(node.op) }));
    nodeLines(id, node).forEach((t, j) => g.append(el("svg:text", { x: 6, y: 14 + j * 13, class: j === 0 ? "op" : "" }, t)));
    g.append(el("svg:title", {}, `#${id} ${node.op} ${node.dtype} ${node.shape || ""}\n${node.arg}\nsources: ${node.src.join(", ")}`));
    g.addEventListener("click", (e) => { e.stopPropagation(); focusNode(id); });
    nodeLayer.append(g);
  }
  svg.append(edgeLayer, nodeLayer);
  // a graph that fits at a legible scale is fitted at every step; a bigger one is shown at that scale around where
  // the rule fired (else the sink), and stepping moves the view only when the rewritten node leaves it
  const box = svg.getBoundingClientRect(), pad = 20;
  const aspect = box.width && box.height ? box.width / box.height : 4 / 3;
  const fitW = Math.max(width + 2 * pad, (height + 2 * pad) * aspect);
  const focus = xy.get(step.rule !== null && ids.has(step.replacement) ? step.replacement : step.sink);
  const outside = focus.x < view.x || focus.x > view.x + view.w || focus.y < view.y || focus.y > view.y + view.h;
  if (!box.width || box.width / fitW >= MIN_SCALE) {
    Object.assign(view, { w: fitW, h: fitW / aspect, x: (width - fitW) / 2, y: -pad });
  } else if (fit || outside) {
    if (fit) Object.assign(view, { w: box.width / MIN_SCALE, h: box.width / MIN_SCALE / aspect });
    // centred on the node, but not past the graph's edges
    const clamp = (v, lo, hi) => Math.max(lo, Math.min(v, hi));
    view.x = width + 2 * pad > view.w ? clamp(focus.x - view.w / 2, -pad, width + pad - view.w) : (width - view.w) / 2;
    view.y = height + 2 * pad > view.h ? clamp(focus.y - view.h / 2, -pad, height + pad - view.h) : -pad;
  }
  applyView();
  if (state.selected >= 0 && ids.has(state.selected)) focusNode(state.selected);
}

function fitAll() {  // the whole graph in view, however small its text gets
  const pad = 20, svg = $("graph"), box = svg.getBoundingClientRect(), g = svg.getBBox();
  view.w = Math.max(g.width + 2 * pad, (g.height + 2 * pad) * box.width / box.height);
  view.h = view.w * box.height / box.width;
  view.x = g.x + g.width / 2 - view.w / 2;
  view.y = g.y - pad;
  applyView();
}

function focusNode(id) {
  const svg = $("graph");
  svg.querySelectorAll(".sel, .src, .use").forEach((n) => n.classList.remove("sel", "src", "use"));
  if (state.selected === id && svg.classList.contains("focus")) {
    state.selected = -1;
    svg.classList.remove("focus");
    return;
  }
  state.selected = id;
  svg.classList.add("focus");
  svg.querySelector(`.node[data-id="${id}"]`).classList.add("sel");
  for (const edge of svg.querySelectorAll(".edge")) {
    const src = Number(edge.dataset.src), dst = Number(edge.dataset.dst);
    if (dst === id) {
      edge.classList.add("src");
      svg.querySelector(`.node[data-id="${src}"]`).classList.add("src");
    }
    if (src === id) {
      edge.classList.add("use");
      svg.querySelector(`.node[data-id="${dst}"]`).classList.add("use");
    }
  }
}

function setupPanZoom() {
  const svg = $("graph");
  let drag = null;
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const box = svg.getBoundingClientRect(), f = e.deltaY > 0 ? 1.15 : 1 / 1.15;
    const mx = view.x + (e.clientX - box.left) / box.width * view.w, my = view.y + (e.clientY - box.top) / box.height * view.h;
    view.x = mx - (mx - view.x) * f;
    view.y = my - (my - view.y) * f;
    view.w *= f;
    view.h *= f;
    applyView();
  }, { passive: false });
  svg.addEventListener("mousedown", (e) => { drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y }; });
  window.addEventListener("mouseup", () => { drag = null; });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const box = svg.getBoundingClientRect();
    view.x = drag.vx - (e.clientX - drag.x) / box.width * view.w;
    view.y = drag.vy - (e.clientY - drag.y) / box.height * view.h;
    applyView();
  });
  svg.addEventListener("click", () => { if (svg.classList.contains("focus")) focusNode(state.selected); });
}

// ** code panels **
function renderCode() {
  const kernel = state.kernel >= 0 ? state.trace.kernels[state.kernel] : null;
  document.querySelectorAll("#code-tabs button").forEach((b) => b.classList.toggle("active", b.dataset.code === state.code));
  if (!kernel) { $("code").textContent = ""; return; }
  const info = [`kernel ${kernel.name} (${kernel.kind})`, `device ${kernel.device || "-"}`,
    `opts ${kernel.opts.length ? kernel.opts.join(", ") : "none"}`,
    `time ${kernel.time_s == null ? "not measured" : `${fmtTime(kernel.time_s)} in ${kernel.runs} runs`}`, "",
    "passes (matches, nodes before -> after, ms):",
    ...kernel.rewrites.map((r) => `  ${r.name}: ${r.matches}, ${r.nodes_before} -> ${r.nodes_after}, ${(r.seconds * 1e3).toFixed(2)}`)];
  const text = { ast: kernel.ast || "(no kernel AST: the passes of this group run outside codegen)",
                 program: kernel.program || "(no linear program)", source: kernel.source || "(no source)", info: info.join("\n") };
  $("code").textContent = text[state.code];
}

// ** rules **
function renderRules() {
  const body = document.querySelector("#rule-table tbody");
  body.textContent = "";
  const rows = [...state.trace.rules].filter((r) => r.tries > 0).sort((a, b) => b.seconds - a.seconds);
  for (const r of rows) {
    const tr = el("tr");
    tr.append(el("td", {}, r.name), el("td", {}, r.location), el("td", { class: "num" }, r.matches),
      el("td", { class: "num" }, r.tries), el("td", { class: "num" }, (r.seconds * 1e3).toFixed(3)));
    body.append(tr);
  }
}

// ** timeline: Chrome trace events (ph "X"), one row per process/thread, names from "M" events; the wheel zooms in
// time around the pointer, dragging pans **
const tl = { start: 0, end: 0, t0: 0, t1: 0, drag: null };
const TL_LABEL_W = 180, TL_ROW_H = 26, TL_TOP = 28;

function renderTimeline() {
  const events = state.trace.timeline || [];
  const svg = $("timeline-svg");
  svg.textContent = "";
  const spans = events.filter((e) => e.ph === "X");
  if (!spans.length) {
    $("timeline-note").textContent = "No profile in this trace: the timeline shows ember.profiler's events (VIZ=1 records them).";
    return;
  }
  const names = new Map();
  for (const e of events) {
    if (e.ph === "M" && e.name === "process_name") names.set(`${e.pid}/`, e.args.name);
    if (e.ph === "M" && e.name === "thread_name") names.set(`${e.pid}/${e.tid}`, e.args.name);
  }
  const rows = [...new Set(spans.map((e) => `${e.pid}/${e.tid}`))].sort();
  if (tl.end <= tl.start) {
    tl.t0 = Math.min(...spans.map((e) => e.ts));
    tl.t1 = Math.max(...spans.map((e) => e.ts + (e.dur || 0)));
    Object.assign(tl, { start: tl.t0, end: Math.max(tl.t1, tl.t0 + 1) });
  }
  const width = Math.max(600, $("timeline-wrap").clientWidth - 4);
  const scale = (width - TL_LABEL_W - 10) / (tl.end - tl.start);
  const xOf = (t) => TL_LABEL_W + (t - tl.start) * scale;
  svg.setAttribute("width", width);
  svg.setAttribute("height", rows.length * TL_ROW_H + TL_TOP + 4);
  $("timeline-note").textContent = `${spans.length} events over ${((tl.t1 - tl.t0) / 1e3).toFixed(3)} ms; showing ` +
    `${((tl.end - tl.start) / 1e3).toFixed(3)} ms (wheel: zoom, drag: pan, double-click: all)`;
  // time axis: about 8 ticks at a round step, in ms from the first event
  const step = Math.pow(10, Math.floor(Math.log10((tl.end - tl.start) / 8)));
  const tick = [1, 2, 5, 10].map((m) => m * step).find((d) => (tl.end - tl.start) / d <= 10);
  for (let t = Math.ceil((tl.start - tl.t0) / tick) * tick + tl.t0; t <= tl.end; t += tick) {
    svg.append(el("svg:line", { class: "tick", x1: xOf(t), x2: xOf(t), y1: 14, y2: rows.length * TL_ROW_H + TL_TOP }));
    const ms = ((t - tl.t0) / 1e3).toFixed(Math.max(0, -Math.floor(Math.log10(tick / 1e3))));
    svg.append(el("svg:text", { class: "tick-label", x: xOf(t) + 2, y: 12 }, `${ms} ms`));
  }
  rows.forEach((row, r) => {
    const [pid, tid] = row.split("/");
    const y = r * TL_ROW_H + TL_TOP;
    svg.append(el("svg:rect", { class: "track", x: TL_LABEL_W, y, width: width - TL_LABEL_W, height: TL_ROW_H - 4 }));
    svg.append(el("svg:text", { x: 4, y: y + 15 }, `${names.get(`${pid}/`) || pid} ${names.get(row) || tid}`));
  });
  for (const e of spans) {
    if (e.ts + (e.dur || 0) < tl.start || e.ts > tl.end) continue;
    const r = rows.indexOf(`${e.pid}/${e.tid}`);
    const x = Math.max(xOf(e.ts), TL_LABEL_W), w = Math.max(xOf(e.ts + (e.dur || 0)) - x, 1);
    const rect = el("svg:rect", { class: "event", x, y: r * TL_ROW_H + TL_TOP, width: w, height: TL_ROW_H - 4,
                                  fill: `hsl(${[...e.name].reduce((a, c) => a + c.charCodeAt(0), 0) * 37 % 360},60%,70%)` });
    rect.append(el("svg:title", {}, `${e.name} (${e.cat || ""})\n${(e.dur || 0).toFixed(2)} us`));
    svg.append(rect);
    if (w > e.name.length * 6.5 + 6) svg.append(el("svg:text", { class: "label", x: x + 3, y: r * TL_ROW_H + TL_TOP + 15 }, e.name));
  }
}

function setupTimeline() {
  const wrap = $("timeline-wrap");
  const timeAt = (clientX) => {
    const box = $("timeline-svg").getBoundingClientRect();
    const frac = Math.min(Math.max((clientX - box.left - TL_LABEL_W) / (box.width - TL_LABEL_W - 10), 0), 1);
    return tl.start + frac * (tl.end - tl.start);
  };
  wrap.addEventListener("wheel", (e) => {
    e.preventDefault();
    const t = timeAt(e.clientX), f = e.deltaY > 0 ? 1.25 : 0.8;
    tl.start = Math.max(tl.t0, t - (t - tl.start) * f);
    tl.end = Math.min(tl.t1, t + (tl.end - t) * f);
    renderTimeline();
  }, { passive: false });
  wrap.addEventListener("mousedown", (e) => { tl.drag = { x: e.clientX, start: tl.start, end: tl.end }; });
  window.addEventListener("mouseup", () => { tl.drag = null; });
  window.addEventListener("mousemove", (e) => {
    if (!tl.drag) return;
    const box = $("timeline-svg").getBoundingClientRect();
    const dt = (e.clientX - tl.drag.x) / (box.width - TL_LABEL_W - 10) * (tl.drag.end - tl.drag.start);
    const shift = Math.min(Math.max(-dt, tl.t0 - tl.drag.start), tl.t1 - tl.drag.end);
    tl.start = tl.drag.start + shift;
    tl.end = tl.drag.end + shift;
    renderTimeline();
  });
  wrap.addEventListener("dblclick", () => {
    tl.end = tl.start;
    renderTimeline();
  });
}

// ** wiring **
function showTab(name) {
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("active", b.dataset.tab === name));
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t.id === name));
  if (name === "timeline") renderTimeline();
}

function legend() {
  for (const [kind, color] of [...KINDS.map(([k, c]) => [k, c]), ["alu", ALU_COLOR]]) {
    const span = el("span");
    span.append(el("i", { class: `swatch-${kind}` }), kind);
    span.firstChild.style.background = color;
    $("legend").append(span);
  }
}

async function main() {
  state.trace = await getJSON("/api/trace");
  const nk = state.trace.kernels.filter((k) => k.kind === "kernel").length;
  $("status").textContent = `${nk} kernels, ${state.trace.rules.length} rules`;
  legend();
  renderKernels();
  renderRules();
  setupPanZoom();
  $("filter").addEventListener("input", renderKernels);
  $("prev").addEventListener("click", () => setStep(state.step - 1));
  $("next").addEventListener("click", () => setStep(state.step + 1));
  $("fit").addEventListener("click", fitAll);
  document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
  setupTimeline();
  document.querySelectorAll("#code-tabs button").forEach((b) => b.addEventListener("click", () => {
    state.code = b.dataset.code;
    renderCode();
  }));
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT") return;
    if (e.key === "ArrowRight") setStep(state.step + 1);
    if (e.key === "ArrowLeft") setStep(state.step - 1);
  });
}

main().catch((e) => { $("status").textContent = `error: ${e.message}`; });
