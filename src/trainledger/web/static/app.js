// trainledger web page. It computes nothing: it sends the form to the JSON API and shows what
// comes back (figures are formatted and charts drawn by the server). State lives in the URL.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const form = () => $("#form");
const planForm = () => $("#plan-form");
let defaults = {};
let presetInfo = {};
let ctrl = null;
let timer = null;
let seq = 0;

async function api(path, body, opts = {}) {
  const init = body === undefined ? { signal: opts.signal } : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), signal: opts.signal,
  };
  const r = await fetch(path, init);
  if (!r.ok) {
    let e = {};
    try { e = await r.json(); } catch (_) { e = {}; }
    const err = new Error(e.error || `request failed (HTTP ${r.status})`);
    err.field = e.field || null;
    throw err;
  }
  return opts.raw ? r : r.json();
}

function fieldValue(el) {
  const v = el.value.trim();
  if (v === "") return undefined;
  if (el.dataset.kind === "int") return Number.parseInt(v, 10);
  if (el.dataset.kind === "float") return Number(v);
  return v;
}

function readInputs() {
  const inputs = {};
  const prices = {};
  let config = null;
  for (const el of form().elements) {
    if (!el.name) continue;
    const v = fieldValue(el);
    if (el.name === "config_json") { config = v || null; continue; }
    if (v === undefined) continue;
    if (el.dataset.group === "prices") prices[el.name] = v; else inputs[el.name] = v;
  }
  return { inputs, config_json: config, prices };
}

function syncUrl() {
  const q = new URLSearchParams();
  for (const el of [...form().elements, ...planForm().elements]) {
    if (!el.name || el.dataset.nourl || el.type === "checkbox") continue;
    const v = el.value.trim();
    if (v !== "" && String(defaults[el.name] ?? "") !== v) q.set(el.name, v);
  }
  const picks = [...document.querySelectorAll("#plan-gpus input:checked")].map((c) => c.value);
  if (picks.length) q.set("plan_gpus", picks.join(","));
  history.replaceState(null, "", q.toString() ? `?${q}` : location.pathname);
}

function applyUrl() {
  const q = new URLSearchParams(location.search);
  for (const [k, v] of q) {
    if (k === "plan_gpus") {
      for (const name of v.split(",")) {
        const box = document.querySelector(`#plan-gpus input[value="${CSS.escape(name)}"]`);
        if (box) box.checked = true;
      }
      continue;
    }
    const el = form().elements.namedItem(k) || planForm().elements.namedItem(k);
    if (el && !el.dataset.nourl) el.value = v;
  }
}

function clearErrors() {
  for (const s of document.querySelectorAll(".err")) s.textContent = "";
  for (const el of document.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  $("#global-error").hidden = true;
}

function showError(err) {
  const slot = err.field && document.getElementById(`err-${err.field}`);
  if (slot) {
    slot.textContent = err.message;
    const el = document.querySelector(`[name="${err.field}"]`) || document.getElementById(`f-${err.field}`);
    if (el) el.setAttribute("aria-invalid", "true");
    if (err.field === "config_json") $("#paste").open = true;
  } else {
    const g = $("#global-error");
    g.textContent = err.message;
    g.hidden = false;
  }
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function renderBlock(b) {
  if (b.kind === "svg") { const d = el("div", undefined, "chart-wrap"); d.innerHTML = b.content; return d; }
  if (b.kind === "p") return el("p", b.content);
  if (b.kind === "h3") return el("h3", b.content);
  if (b.kind === "list") { const u = el("ul"); for (const x of b.content) u.append(el("li", x)); return u; }
  if (b.kind === "kv") {
    const d = el("dl", undefined, "summary");
    for (const [k, v] of b.items) { d.append(el("dt", k), el("dd", v)); }
    return d;
  }
  if (b.kind === "table") {
    const t = el("table");
    const hr = el("tr");
    for (const h of b.headers) hr.append(el("th", h));
    t.append(el("thead"));
    t.tHead.append(hr);
    const tb = el("tbody");
    for (const r of b.rows) {
      const tr = el("tr");
      if (r[1] === "warn" || r[1] === "fail") tr.className = `level-${r[1]}`;
      for (const c of r) tr.append(el("td", String(c)));
      tb.append(tr);
    }
    t.append(tb);
    return t;
  }
  return el("p", "");
}

function renderSections(root, sections) {
  root.replaceChildren();
  for (const s of sections) {
    const sec = el("section");
    sec.id = `view-${s.id}`;
    sec.append(el("h2", s.title));
    for (const b of s.blocks) sec.append(renderBlock(b));
    root.append(sec);
  }
}

function show(view) {
  const v = $("#verdict");
  v.textContent = `${view.verdict} — ${view.title}`;
  v.dataset.fits = String(view.fits);
  const dl = $("#summary");
  dl.replaceChildren();
  for (const [k, val] of view.summary) dl.append(el("dt", k), el("dd", val));
  renderSections($("#sections"), view.sections.filter((s) => s.id !== "summary"));
}

function showModelInfo() {
  const p = presetInfo[$("#f-model").value.trim().toLowerCase()];
  $("#model-info").textContent = p ? `${p.params_label} parameters · ${p.model_type} · ${p.layers} layers${p.source ? " · " + p.source : ""}` : "";
}

async function update() {
  syncUrl();
  showModelInfo();
  if (ctrl) ctrl.abort();
  ctrl = new AbortController();
  const mine = ++seq;
  $("#results").setAttribute("aria-busy", "true");
  try {
    const view = await api("/api/estimate", readInputs(), { signal: ctrl.signal });
    if (mine !== seq) return;
    clearErrors();
    show(view);
    $("#results").dataset.stale = "0";
  } catch (err) {
    if (err.name === "AbortError" || mine !== seq) return;
    clearErrors();
    showError(err);
    const v = $("#verdict");
    v.textContent = "Fix the highlighted input";
    v.dataset.fits = "";
    $("#results").dataset.stale = "1";  // figures below are from the last valid inputs
  } finally {
    if (mine === seq) $("#results").setAttribute("aria-busy", "false");
  }
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(update, 300);
}

function saveBlob(blob, name) {
  const a = el("a", `saved ${name}`);
  a.href = URL.createObjectURL(blob);
  a.download = name;
  $("#downloads").append(a);
  a.click();
}

async function downloadReport(fmt) {
  clearErrors();
  try {
    const r = await api("/api/report", { ...readInputs(), format: fmt }, { raw: true });
    const cd = r.headers.get("content-disposition") || "";
    const m = /filename="([^"]+)"/.exec(cd);
    saveBlob(await r.blob(), m ? m[1] : `trainledger-report.${fmt}`);
  } catch (err) { showError(err); }
}

async function downloadExport() {
  clearErrors();
  try {
    const { inputs } = readInputs();
    const res = await api("/api/export", { inputs, format: $("#export-format").value });
    for (const f of res.files) saveBlob(new Blob([f.text], { type: "text/plain" }), f.name);
  } catch (err) {
    if (!err.field) err.field = "export_format";
    showError(err);
  }
}

async function runPlan(ev) {
  ev.preventDefault();
  clearErrors();
  syncUrl();
  const { inputs } = readInputs();
  const job = {};
  for (const k of ["model", "method", "precision", "optimizer", "attention", "seq_len", "global_batch", "tokens", "lora_rank", "headroom"]) {
    if (inputs[k] !== undefined) job[k] = inputs[k];
  }
  for (const e of planForm().elements) {
    if (e.name && e.type !== "checkbox") { const v = fieldValue(e); if (v !== undefined) job[e.name] = v; }
  }
  job.gpus = [...document.querySelectorAll("#plan-gpus input:checked")].map((c) => c.value);
  const status = $("#plan-status");
  status.textContent = "searching…";
  try {
    const res = await api("/api/plan", job);
    status.textContent = `${res.count} plans ranked, ${res.rejected_count} candidates rejected`;
    renderSections($("#plan-results"), [{ id: "plans", title: "Ranked and rejected plans", blocks: res.blocks }]);
  } catch (err) {
    status.textContent = "";
    showError(err);
  }
}

function fillSelect(sel, values, optional) {
  sel.replaceChildren();
  if (optional) sel.append(new Option("(default)", ""));
  for (const v of values) sel.append(new Option(v, v));
}

async function init() {
  const [opts, gpus, presets] = await Promise.all([api("/api/options"), api("/api/gpus"), api("/api/presets")]);
  defaults = { ...opts.defaults, max_gpus: "512", rank_by: "time" };
  for (const sel of document.querySelectorAll("select[data-options]")) {
    fillSelect(sel, opts[sel.dataset.options] || [], sel.dataset.optional === "1");
  }
  const gsel = $("#f-gpu");
  for (const g of gpus) gsel.append(new Option(g.label, g.name));
  const dl = $("#presets");
  for (const p of presets) {
    presetInfo[p.name] = p;
    const o = new Option(`${p.params_label} · ${p.source || p.model_type}`, p.name);
    dl.append(o);
  }
  const box = $("#plan-gpus");
  for (const g of gpus) {
    const lab = el("label");
    const c = el("input");
    c.type = "checkbox";
    c.value = g.name;
    c.name = `plan-gpu-${g.name}`;
    lab.append(c, ` ${g.name}`);
    box.append(lab);
  }
  for (const e of form().elements) {
    if (e.name && defaults[e.name] !== undefined && defaults[e.name] !== null) e.value = String(defaults[e.name]);
  }
  applyUrl();
  form().addEventListener("input", schedule);
  form().addEventListener("change", schedule);
  planForm().addEventListener("submit", runPlan);
  planForm().addEventListener("change", syncUrl);
  $("#dl-html").addEventListener("click", () => downloadReport("html"));
  $("#dl-md").addEventListener("click", () => downloadReport("md"));
  $("#dl-export").addEventListener("click", downloadExport);
  document.body.dataset.ready = "1";
  await update();
}

document.addEventListener("DOMContentLoaded", () => {
  init().catch((err) => showError(err));
});
