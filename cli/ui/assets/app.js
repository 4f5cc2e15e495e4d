// The page of `kubegpu ui`. Everything that comes from the cluster is set
// as text (textContent, attributes), never parsed as markup.
"use strict";

const ROW = 44;        // height of a node's row, px
const MAX_CELLS = 16;  // GPU cells shown in a row
const state = { order: [], nodes: new Map(), summary: null, version: 0 };
const view = { shown: [], selected: null, pod: null, filter: "", tab: "node", explained: null, token: "" };
window.kubegpu = { firstRender: 0, lastLatency: 0, updates: 0, version: 0 };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}
const $ = (id) => document.getElementById(id);

// A GPU's state class: idle, partly used, full, unhealthy, or left to DRA.
function gpuClass(g, parts) {
  if (g.health && g.health !== "Healthy") return "bad"; // unknown in a tenant's view
  if (g.dra) return "dra";
  const pods = g.pods.length + (parts ? parts.pods : 0);
  if (pods === 0) return "idle";
  if (g.exclusive || g.usedCoresPercent >= 100) return "full";
  const used = g.usedMemoryMiB + (parts ? parts.mib : 0);
  // memoryMiB is 0 where unknown (a tenant's view of a shared GPU).
  return g.memoryMiB && used >= g.memoryMiB ? "full" : "part";
}

// Whole GPUs of a node, with their MIG partitions' use.
function wholeGPUs(n) {
  const parts = new Map();
  for (const g of n.gpus) {
    if (!g.parent) continue;
    const p = parts.get(g.parent) || { pods: 0, mib: 0, list: [] };
    p.pods += g.pods.length; p.mib += g.usedMemoryMiB; p.list.push(g);
    parts.set(g.parent, p);
  }
  return n.gpus.filter((g) => !g.parent).map((g) => ({ g, parts: parts.get(g.id) }));
}

function describe(g) {
  return `GPU ${g.index} ${g.model}: ${g.usedMemoryMiB}/${g.memoryMiB} MiB, ${g.usedCoresPercent}% cores used, ${g.health}` +
    (g.pods.length ? `; pods: ${g.pods.join(", ")}` : "; no pods") + (g.dra ? `; published by DRA: ${g.dra}` : "");
}

function matches(n, f) {
  if (!f) return true;
  if (n.name.toLowerCase().includes(f)) return true;
  return n.gpus.some((g) => g.model.toLowerCase().includes(f) || g.pods.some((p) => p.toLowerCase().includes(f)));
}

// ---- the stream ----
function apply(u) {
  if (u.full) state.nodes = new Map();
  for (const n of u.nodes || []) state.nodes.set(n.name, n);
  for (const name of u.removed || []) state.nodes.delete(name);
  if (u.order) state.order = u.order;
  if (u.summary) state.summary = u.summary;
  state.version = u.version;
  state.published = u.published;
  refilter();
  render();
  // Measured once the frame that shows the update is painted (the
  // second animation frame from here).
  const k = window.kubegpu;
  requestAnimationFrame(() => requestAnimationFrame(() => {
    if (u.published) k.lastLatency = Date.now() - u.published;
    if (!k.firstRender) k.firstRender = performance.now();
    k.updates++; k.version = u.version;
  }));
}

// The token: from the URL kubegpu ui printed, then from this tab's
// session storage (this origin's alone); never left in the address bar.
function token() {
  const fromURL = new URLSearchParams(location.search).get("token");
  if (fromURL) {
    sessionStorage.setItem("kubegpu-token", fromURL);
    history.replaceState(null, "", "/");
  }
  return sessionStorage.getItem("kubegpu-token") || "";
}

function connect() {
  const es = new EventSource("/api/events?token=" + encodeURIComponent(view.token));
  es.onopen = () => { $("status").textContent = "live"; $("status").className = "live"; };
  es.onerror = () => {
    // A refused stream is not retried: say what to do.
    const closed = es.readyState === EventSource.CLOSED;
    $("status").textContent = closed ? "disconnected: open the URL kubegpu ui printed" : "reconnecting…";
    $("status").className = "down";
  };
  es.onmessage = (ev) => {
    // A message is handled after the browser paints the previous one at most.
    apply(JSON.parse(ev.data));
  };
}

// ---- the node list (only the rows in sight exist) ----
function refilter() {
  const f = view.filter;
  view.shown = state.order.filter((name) => { const n = state.nodes.get(name); return n && matches(n, f); });
  $("nodes-spacer").style.height = (view.shown.length * ROW) + "px";
  $("list-count").textContent = view.shown.length === state.order.length ?
    `${state.order.length} nodes` : `${view.shown.length} of ${state.order.length} nodes`;
}

function renderRows() {
  const box = $("nodes"), spacer = $("nodes-spacer");
  const first = Math.max(0, Math.floor(box.scrollTop / ROW) - 5);
  const last = Math.min(view.shown.length, Math.ceil((box.scrollTop + box.clientHeight) / ROW) + 5);
  const rows = [];
  for (let i = first; i < last; i++) {
    const n = state.nodes.get(view.shown[i]);
    const row = el("div", { class: "row" + (n.name === view.selected ? " selected" : ""), role: "option",
      "aria-selected": String(n.name === view.selected), "data-node": n.name, onclick: () => select(n.name) });
    row.style.top = (i * ROW) + "px";
    row.append(el("span", { class: "name", text: n.name, title: n.name }));
    const cells = el("span", { class: "cells" });
    const whole = wholeGPUs(n);
    for (const { g, parts } of whole.slice(0, MAX_CELLS)) {
      const c = el("span", { class: "cell " + gpuClass(g, parts), title: describe(g), "data-gpu": g.id, text: g.index >= 0 ? String(g.index) : "?" });
      if (view.pod && (g.pods.includes(view.pod) || (parts && parts.list.some((p) => p.pods.includes(view.pod))))) c.classList.add("hl");
      cells.append(c);
    }
    row.append(cells);
    if (whole.length > MAX_CELLS) row.append(el("span", { class: "more", text: `+${whole.length - MAX_CELLS}` }));
    if (n.problem) row.append(el("span", { class: "problem", text: n.problem, title: n.problem }));
    rows.push(row);
  }
  spacer.replaceChildren(...rows);
}

function select(name) {
  view.selected = name;
  view.pod = null;
  showTab("node");
  render();
}

// ---- totals ----
function renderTotals() {
  const s = state.summary;
  if (!s) return;
  $("scope").textContent = s.scope === "cluster" ? "the whole cluster" : s.scope;
  const t = { gpus: 0, idle: 0, full: 0, stranded: 0, unhealthy: 0, strandedMiB: 0 };
  for (const m of s.totals.models || []) for (const k of Object.keys(t)) t[k] += m[k];
  const card = (n, label) => el("div", { class: "total" }, el("b", { text: String(n) }), el("span", { text: label }));
  const models = (s.totals.models || []).map((m) => `${m.model}: ${m.idle}/${m.gpus} idle`).join(" · ");
  $("totals").replaceChildren(card(s.totals.nodes, "GPU nodes"), card(t.gpus, "GPUs"), card(t.idle, "idle"),
    card(t.full, "full"), card(t.stranded, `stranded (${t.strandedMiB} MiB free)`), card(t.unhealthy, "unhealthy"),
    el("div", { class: "models", text: models }));
  $("tab-pending").textContent = `Pending (${s.pending.length})`;
  $("tab-notes").textContent = `Notes (${(s.notes || []).length})`;
}

// ---- the node panel ----
function renderNode() {
  const panel = $("panel-node");
  const n = view.selected && state.nodes.get(view.selected);
  if (!n) {
    panel.replaceChildren(el("p", { class: "hint", text: view.selected ? `Node ${view.selected} is gone.` : "Choose a node on the left (arrow keys, Enter)." }));
    return;
  }
  const out = [el("h2", { text: n.name })];
  if (n.problem) out.push(el("p", { class: "problem", text: "Takes no GPU pods: " + n.problem }));
  out.push(el("p", { class: "hint", text: `${n.otherPods} pod(s) without GPUs. Choose a pod to mark its GPUs.` }));
  const grid = el("div", { class: "gpus" });
  for (const g of n.gpus) {
    const card = el("div", { class: "gpu " + gpuClass(g), "data-gpu": g.id });
    if (view.pod && g.pods.includes(view.pod)) card.classList.add("hl");
    card.append(el("div", { class: "title", text: g.parent ? `${g.id} (of ${g.parent})` : g.model ? `GPU ${g.index} · ${g.model}` : g.id }));
    const mem = el("div", { class: "bar", title: "memory used" }, el("div"));
    mem.firstChild.style.width = Math.min(100, g.memoryMiB ? 100 * g.usedMemoryMiB / g.memoryMiB : 0) + "%";
    const total = g.memoryMiB ? `/${g.memoryMiB}` : "";
    card.append(el("div", { class: "meta", text: `${g.usedMemoryMiB}${total} MiB · ${g.usedCoresPercent}% cores` + (g.health ? ` · ${g.health}` : "") }), mem);
    const extra = [g.exclusive ? "whole GPU" : "", g.sliceEnforcer ? `slices held by ${g.sliceEnforcer}` : "",
      (g.slices || []).map((s) => `${s.pod}: ${s.state}`).join(", "), g.dra ? `DRA: ${g.dra}` : ""].filter(Boolean);
    if (extra.length) card.append(el("div", { class: "meta", text: extra.join(" · ") }));
    for (const p of g.pods) {
      const key = p.replace(/ \(.*\)$/, "");
      card.append(el("button", { class: "pod", type: "button", "aria-pressed": String(view.pod === key), text: p,
        onclick: () => { view.pod = view.pod === key ? null : key; render(); } }));
    }
    grid.append(card);
  }
  out.push(grid);
  if ((n.links || []).length) out.push(el("h3", { text: "Links" }), links(n));
  panel.replaceChildren(...out);
}

const LINK_STYLE = { NVLink: ["#1f7a3a", 4, ""], NVSwitch: ["#1f7a3a", 2, ""], XGMI: ["#b35900", 3, ""],
  PCIeSwitch: ["#57606a", 1.5, "4 3"], HostBridge: ["#8c959f", 1, "2 3"], CrossSocket: ["#b3261e", 1, "1 4"] };

// links draws the node's whole GPUs on a circle and its links between them;
// the chosen pod's GPUs are filled.
function links(n) {
  const ns = "http://www.w3.org/2000/svg";
  const whole = n.gpus.filter((g) => !g.parent);
  const size = 320, r = 120, c = size / 2;
  const at = new Map();
  whole.forEach((g, i) => {
    const a = 2 * Math.PI * i / whole.length - Math.PI / 2;
    at.set(g.id, [c + r * Math.cos(a), c + r * Math.sin(a), g]);
  });
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${size} ${size}`);
  svg.setAttribute("width", size); svg.setAttribute("height", size);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `Links between the GPUs of ${n.name}`);
  const mine = (g) => view.pod && g.pods.includes(view.pod);
  const kinds = new Set();
  for (const l of n.links) {
    const a = at.get(l.a), b = at.get(l.b);
    if (!a || !b) continue;
    const [color, width, dash] = LINK_STYLE[l.kind] || ["#57606a", 1, ""];
    kinds.add(l.kind);
    const line = document.createElementNS(ns, "line");
    for (const [k, v] of [["x1", a[0]], ["y1", a[1]], ["x2", b[0]], ["y2", b[1]], ["stroke", color],
      ["stroke-width", mine(a[2]) && mine(b[2]) ? width + 3 : width], ["stroke-dasharray", dash]]) line.setAttribute(k, v);
    const title = document.createElementNS(ns, "title");
    title.textContent = `${l.a} – ${l.b}: ${l.kind}${l.count ? " ×" + l.count : ""}`;
    line.append(title);
    svg.append(line);
  }
  for (const [x, y, g] of at.values()) {
    const circle = document.createElementNS(ns, "circle");
    for (const [k, v] of [["cx", x], ["cy", y], ["r", 16], ["fill", mine(g) ? "#1b1f24" : "#fff"], ["stroke", "#1b1f24"], ["stroke-width", 2]]) circle.setAttribute(k, v);
    const label = document.createElementNS(ns, "text");
    for (const [k, v] of [["x", x], ["y", y + 4], ["text-anchor", "middle"]]) label.setAttribute(k, v);
    if (mine(g)) label.style.fill = "#fff";
    label.textContent = String(g.index);
    svg.append(circle, label);
  }
  const legend = el("div", { class: "legend" });
  for (const k of kinds) {
    const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
    swatch.style.borderTopColor = (LINK_STYLE[k] || ["#57606a"])[0];
    legend.append(el("span", {}, swatch, k));
  }
  return el("div", {}, svg, legend);
}

// ---- pending pods, quotas, notes ----
function age(t) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(t)) / 1000));
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`;
}

function renderPending() {
  const s = state.summary;
  if (!s) return;
  const out = [];
  if (!s.pending.length) out.push(el("p", { class: "hint", text: "No GPU pod is waiting." }));
  else {
    const body = el("tbody");
    for (const p of s.pending) {
      const key = `${p.namespace}/${p.name}`;
      body.append(el("tr", { "data-pod": key },
        el("td", { text: key }), el("td", { text: p.asks }), el("td", { text: age(p.created) }),
        el("td", { text: (p.nominated ? `nominated to ${p.nominated}. ` : "") + (p.message || "") }),
        el("td", {}, s.explain ? el("button", { class: "why", type: "button", text: "Why?", onclick: () => explain(p.namespace, p.name) }) : null)));
    }
    out.push(el("table", {}, el("thead", {}, el("tr", {}, ...["Pod", "Asks for", "Waiting", "The scheduler said", ""].map((h) => el("th", { text: h })))), body));
  }
  if (view.explained) out.push(view.explained);
  $("panel-pending").replaceChildren(...out);
}

async function explain(ns, name) {
  const box = el("section", { id: "explanation", "aria-live": "polite" }, el("h3", { text: `Why ${ns}/${name} waits` }), el("p", { class: "hint", text: "judging every node…" }));
  view.explained = box;
  renderPending();
  let body;
  try {
    const r = await fetch(`/api/explain?namespace=${encodeURIComponent(ns)}&pod=${encodeURIComponent(name)}`,
      { headers: { Authorization: "Bearer " + view.token } });
    if (!r.ok) throw new Error(await r.text());
    body = await r.json();
  } catch (e) {
    box.replaceChildren(el("h3", { text: `Why ${ns}/${name} waits` }), el("p", { class: "problem", text: String(e.message || e) }));
    return;
  }
  const out = [el("h3", { text: `Why ${ns}/${name} waits` }), el("pre", { class: "lines", text: body.lines.join("\n") })];
  if (body.judged) {
    out.push(el("p", { text: `Fits on ${body.fits} of ${body.nodes} nodes.` }));
    const reasons = el("tbody");
    for (const r of body.reasons) reasons.append(el("tr", {}, el("td", { text: String(r.nodes) }), el("td", { text: r.reason })));
    if (body.reasons.length) out.push(el("table", { class: "reasons" }, el("thead", {}, el("tr", {}, el("th", { text: "Nodes" }), el("th", { text: "Why not" }))), reasons));
    const rows = el("tbody");
    for (const r of body.rows) rows.append(el("tr", {}, el("td", { text: r.node }), el("td", { text: r.fits ? `yes (${r.rank})` : r.dra ? "DRA" : "no" }),
      el("td", { text: r.fits ? r.devices : r.reason })));
    out.push(el("h3", { text: "Per node" }), el("table", {}, el("thead", {}, el("tr", {}, ...["Node", "Fits", "Devices / reason"].map((h) => el("th", { text: h })))), rows));
  }
  box.replaceChildren(...out);
}

function renderQuotas() {
  const s = state.summary;
  if (!s) return;
  if (!s.quotas.length) { $("panel-quotas").replaceChildren(el("p", { class: "hint", text: "No ResourceQuota caps GPUs." })); return; }
  const body = el("tbody");
  for (const q of s.quotas) for (const r of q.resources) body.append(el("tr", {}, el("td", { text: q.namespace }), el("td", { text: q.name }), el("td", { text: r.name }), el("td", { text: `${r.used} / ${r.hard}` })));
  $("panel-quotas").replaceChildren(el("table", {}, el("thead", {}, el("tr", {}, ...["Namespace", "Quota", "Resource", "Used / hard"].map((h) => el("th", { text: h })))), body));
}

function renderNotes() {
  const s = state.summary;
  if (!s) return;
  const notes = s.notes || [];
  $("panel-notes").replaceChildren(...(notes.length ? notes.map((n) => el("p", { text: n })) : [el("p", { class: "hint", text: "Nothing to note." })]),
    el("p", { class: "hint", text: `Updated ${new Date(state.published || Date.now()).toLocaleTimeString()}.` }));
}

function showTab(name) {
  view.tab = name;
  for (const t of ["node", "pending", "quotas", "notes"]) {
    $("tab-" + t).setAttribute("aria-selected", String(t === name));
    $("panel-" + t).hidden = t !== name;
  }
}

function render() {
  renderTotals();
  renderRows();
  if (view.tab === "node") renderNode();
  if (view.tab === "pending") renderPending();
  if (view.tab === "quotas") renderQuotas();
  if (view.tab === "notes") renderNotes();
}

document.addEventListener("DOMContentLoaded", () => {
  $("nodes").addEventListener("scroll", () => requestAnimationFrame(renderRows));
  window.addEventListener("resize", () => requestAnimationFrame(renderRows));
  $("filter").addEventListener("input", (e) => { view.filter = e.target.value.trim().toLowerCase(); refilter(); renderRows(); });
  for (const t of ["node", "pending", "quotas", "notes"]) $("tab-" + t).addEventListener("click", () => { showTab(t); render(); });
  $("nodes").addEventListener("keydown", (e) => {
    if (!view.shown.length) return;
    let i = view.shown.indexOf(view.selected);
    if (e.key === "ArrowDown") i = Math.min(view.shown.length - 1, i + 1);
    else if (e.key === "ArrowUp") i = Math.max(0, i - 1);
    else if (e.key === "Home") i = 0;
    else if (e.key === "End") i = view.shown.length - 1;
    else return;
    e.preventDefault();
    select(view.shown[i]);
    const box = $("nodes");
    if (i * ROW < box.scrollTop) box.scrollTop = i * ROW;
    else if ((i + 1) * ROW > box.scrollTop + box.clientHeight) box.scrollTop = (i + 1) * ROW - box.clientHeight;
  });
  view.token = token();
  connect();
});
