// The edgefl dashboard: redraws the page on every fleet status from /events (server-sent events).
// No inline code (the page's Content-Security-Policy allows this file only); text is set with
// textContent, never parsed as HTML (device ids and errors come from the network).
"use strict";
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#0969da", "#1a7f37", "#bf8700", "#cf222e", "#8250df", "#1b7c83", "#953800", "#6e7781"];
const TERMINAL = new Set(["finished", "interrupted", "stopped"]);

function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}
function svgEl(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}
const num = v => typeof v === "number" && isFinite(v);
const pct = a => num(a) ? `${(100 * a).toFixed(1)} %` : "-";
function ago(t, now) {
  if (!num(t)) return "-";
  const s = Math.max(0, now - t);
  return s < 120 ? `${s.toFixed(0)} s ago` : s < 7200 ? `${(s / 60).toFixed(0)} min ago` : `${(s / 3600).toFixed(1)} h ago`;
}
function bytes(n) {
  n = n || 0;
  for (const u of ["B", "kB", "MB", "GB"]) { if (n < 1000 || u === "GB") return u === "B" ? `${n} B` : `${n.toFixed(1)} ${u}`; n /= 1000; }
}
const tierName = t => `tier ${t}`;
const byTier = (a, b) => a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);

// -- the run's state --------------------------------------------------------------------------
function phaseOf(s) {
  const srv = s.server || {};
  let phase = srv.phase || "";
  if (phase === "done") phase = "finished";  // servers before the finished status
  if (!TERMINAL.has(phase) && srv.connection === "offline") phase = "stopped";  // its Last Will
  return phase;
}
function resultOf(s) {
  const r = s.result || (s.server || {}).result;
  if (r && (num(r.mean_accuracy) || r.mean_accuracy === null)) return r;
  const fin = (s.history || []).find(h => h.round === "final");
  return fin ? {mean_accuracy: fin.mean_accuracy, devices: null} : null;
}
const MEASURED = {
  "final-evaluation": "the final evaluation",
  "mixed": "the final evaluation; devices that missed it by their last per-round evaluation",
  "last-round": "each device's last per-round evaluation (none answered the final one)",
  "none": "no evaluation",
};
function measuredBy(m, fromRound) {
  if (!m) return "";
  if (typeof m === "string") {
    const late = fromRound && Object.keys(fromRound).length
      ? ` (${Object.entries(fromRound).sort().map(([d, r]) => `${d}: round ${r}`).join(", ")})` : "";
    return (MEASURED[m] || m) + (m === "mixed" || m === "last-round" ? late : "");
  }
  if (typeof m === "object") return Object.entries(m).map(([k, v]) => `${k.replace(/_/g, " ")}: ${Array.isArray(v) ? v.join(", ") : typeof v === "object" && v ? Object.keys(v).join(", ") : v}`).join("; ");
  return String(m);
}
function renderRun(s, now) {
  const srv = s.server || {};
  const phase = phaseOf(s);
  const devices = Object.values(s.devices || {});
  const round = num(srv.round) ? srv.round : null;
  const of = num(srv.rounds) && srv.rounds ? ` of ${srv.rounds}` : "";
  const closes = num(srv.deadline) && !TERMINAL.has(phase) ? `the deadline closes in ${Math.max(0, srv.deadline - now).toFixed(0)} s` : "";
  let state, detail = "";
  if (phase === "waiting") {
    const registered = num(srv.registered) ? srv.registered : devices.length;
    state = num(srv.expected) ? `Waiting for devices: ${registered} of ${srv.expected} registered` : `Waiting for devices: ${registered} registered`;
    detail = devices.length ? `registered: ${Object.keys(s.devices).sort().join(", ")}` : "no device has registered yet";
  } else if (phase === "train") {
    state = `Training round ${round ?? "-"}${of}`;
    detail = closes;
  } else if (phase === "evaluate" && srv.final_evaluation) {
    state = "Final evaluation";
    detail = closes || "the devices are evaluated on the test split";
  } else if (phase === "evaluate") {
    state = `Evaluating round ${round ?? "-"}${of}`;
    detail = closes;
  } else if (phase === "finish") {
    state = "Final evaluation";
    detail = closes || "the devices get their final models and are evaluated on the test split";
  } else if (phase === "finished") {
    state = "Finished";
  } else if (phase === "interrupted") {
    state = `Interrupted${round !== null ? ` during round ${round}${of}` : ""}`;
    detail = "the server was stopped; the record holds the rounds completed before";
  } else if (phase === "stopped") {
    state = "Stopped: the server is gone";
    detail = "its connection ended without a finished run (its Last Will)";
  } else {
    state = phase ? `Phase: ${phase}` : "waiting for the fleet status…";
  }
  const box = document.getElementById("run");
  box.setAttribute("data-phase", phase);
  document.getElementById("state").textContent = state;
  document.getElementById("detail").textContent = detail;
  document.getElementById("run-name").textContent = srv.run || "-";
  document.getElementById("algorithm").textContent = srv.algorithm || "-";
  document.getElementById("round").textContent = round === null || phase === "waiting" ? "-" : String(round);
  document.getElementById("rounds").textContent = num(srv.rounds) ? String(srv.rounds) : "-";
  const res = resultOf(s);
  const out = document.getElementById("result");
  out.textContent = "";
  if (res && (TERMINAL.has(phase) || s.result)) {
    const over = num(res.devices) ? ` over ${res.devices} device${res.devices === 1 ? "" : "s"}` : "";
    out.append(el("strong", {}, num(res.mean_accuracy) ? `Result: ${pct(res.mean_accuracy)} mean accuracy${over}` : `Result: not measured${over}`));
    const by = measuredBy(res.measured_by, res.from_last_round);
    if (by) out.append(` (measured by ${by})`);
    const ref = s.reference;
    if (ref && num(ref.mean_accuracy) && num(res.mean_accuracy))
      out.append(`; ${ref.label} ${pct(ref.mean_accuracy)} (${(100 * (res.mean_accuracy - ref.mean_accuracy)) >= 0 ? "+" : ""}${(100 * (res.mean_accuracy - ref.mean_accuracy)).toFixed(1)} points)`);
  }
}

// -- devices ----------------------------------------------------------------------------------
function renderDevices(s, now) {
  const body = document.getElementById("devices");
  body.replaceChildren();
  const counts = {};
  const over = TERMINAL.has(phaseOf(s));
  for (const [id, d] of Object.entries(s.devices || {}).sort()) {
    const p = d.profile || {};
    // after the run, a device that trained the last round and then disconnected with nothing
    // wrong left when the run was over; it is not lost
    const last = num((s.server || {}).round) ? s.server.round : (s.server || {}).rounds;
    const state = over && d.state === "gone" && !d.last_error && num(d.last_round) && d.last_round >= last ? "left" : d.state;
    counts[state || "?"] = (counts[state || "?"] || 0) + 1;
    const tr = el("tr", {"data-device": id, "data-state": state || ""});
    const version = (d.model_version || "-") + (d.model_error ? " (a deploy was refused)" : "");
    const error = d.last_error || d.model_error || "";
    const cells = [
      [id], [state || "-", "state"], [d.tier !== null && d.tier !== undefined ? tierName(d.tier) : "-"], [d.model || "-"], [version],
      [num(d.last_round) ? String(d.last_round) : "-"], [ago(d.last_seen, now)], [error || "-", error ? "error" : ""],
      [bytes(d.bytes_up)], [bytes(d.bytes_down)], [[p.name, p.arch, p.cores && `${p.cores} cores`].filter(Boolean).join(", ") || "-"],
    ];
    for (const [text, cls] of cells) tr.appendChild(el("td", cls ? {class: cls} : {}, text));
    body.appendChild(tr);
  }
  document.getElementById("counts").textContent = Object.keys(counts).length
    ? "(" + Object.entries(counts).sort().map(([k, n]) => `${n} ${k}`).join(", ") + ")" : "";
  const acc = s.tier_accuracy || {};
  document.getElementById("tiers").textContent = Object.keys(acc).length
    ? "Last evaluation (device-reported): " + Object.keys(acc).sort(byTier).map(t => `${tierName(t)} ${pct(acc[t])}`).join(", ") : "";
  // a run with differential privacy: the server's ledger, ε spent so far per device (docs/privacy.md)
  const priv = (s.server || {}).privacy;
  const spent = Object.entries(s.devices || {}).sort().filter(([, d]) => num(d.epsilon)).map(([id, d]) => `${id} ${d.epsilon.toFixed(2)}`);
  document.getElementById("privacy").textContent = priv
    ? `Differential privacy (${priv.mode}), budget ε ${priv.target_epsilon} at δ ${priv.delta} per device; ε spent: ${spent.join(", ") || "none yet"}` : "";
}

// -- charts -----------------------------------------------------------------------------------
function niceStep(span, target) {
  const raw = span / Math.max(1, target), mag = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}
function legend(id, items) {
  const box = document.getElementById(id);
  box.replaceChildren();
  for (const it of items) {
    const sw = svgEl("svg", {width: 22, height: 10, class: "swatch"});
    if (it.marker === "diamond") sw.appendChild(svgEl("path", {d: "M11 0 L16 5 L11 10 L6 5 Z", fill: it.color}));
    else if (it.marker === "band") sw.appendChild(svgEl("rect", {x: 0, y: 0, width: 22, height: 10, fill: it.color, "fill-opacity": 0.18}));
    else if (it.marker === "tick") sw.appendChild(svgEl("path", {d: "M11 0 L16 10 L6 10 Z", fill: it.color}));
    else sw.appendChild(svgEl("line", {x1: 0, y1: 5, x2: 22, y2: 5, stroke: it.color, "stroke-width": 2.5, "stroke-dasharray": it.dash || ""}));
    const span = el("span", {"data-series": it.label});
    span.append(sw, it.label);
    box.appendChild(span);
  }
}
// axes: x integer rounds in [x0, x1]; y from 0 to ymax with ticks formatted by fmt
function axes(svg, {x0, x1, ymax, fmt, xlabel, ylabel, extraX}) {
  svg.replaceChildren();
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const L = 62, R = 18, T = 12, B = 42;
  const sx = r => L + (x1 > x0 ? (r - x0) / (x1 - x0) : 0.5) * (W - L - R);
  const sy = v => H - B - (v / ymax) * (H - T - B);
  const ystep = niceStep(ymax, 5);
  for (let v = 0; v <= ymax + 1e-9; v += ystep) {
    svg.appendChild(svgEl("line", {x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: v === 0 ? "#8c959f" : "#e6e9ec"}));
    svg.appendChild(svgEl("text", {x: L - 6, y: sy(v) + 4, "text-anchor": "end"}, fmt(v)));
  }
  const xstep = Math.max(1, Math.ceil((x1 - x0 + 1) / 12));
  const xlast = extraX ? extraX.at - 1 : x1;  // a labelled extra tick (the final evaluation) replaces the last number
  for (let r = x0; r <= xlast; r += xstep) {
    svg.appendChild(svgEl("line", {x1: sx(r), x2: sx(r), y1: H - B, y2: H - B + 4, stroke: "#8c959f"}));
    svg.appendChild(svgEl("text", {x: sx(r), y: H - B + 16, "text-anchor": "middle", class: "x-tick"}, String(r)));
  }
  if (extraX) {
    svg.appendChild(svgEl("text", {x: sx(extraX.at), y: H - B + 16, "text-anchor": "middle", class: "x-tick"}, extraX.label));
  }
  svg.appendChild(svgEl("line", {x1: L, x2: L, y1: T, y2: H - B, stroke: "#8c959f"}));
  svg.appendChild(svgEl("text", {x: L + (W - L - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis-label"}, xlabel));
  svg.appendChild(svgEl("text", {x: 14, y: T + (H - T - B) / 2, "text-anchor": "middle", class: "axis-label",
                                 transform: `rotate(-90 14 ${T + (H - T - B) / 2})`}, ylabel));
  return {sx, sy, W, H, L, R, T, B};
}
function polyline(svg, pts, color, {dash = "", width = 2, dots = true} = {}) {
  if (pts.length > 1) svg.appendChild(svgEl("polyline", {fill: "none", stroke: color, "stroke-width": width, "stroke-dasharray": dash,
                                                          points: pts.map(p => `${p[0]},${p[1]}`).join(" ")}));
  if (dots || pts.length === 1) for (const p of pts) svg.appendChild(svgEl("circle", {cx: p[0], cy: p[1], r: 2.8, fill: color}));
}
function renderAccuracy(s) {
  const srv = s.server || {};
  const hist = (s.history || []).filter(h => num(h.round));
  const final = (s.history || []).find(h => h.round === "final") || null;
  const evals = hist.filter(h => num(h.mean_accuracy) || Object.values(h.tier_accuracy || {}).some(num));
  const rounds = hist.map(h => h.round);
  const last = rounds.length ? Math.max(...rounds) : 1;
  const finalX = final ? last + 1 : null;  // just after the last round
  const x0 = rounds.length ? Math.min(...rounds) : 1;
  const x1 = finalX ?? Math.max(last, num(srv.rounds) && srv.rounds ? srv.rounds : last, x0 + 1);
  const svg = document.getElementById("accuracy");
  const ax = axes(svg, {x0, x1, ymax: 1, fmt: v => `${Math.round(100 * v)}`, xlabel: "round", ylabel: "accuracy (%)",
                        extraX: finalX !== null ? {at: finalX, label: "final"} : null});
  const tiers = new Set();
  for (const h of evals.concat(final ? [final] : [])) for (const t of Object.keys(h.tier_accuracy || {})) tiers.add(t);
  const items = [];
  const ref = s.reference;
  if (ref && num(ref.mean_accuracy)) {
    svg.appendChild(svgEl("line", {x1: ax.L, x2: ax.W - ax.R, y1: ax.sy(ref.mean_accuracy), y2: ax.sy(ref.mean_accuracy),
                                   stroke: "#59636e", "stroke-width": 1.5, "stroke-dasharray": "6 4", class: "reference"}));
    items.push({label: `${ref.label}, mean ${pct(ref.mean_accuracy)}`, color: "#59636e", dash: "6 4"});
  }
  [...tiers].sort(byTier).forEach((t, i) => {
    const color = COLORS[i % COLORS.length];
    const pts = evals.filter(h => num((h.tier_accuracy || {})[t])).map(h => [ax.sx(h.round), ax.sy(h.tier_accuracy[t])]);
    polyline(svg, pts, color);
    if (final && num((final.tier_accuracy || {})[t])) {
      const fx = ax.sx(finalX), fy = ax.sy(final.tier_accuracy[t]);
      svg.appendChild(svgEl("path", {d: `M${fx} ${fy - 6} L${fx + 6} ${fy} L${fx} ${fy + 6} L${fx - 6} ${fy} Z`, fill: color, class: "final"}));
    }
    items.push({label: tierName(t), color});
  });
  const means = evals.filter(h => num(h.mean_accuracy)).map(h => [ax.sx(h.round), ax.sy(h.mean_accuracy)]);
  if (tiers.size > 1 && means.length) {
    polyline(svg, means, "#1f2328", {width: 2.5, dots: false});
    items.push({label: "mean over devices", color: "#1f2328"});
  }
  if (final && num(final.mean_accuracy) && tiers.size > 1) {
    const fx = ax.sx(finalX), fy = ax.sy(final.mean_accuracy);
    svg.appendChild(svgEl("path", {d: `M${fx} ${fy - 6} L${fx + 6} ${fy} L${fx} ${fy + 6} L${fx - 6} ${fy} Z`, fill: "#1f2328", class: "final"}));
  }
  if (final && num(final.mean_accuracy)) items.push({label: `final (test split): mean ${pct(final.mean_accuracy)}`, color: "#1f2328", marker: "diamond"});
  if (!evals.length && !final) svg.appendChild(svgEl("text", {x: ax.L + 12, y: ax.T + 20}, "no evaluation yet"));
  legend("accuracy-legend", items);
}
function renderBytes(s) {
  const hist = (s.history || []).filter(h => num(h.round));
  const rounds = hist.map(h => h.round);
  const x0 = rounds.length ? Math.min(...rounds) : 1, x1 = Math.max(rounds.length ? Math.max(...rounds) : 1, x0 + 1);
  const mb = n => (n || 0) / 1e6;
  const top = Math.max(...hist.map(h => Math.max(mb(h.bytes_up), mb(h.bytes_down))), 0) || 1;
  const ymax = niceStep(top, 5) * Math.ceil(top / niceStep(top, 5));
  const svg = document.getElementById("bytes");
  const decimals = Math.max(0, -Math.floor(Math.log10(niceStep(ymax, 5)) + 1e-9));
  const fmt = v => v.toFixed(decimals);
  const ax = axes(svg, {x0, x1, ymax, fmt, xlabel: "round", ylabel: "MB per round (10⁶ bytes)"});
  const items = [];
  const half = hist.length > 1 ? (ax.sx(x0 + 1) - ax.sx(x0)) / 2 : 10;
  const evaluated = hist.filter(h => h.evaluated);
  const alternating = evaluated.length > 0 && evaluated.length < hist.length;
  for (const h of alternating ? evaluated : []) {  // a band one round wide, inside the plot
    const left = Math.max(ax.L, ax.sx(h.round) - half), right = Math.min(ax.W - ax.R, ax.sx(h.round) + half);
    svg.appendChild(svgEl("rect", {x: left, y: ax.T, width: right - left, height: ax.H - ax.T - ax.B, fill: "#8250df", "fill-opacity": 0.08, class: "eval-round"}));
  }
  const cvae = hist.filter(h => h.cvae);
  for (const h of cvae)
    svg.appendChild(svgEl("path", {d: `M${ax.sx(h.round)} ${ax.H - ax.B - 9} L${ax.sx(h.round) + 5} ${ax.H - ax.B} L${ax.sx(h.round) - 5} ${ax.H - ax.B} Z`, fill: "#953800", class: "cvae-round"}));
  polyline(svg, hist.map(h => [ax.sx(h.round), ax.sy(mb(h.bytes_up))]), COLORS[0]);
  polyline(svg, hist.map(h => [ax.sx(h.round), ax.sy(mb(h.bytes_down))]), COLORS[3]);
  items.push({label: "uplink (devices → server)", color: COLORS[0]}, {label: "downlink (server → devices)", color: COLORS[3]});
  if (alternating) items.push({label: "evaluation round", color: "#8250df", marker: "band"});
  if (cvae.length) items.push({label: "CVAE round", color: "#953800", marker: "tick"});
  if (!hist.length) svg.appendChild(svgEl("text", {x: ax.L + 12, y: ax.T + 20}, "no round yet"));
  legend("bytes-legend", items);
  const notes = [];
  if (alternating && hist.some(h => h.downlinks_not_resent))
    notes.push("An evaluation round's downlink counts the evaluation's models too; the next round's training downlink is then not re-sent " +
               "(the devices hold it), so traffic alternates.");
  if (cvae.length) notes.push("CVAE round: a round in which the server trained its CVAE (Velo).");
  document.getElementById("bytes-note").textContent = notes.join(" ");
}

function render(s) {
  const now = num(s.time) ? s.time : Date.now() / 1000;
  document.getElementById("fleet").textContent = s.fleet || "";
  renderRun(s, now);
  renderDevices(s, now);
  renderAccuracy(s);
  renderBytes(s);
}

const conn = document.getElementById("conn");
const source = new EventSource("events");
source.onmessage = e => { conn.textContent = "live"; conn.setAttribute("data-conn", "live"); render(JSON.parse(e.data)); };
source.onerror = () => { conn.textContent = "reconnecting…"; conn.setAttribute("data-conn", "reconnecting"); };
