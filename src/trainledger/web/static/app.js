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
let userEdited = false;  // problems of the link stay shown until the user edits the form

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

// A field's value, or a FieldError: "1e4" is 10000, "1.5" in a whole-number field is an error
// (never silently 1), an empty required field is an error (never silently the default).
class FieldError extends Error {
  constructor(field, message) { super(message); this.field = field; }
}

function labelOf(el) {
  const lab = el.id && document.querySelector(`label[for="${el.id}"]`);
  return lab ? lab.textContent.replace(/\s*\(.*\)\s*$/, "") : el.name;
}

function isOptional(el) {
  const lab = el.id && document.querySelector(`label[for="${el.id}"]`);
  return el.dataset.optional === "1" || el.tagName === "TEXTAREA" || (lab && /optional/.test(lab.textContent));
}

function fieldValue(el) {
  const v = el.value.trim();
  if (v === "") {
    if (el.validity && el.validity.badInput) throw new FieldError(el.name, `${labelOf(el)}: not a number`);
    if (!isOptional(el) && el.tagName === "INPUT" && el.dataset.kind) {
      throw new FieldError(el.name, `${labelOf(el)} is required`);
    }
    return undefined;
  }
  if (el.dataset.kind === "int" || el.dataset.kind === "float") {
    const n = Number(v);
    if (!Number.isFinite(n)) throw new FieldError(el.name, `${labelOf(el)}: "${v}" is not a number`);
    if (el.dataset.kind === "int" && !Number.isInteger(n)) {
      throw new FieldError(el.name, `${labelOf(el)} must be a whole number, not ${v}`);
    }
    return n;
  }
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

// base64url of UTF-8 text: the pasted config.json travels in the link's #fragment (never sent
// to the server by the browser, so a reload or a shared link keeps it without a request)
function toB64(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function fromB64(s) {
  const bin = atob(s.replace(/-/g, "+").replace(/_/g, "/"));
  return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
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
  const cfg = $("#f-config_json").value.trim();
  let hash = "";
  if (cfg) { try { hash = `#config=${toB64(JSON.stringify(JSON.parse(cfg)))}`; } catch (_) { hash = `#config=${toB64(cfg)}`; } }
  history.replaceState(null, "", (q.toString() ? `?${q}` : location.pathname) + hash);
}

// Values from the link: one that the form cannot hold is reported next to its field (it was
// silently replaced by the default before).
const urlProblems = [];

function applyUrl() {
  const q = new URLSearchParams(location.search);
  for (const [k, v] of q) {
    if (k === "plan_gpus") {
      for (const name of v.split(",")) {
        const box = document.querySelector(`#plan-gpus input[value="${CSS.escape(name)}"]`);
        if (box) box.checked = true;
        else urlProblems.push(new FieldError("plan_gpus", `the link names an unknown GPU "${name}"`));
      }
      continue;
    }
    const el = form().elements.namedItem(k) || planForm().elements.namedItem(k);
    if (!el || el.dataset.nourl) {
      urlProblems.push(new FieldError(null, `the link has an unknown setting "${k}"; it was not used`));
      continue;
    }
    el.value = v;
    if (el.tagName === "SELECT" && el.value !== v) {
      urlProblems.push(new FieldError(el.name, `${labelOf(el)}: the link's value "${v}" is not one of the choices`));
    } else if (el.tagName === "INPUT" && el.value !== v) {
      urlProblems.push(new FieldError(el.name, `${labelOf(el)}: the link's value "${v}" is not a number`));
    }
  }
  const m = /#config=([A-Za-z0-9_-]+)/.exec(location.hash);
  if (m) {
    try { $("#f-config_json").value = fromB64(m[1]); $("#paste").open = true; } catch (_) {
      urlProblems.push(new FieldError("config_json", "the link's config.json could not be read"));
    }
  }
}

function clearErrors() {
  for (const s of document.querySelectorAll(".err")) s.textContent = "";
  for (const el of document.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  $("#global-error").hidden = true;
}

// Server messages are written for the CLI: say them in the page's terms (labels, not --flags or
// validation patterns).
function humanize(msg) {
  let m = String(msg).replace(/String should match pattern '[^']*'/g, "contains characters that are not allowed");
  m = m.replace(/--([a-z][a-z0-9-]*)/g, (all, flag) => {
    const el = form().elements.namedItem(flag.replace(/-/g, "_"));
    return el ? `"${labelOf(el)}"` : all;
  });
  return m;
}

function showError(err) {
  err = Object.assign(new Error(humanize(err.message)), { field: err.field });
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
    const wrap = el("div", undefined, "table-wrap");  // wide tables scroll inside, the page does not
    wrap.append(t);
    return wrap;
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

function showFixes(view) {
  const box = $("#fixes");
  box.replaceChildren();
  const mem = (view.estimate && view.estimate.memory) || {};
  if (view.fits) { box.hidden = true; return; }
  box.hidden = false;
  box.append(el("h2", "How to make it fit"));
  const sug = mem.suggestions || [];
  if (!sug.length) {
    box.append(el("p", "No single change or combination tried makes it fit: use more GPUs or GPUs with more memory."));
    return;
  }
  const ul = el("ul");
  for (const s of sug) {
    ul.append(el("li", `${humanize(s.change)}: ${(s.device_total_bytes / 2 ** 30).toFixed(2)} GiB on the device`));
  }
  box.append(ul);
}

function show(view) {
  const v = $("#verdict");
  v.textContent = `${view.verdict} — ${view.title}`;
  v.dataset.fits = String(view.fits);
  showFixes(view);
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
    const body = readInputs();  // throws a FieldError for a value the form cannot send
    const view = await api("/api/estimate", body, { signal: ctrl.signal });
    if (mine !== seq) return;
    clearErrors();
    if (!userEdited) for (const prob of urlProblems) showError(prob);
    show(view);
    $("#results").dataset.stale = "0";
  } catch (err) {
    if (err.name === "AbortError" || mine !== seq) return;
    clearErrors();
    showError(err);
    if (!userEdited) for (const prob of urlProblems) showError(prob);  // the link's own problem first
    $("#fixes").hidden = true;
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
    const { inputs, config_json } = readInputs();
    const res = await api("/api/export", { inputs, config_json, format: $("#export-format").value });
    for (const f of res.files) saveBlob(new Blob([f.text], { type: "text/plain" }), f.name);
  } catch (err) {
    if (!err.field) err.field = "export_format";
    showError(err);
  }
}

let planCtrl = null;
let planTimer = null;

function planStatus(text, isError) {
  const st = $("#plan-status");
  st.textContent = text;
  st.classList.toggle("err", Boolean(isError));
}

function stopPlan(message) {
  if (planCtrl) planCtrl.abort();
  planCtrl = null;
  clearInterval(planTimer);
  $("#run-plan").textContent = "Run planner";
  $("#plan-results").removeAttribute("aria-busy");
  if (message !== undefined) planStatus(message);
}

// One search at a time: a click while searching cancels it (no queue of searches); progress,
// errors and results are shown next to the button; an old result table is cleared first.
async function runPlan(ev) {
  ev.preventDefault();
  if (planCtrl) { stopPlan("search cancelled"); return; }
  clearErrors();
  syncUrl();
  let job;
  try {
    const { inputs, config_json } = readInputs();
    job = { config_json };
    for (const k of ["model", "method", "precision", "optimizer", "attention", "seq_len", "global_batch", "tokens", "lora_rank", "headroom"]) {
      if (inputs[k] !== undefined) job[k] = inputs[k];
    }
    for (const e of planForm().elements) {
      if (e.name && e.type !== "checkbox") { const v = fieldValue(e); if (v !== undefined) job[e.name] = v; }
    }
    if (job.tokens === undefined && job.rank_by !== "gpus") {
      throw new FieldError("tokens", `Ranking by ${job.rank_by} needs a token budget: give one, or rank by GPU count`);
    }
  } catch (err) {
    planStatus(humanize(err.message), true);
    showError(err);
    return;
  }
  job.gpus = [...document.querySelectorAll("#plan-gpus input:checked")].map((c) => c.value);
  planCtrl = new AbortController();
  const mine = planCtrl;
  const t0 = Date.now();
  $("#plan-results").replaceChildren();
  $("#plan-results").setAttribute("aria-busy", "true");
  $("#run-plan").textContent = "Cancel search";
  planStatus("searching…");
  planTimer = setInterval(() => planStatus(`searching… ${Math.round((Date.now() - t0) / 1000)} s`), 1000);
  try {
    const res = await api("/api/plan", job, { signal: mine.signal });
    if (planCtrl !== mine) return;
    stopPlan(`${res.count} plans ranked, ${res.rejected_count} candidates rejected (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
    renderSections($("#plan-results"), [{ id: "plans", title: "Ranked and rejected plans", blocks: res.blocks }]);
  } catch (err) {
    if (err.name === "AbortError" || planCtrl !== mine) return;
    stopPlan();
    planStatus(`search failed: ${humanize(err.message)}`, true);
    if (err.field) showError(err);
  }
}

function fillSelect(sel, values, optional) {
  sel.replaceChildren();
  if (optional) sel.append(new Option("(default)", ""));
  for (const v of values) sel.append(new Option(v, v));
}

async function init() {
  const [opts, gpus, presets] = await Promise.all([api("/api/options"), api("/api/gpus"), api("/api/presets")]);
  defaults = { ...opts.defaults, max_gpus: "512", rank_by: "time", deadline_quantile: "estimate" };
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
  for (const prob of urlProblems) showError(prob);
  form().addEventListener("input", () => { userEdited = true; });
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
