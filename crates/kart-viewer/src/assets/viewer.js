// kart's trajectory viewer: reads the JSON API beside this page (api/…) and draws the steps,
// the filtered list of trajectories, one trajectory as its conversation, and a group side by side.
"use strict";

const PAGE = 100;
const state = { offset: 0, picked: null };

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

async function api(path) {
  const response = await fetch("api/" + path);
  const body = await response.json();
  if (!response.ok) throw new Error((body.error && body.error.message) || response.statusText);
  return body;
}

function fmt(x, digits = 3) {
  return typeof x === "number" && Number.isFinite(x) ? x.toFixed(digits).replace(/\.?0+$/, "") || "0" : "–";
}

function toolsText(tools) {
  return Object.entries(tools || {}).map(([tool, n]) => `${tool} ${n}`).join(", ");
}

function filters() {
  const params = new URLSearchParams();
  for (const input of document.querySelectorAll("#filters [data-param]")) {
    if (input.value !== "") params.set(input.dataset.param, input.value);
  }
  return params;
}

function fillSelect(select, values) {
  const kept = select.value;
  const first = select.options[0];
  select.replaceChildren(first, ...values.map((v) => el("option", { value: String(v), text: String(v) })));
  if ([...select.options].some((o) => o.value === kept)) select.value = kept;
}

async function loadSummary() {
  const s = await api("summary");
  $("file").textContent = `${s.file} · ${s.trajectories} trajectories` + (s.unreadable ? ` · ${s.unreadable} unreadable lines` : "");
  $("steps-empty").hidden = s.trajectories > 0;
  const best = Math.max(1e-9, ...s.steps.map((st) => Math.abs(st.reward_mean)));
  $("steps").tBodies[0].replaceChildren(
    ...s.steps.map((st) =>
      el(
        "tr",
        { "data-step": st.step, onclick: () => pickStep(st.step) },
        el("td", { class: "num", text: st.step }),
        el("td", { class: "num", text: st.trajectories }),
        el("td", { class: "num", text: st.groups }),
        el("td", { class: "num" }, fmt(st.reward_mean), el("span", { class: "bar", style: `width:${(60 * Math.abs(st.reward_mean)) / best}px` })),
        el("td", { class: "num", text: fmt(st.reward_min) }),
        el("td", { class: "num", text: fmt(st.reward_max) }),
        el("td", { text: Object.entries(st.tool_calls).map(([t, n]) => `${t} ${fmt(n, 2)}`).join(", ") }),
        el("td", { text: Object.entries(st.statuses).map(([k, n]) => `${k} ${n}`).join(", ") }),
      ),
    ),
  );
  fillSelect($("f-step"), s.steps.map((st) => st.step));
  fillSelect($("f-env"), s.envs);
  fillSelect($("f-role"), s.roles);
  fillSelect($("f-tool"), s.tools);
}

function pickStep(step) {
  $("f-step").value = String(step);
  loadList(true);
}

async function loadList(fresh) {
  if (fresh) state.offset = 0;
  const params = filters();
  params.set("offset", state.offset);
  params.set("limit", PAGE);
  let page;
  try {
    page = await api("trajectories?" + params);
  } catch (e) {
    $("count").replaceChildren(el("span", { class: "error", text: e.message }));
    return;
  }
  const rows = page.items.map((t) =>
    el(
      "tr",
      { "data-line": t.line, onclick: () => showTrajectory(t.line) },
      el("td", { class: "num", text: t.step }),
      el("td", { class: "num", text: fmt(t.reward) }),
      el("td", { text: t.env }),
      el("td", { text: t.role || "" }),
      el("td", { text: toolsText(t.tools) }),
      el("td", { class: "num", text: t.turns }),
      el("td", { class: "num", text: t.staleness ?? "" }),
      el("td", { class: "muted", text: t.id }),
    ),
  );
  const body = $("list").tBodies[0];
  if (fresh) body.replaceChildren(...rows);
  else body.append(...rows);
  state.offset += page.items.length;
  $("count").textContent = `${page.total} trajectories`;
  $("more").hidden = state.offset >= page.total;
  markPicked();
}

function markPicked() {
  for (const row of $("list").tBodies[0].rows) row.classList.toggle("picked", row.dataset.line === String(state.picked));
}

// The text of a span with its tool calls and answer marked; the marks hold the text itself, so
// the span's text is exactly the decoded tokens.
const CALL = /<(search|access|python|calculator|code|tool_call|answer)>[\s\S]*?<\/\1>/g;
function marked(text) {
  const out = [];
  let at = 0;
  for (const m of text.matchAll(CALL)) {
    if (m.index > at) out.push(document.createTextNode(text.slice(at, m.index)));
    out.push(el("mark", { class: m[1] === "answer" ? "answer" : "call", text: m[0] }));
    at = m.index + m[0].length;
  }
  if (at < text.length) out.push(document.createTextNode(text.slice(at)));
  return out;
}

// The segments of `t` drawn, its prompt left out with `withoutPrompt` (a group shares it).
function conversation(t, withoutPrompt) {
  let turn = 0;
  const segments = withoutPrompt ? t.segments.filter((s) => s.role !== "prompt") : t.segments;
  return segments.map((s) => {
    const who = s.role === "prompt" ? "prompt" : s.role === "model" ? `model · turn ${++turn} · carries loss` : "tool response · no loss";
    return el(
      "div",
      { class: `segment ${s.role}`, "data-role": s.role },
      el("div", { class: "who", text: who }),
      el("pre", { class: "text" }, ...marked(s.text ?? s.error ?? "")),
    );
  });
}

function summaryOf(t, line) {
  const stats = t.stats || {};
  const mask = (t.trajectory && t.trajectory.loss_mask) || [];
  const trained = mask.filter((m) => m === 1).length;
  const meta = el(
    "div",
    { class: "meta" },
    ...[
      ["step", t.step],
      ["reward", fmt(t.reward)],
      ["status", t.status],
      ["environment", t.data_source],
      ["role", stats.role || "–"],
      ["turns", stats.turns],
      ["tools", toolsText(Object.fromEntries(Object.entries(stats.tool_calls || {}).map(([k, c]) => [k, (c.ok || 0) + (c.failed || 0)]))) || "none"],
      ["staleness", t.staleness ?? "–"],
      ["tokens with loss", `${trained} of ${mask.length}`],
      ["line", line],
    ].map(([k, v]) => el("span", {}, el("b", { text: k + " " }), String(v))),
  );
  const parts = Object.entries(stats.reward_scores || {});
  const table = parts.length
    ? el("table", { class: "parts" }, el("tr", {}, el("th", { text: "reward part" }), el("th", { text: "score" })), ...parts.map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { class: "num", text: fmt(v) }))))
    : el("span");
  return [meta, table];
}

async function showTrajectory(line) {
  state.picked = line;
  markPicked();
  const detail = $("detail");
  let t;
  try {
    t = await api("trajectories/" + line);
  } catch (e) {
    detail.replaceChildren(el("p", { class: "error", text: e.message }));
    return;
  }
  detail.dataset.line = line;
  detail.replaceChildren(
    el("h2", { text: `trajectory ${t.id}` }),
    ...summaryOf(t, line),
    el("button", { id: "show-group", type: "button", onclick: () => showGroup(t.step, t.prompt_id) }, "Group side by side"),
    el("div", { class: "conversation" }, ...conversation(t)),
  );
}

async function showGroup(step, promptId) {
  const params = new URLSearchParams({ step, prompt_id: promptId, limit: 1000 });
  const page = await api("trajectories?" + params);
  const members = await Promise.all(page.items.map((e) => api("trajectories/" + e.line).then((t) => [e.line, t])));
  $("group-title").textContent = `group of prompt ${promptId} at step ${step}: ${members.length} trajectories`;
  const prompt = members.length ? conversation(members[0][1]).slice(0, 1) : [];
  $("group-prompt").replaceChildren(...prompt);
  $("group-columns").replaceChildren(
    ...members.map(([line, t]) => el("div", { class: "column", "data-line": line }, el("h2", { text: `reward ${fmt(t.reward)}` }), ...summaryOf(t, line), ...conversation(t, true))),
  );
  $("group").hidden = false;
  $("group").scrollIntoView();
}

async function refresh() {
  await loadSummary();
  await loadList(true);
}

function init() {
  for (const input of document.querySelectorAll("#filters [data-param]")) {
    input.addEventListener("change", () => loadList(true));
  }
  $("clear").addEventListener("click", () => {
    for (const input of document.querySelectorAll("#filters [data-param]")) input.value = "";
    loadList(true);
  });
  $("more").addEventListener("click", () => loadList(false));
  $("refresh").addEventListener("click", refresh);
  refresh().catch((e) => $("file").replaceChildren(el("span", { class: "error", text: e.message })));
}

init();
