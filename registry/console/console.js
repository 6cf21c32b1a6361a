// The registry's console: reads GET /v1/regions and GET /v1/layouts, decodes IDs in the browser
// from that schedule (the same answer as a worker's GET /v1/ids/{id}/decode), and makes the four
// operator writes with a confirmation. No request goes anywhere but this registry's own API.
"use strict";

const EPOCH_UNIX_MS = 1767225600000n; // 2026-01-01T00:00:00Z
const LOW_BITS = 22n;
const MAX_TIMESTAMP = (1n << 41n) - 1n; // 2095-09-07T15:47:35.551Z
const FIELD_CLASS = { sign: "f-sign", timestamp: "f-ts", region: "f-region", machine: "f-machine", sequence: "f-seq" };

/// Unix milliseconds as the services write them: 2026-09-26T12:00:00.000Z (year padded to 4).
function formatUnixMs(ms) {
  const d = new Date(Number(ms));
  const pad = (n, w) => String(n).padStart(w, "0");
  return `${pad(d.getUTCFullYear(), 4)}-${pad(d.getUTCMonth() + 1, 2)}-${pad(d.getUTCDate(), 2)}T` +
    `${pad(d.getUTCHours(), 2)}:${pad(d.getUTCMinutes(), 2)}:${pad(d.getUTCSeconds(), 2)}.${pad(d.getUTCMilliseconds(), 3)}Z`;
}

class DecodeError extends Error {}

/// An ID as a caller writes it: decimal digits (leading zeros allowed) below 2^63, or a
/// hyphenated UUIDv7 in either case — the rules of the services' one parser (`parse_id`).
function parseId(text) {
  if (/^[0-9]+$/.test(text)) {
    const value = BigInt(text);
    if (value >> 63n !== 0n) {
      throw new DecodeError(`${text} is out of range: an ID is a non-negative 63-bit integer (< 2^63)`);
    }
    return { kind: "snowflake", value };
  }
  if (text.includes("-")) {
    if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(text)) {
      throw new DecodeError(`${JSON.stringify(text)} is not a UUID in its hyphenated form`);
    }
    const hex = text.replaceAll("-", "").toLowerCase();
    if (hex[12] !== "7") {
      throw new DecodeError(`${JSON.stringify(text)} is a version ${parseInt(hex[12], 16)} UUID, not a UUIDv7`);
    }
    if (!"89ab".includes(hex[16])) {
      throw new DecodeError(`${JSON.stringify(text)} does not have the RFC 9562 variant`);
    }
    return { kind: "uuid", hex };
  }
  throw new DecodeError(`${JSON.stringify(text)} is neither a non-negative 63-bit integer nor a UUIDv7`);
}

/// The layout in force at `timestamp` (ms since the epoch): the last whose from_ms ≤ it.
function layoutAt(schedule, timestamp) {
  const layouts = [...schedule.layouts].sort((a, b) => a.from_ms - b.from_ms);
  let found = layouts[0];
  for (const layout of layouts) {
    if (BigInt(layout.from_ms) <= timestamp) found = layout;
  }
  return found;
}

/// What an ID's bits say, from `schedule` (GET /v1/layouts) and `regions` (GET /v1/regions): the
/// same object a worker's GET /v1/ids/{id}/decode answers, plus `fields` (each field's bits, for
/// drawing). Throws a DecodeError for text that is not an ID.
function decodeId(text, schedule, regions) {
  const parsed = parseId(text);
  if (parsed.kind === "uuid") {
    const unixMs = BigInt("0x" + parsed.hex.slice(0, 12));
    const h = parsed.hex;
    const id = `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
    return { answer: { id, layout: "uuidv7", created_at: formatUnixMs(unixMs) }, fields: null, unixMs };
  }
  const value = parsed.value;
  const timestamp = value >> LOW_BITS;
  const layout = layoutAt(schedule, timestamp);
  const [rb, mb, sb] = [BigInt(layout.region_bits), BigInt(layout.machine_bits), BigInt(layout.sequence_bits)];
  const mask = (bits) => (1n << bits) - 1n;
  const sequence = value & mask(sb);
  const machine = (value >> sb) & mask(mb);
  const region = (value >> (sb + mb)) & mask(rb);
  const unixMs = timestamp + EPOCH_UNIX_MS;
  const answer = {
    id: value.toString(),
    layout: layout.name,
    created_at: formatUnixMs(unixMs),
    machine: Number(machine),
    sequence: Number(sequence),
  };
  if (rb > 0n) {
    const named = regions.find((r) => r.number === Number(region));
    if (named) answer.region = named.name;
    answer.region_number = Number(region);
  }
  const fields = [
    { name: "sign", bits: 1n, value: 0n },
    { name: "timestamp", bits: 41n, value: timestamp },
    ...(rb > 0n ? [{ name: "region", bits: rb, value: region }] : []),
    { name: "machine", bits: mb, value: machine },
    { name: "sequence", bits: sb, value: sequence },
  ];
  return { answer, fields, unixMs, value };
}

// ---- the page ---------------------------------------------------------------------------------

const state = { regions: [], numbersLeft: 0, numbersTotal: 0, schedule: null };

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "grow") node.style.flexGrow = String(value); // CSSOM: allowed by the page's CSP
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attributes = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  return node;
}

/// A request to this registry; resolves to the parsed body, or throws the API's error message.
async function api(method, path, body) {
  const headers = { accept: "application/json" };
  const token = document.getElementById("token").value.trim();
  if (body !== undefined) headers["content-type"] = "application/json";
  if (method !== "GET" && token) headers.authorization = `Bearer ${token}`;
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let parsed = null;
  try {
    parsed = await response.json();
  } catch {
    // Not JSON: reported below with the status.
  }
  if (!response.ok) {
    const message = parsed?.error?.message ?? `HTTP ${response.status}`;
    const code = parsed?.error?.code ?? "error";
    throw new Error(`${message} (${response.status} ${code})`);
  }
  return parsed;
}

async function load() {
  const status = document.getElementById("status");
  try {
    const [regions, schedule] = await Promise.all([api("GET", "/v1/regions"), api("GET", "/v1/layouts")]);
    state.regions = regions.regions;
    state.numbersLeft = regions.numbers_left;
    state.numbersTotal = regions.numbers_total;
    state.schedule = schedule;
    renderRegions();
    renderSchedule();
    status.textContent = `Loaded at ${formatUnixMs(BigInt(Date.now()))}.`;
    status.classList.remove("error");
  } catch (error) {
    status.textContent = `Could not read the registry: ${error.message}`;
    status.classList.add("error");
  }
}

function renderRegions() {
  const active = state.regions.filter((r) => r.status === "active");
  const retired = state.regions.filter((r) => r.status === "retired");
  document.getElementById("numbers-summary").textContent =
    `${active.length} active, ${retired.length} retired, ${state.numbersLeft} of ${state.numbersTotal} numbers left ` +
    `(numbers every layout in force now or later can carry; a number is never handed out twice).`;

  const tbody = document.querySelector("#region-table tbody");
  tbody.replaceChildren(...[...state.regions].sort((a, b) => a.number - b.number).map((r) =>
    el("tr", { "data-region": r.name },
      el("td", { text: String(r.number) }), el("td", { text: r.name }),
      el("td", {}, el("span", { class: `badge ${r.status}`, text: r.status }),
        ...(r.retires_at ? [el("span", { class: "retires", text: `retires at ${r.retires_at}` })] : [])),
      el("td", { text: r.created_at }), el("td", { text: r.retired_at ?? "—" }))));

  const capacity = document.getElementById("capacity");
  capacity.replaceChildren();
  for (const layout of state.schedule?.layouts ?? []) {
    if (layout.region_bits === 0) continue;
    const cells = 2 ** layout.region_bits;
    const row = el("div", { class: "cells", role: "list", "aria-label": `Region numbers under ${layout.name}` });
    // "Left" counts only the numbers every layout can carry, as the API's numbers_left does.
    const usable = Math.min(cells, state.numbersTotal);
    let used = 0, gone = 0;
    for (let n = 0; n < Math.min(cells, 256); n++) {
      const region = state.regions.find((r) => r.number === n);
      const kind = region ? region.status === "active" ? "used" : "retired" : n < state.numbersTotal ? "free" : "unusable";
      if (kind === "used" && n < usable) used++;
      if (kind === "retired" && n < usable) gone++;
      const status = region?.retires_at ? `${region.status}, retires at ${region.retires_at}` : region?.status;
      const label = region ? `${n}: ${region.name} (${status})` : `${n}: ${kind === "free" ? "free" : "not usable under every layout"}`;
      row.append(el("span", { class: `cell ${kind}`, role: "listitem", title: label, "aria-label": label, text: String(n) }));
    }
    const note = cells > 256 ? ` (the first 256 of ${cells} drawn)` : "";
    capacity.append(el("div", { class: "capacity-row" },
      el("p", { text: `${layout.name}: ${layout.region_bits} region bits, ${cells} numbers — ${used} used, ${gone} retired, ${Math.max(0, usable - used - gone)} left${note}` }),
      row));
  }
  capacity.append(el("p", { class: "legend" },
    el("span", { class: "cell used", "aria-hidden": "true" }), " active ",
    el("span", { class: "cell retired", "aria-hidden": "true" }), " retired (never reused) ",
    el("span", { class: "cell free", "aria-hidden": "true" }), " free"));

  const option = (r) => el("option", { value: r.name, text: `${r.name} (number ${r.number})` });
  document.getElementById("retire-region-name").replaceChildren(...active.map(option));
  document.getElementById("cancel-retire-name").replaceChildren(...active.filter((r) => r.retires_at).map(option));
}

function renderSchedule() {
  const schedule = state.schedule;
  const layouts = [...schedule.layouts].sort((a, b) => a.from_ms - b.from_ms);
  const nowMs = BigInt(Date.now()) - EPOCH_UNIX_MS;
  const current = layoutAt(schedule, nowMs);
  const next = layouts.find((l) => BigInt(l.from_ms) > nowMs);
  document.getElementById("schedule-summary").textContent =
    `In force now: ${current.name}. ` + (next ? `Next cutover: ${next.name} at ${next.from}. ` : "No cutover scheduled. ") +
    `Horizon: ${schedule.horizon} (nothing can be scheduled before it). Home region: ${schedule.home_region}. ` +
    `The last representable time is ${formatUnixMs(MAX_TIMESTAMP + EPOCH_UNIX_MS)}.`;

  // The timeline: the epoch to 2095-09-07, each layout's start, the horizon and now.
  const width = 1000, height = 130, left = 20, right = 980, axis = 80;
  const x = (ms) => left + (right - left) * Math.min(1, Math.max(0, Number(ms) / Number(MAX_TIMESTAMP)));
  const timeline = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "timeline" });
  layouts.forEach((layout, i) => {
    const end = i + 1 < layouts.length ? layouts[i + 1].from_ms : Number(MAX_TIMESTAMP);
    timeline.append(svg("rect", { x: x(layout.from_ms), y: axis - 18, width: Math.max(1, x(end) - x(layout.from_ms)), height: 18, class: `span span-${i % 4}` }));
    // Layouts close together on a 70-year axis: their labels take turns on three rows, each
    // with a leader line down to where its layout starts.
    const row = 14 + 15 * (i % 3);
    timeline.append(svg("line", { x1: x(layout.from_ms), y1: row + 3, x2: x(layout.from_ms), y2: axis - 18, class: "leader" }));
    const label = svg("text", { x: x(layout.from_ms) + 3, y: row, class: "layout-label" });
    label.textContent = `${layout.name} from ${layout.from.slice(0, 10)}`;
    timeline.append(label);
  });
  timeline.append(svg("line", { x1: left, y1: axis, x2: right, y2: axis, class: "axis" }));
  for (let year = 2026; year <= 2095; year += year === 2026 ? 4 : 10) {
    const ms = Date.UTC(year, 0, 1) - Number(EPOCH_UNIX_MS);
    timeline.append(svg("line", { x1: x(ms), y1: axis, x2: x(ms), y2: axis + 6, class: "tick" }));
    const t = svg("text", { x: x(ms), y: axis + 20, class: "tick-label" });
    t.textContent = String(year);
    timeline.append(t);
  }
  const marker = (ms, name, cls, dy) => {
    timeline.append(svg("line", { x1: x(ms), y1: axis - 22, x2: x(ms), y2: axis + 6, class: `marker ${cls}` }));
    const t = svg("text", { x: x(ms) + 3, y: axis + 20 + dy, class: `marker-label ${cls}` });
    t.textContent = name;
    timeline.append(t);
  };
  marker(nowMs, "now", "now", 16);
  marker(schedule.horizon_ms, "horizon", "horizon", 30);
  marker(Number(MAX_TIMESTAMP), "2095-09-07", "end", 16);
  document.getElementById("timeline").replaceChildren(timeline);
  document.getElementById("timeline-label").textContent =
    `Timeline from 2026-01-01 to 2095-09-07: ` + layouts.map((l) => `${l.name} from ${l.from}`).join(", ") +
    `; now ${formatUnixMs(nowMs + EPOCH_UNIX_MS)}; horizon ${schedule.horizon}.`;

  document.getElementById("layouts").replaceChildren(...layouts.map((layout) => {
    const fields = [
      { name: "sign", bits: 1 }, { name: "timestamp", bits: 41 },
      ...(layout.region_bits ? [{ name: "region", bits: layout.region_bits }] : []),
      { name: "machine", bits: layout.machine_bits }, { name: "sequence", bits: layout.sequence_bits },
    ];
    const bar = el("div", { class: "bar", role: "img", "aria-label": `${layout.name}: ` + fields.map((f) => `${f.name} ${f.bits} bits`).join(", ") });
    for (const f of fields) {
      bar.append(el("span", { class: `seg ${FIELD_CLASS[f.name]}`, grow: f.bits, text: `${f.name} ${f.bits}` }));
    }
    const limits = `up to ${2 ** layout.machine_bits} machines` + (layout.region_bits ? ` in each of ${2 ** layout.region_bits} regions` : " in the home region") +
      `, ${2 ** layout.sequence_bits} IDs per machine per millisecond`;
    return el("div", { class: "layout", "data-layout": layout.name },
      el("h3", { text: `${layout.name} — from ${layout.from}` }), bar, el("p", { class: "note", text: limits }));
  }));
}

function showDecode(text) {
  const error = document.getElementById("decode-error");
  const result = document.getElementById("decode-result");
  error.textContent = "";
  if (!state.schedule) {
    result.hidden = true;
    error.textContent = "The schedule is not loaded yet.";
    return;
  }
  let decoded;
  try {
    // What was pasted, without the spaces around it (the API takes the text exactly as sent).
    decoded = decodeId(text.trim(), state.schedule, state.regions);
  } catch (e) {
    result.hidden = true;
    error.textContent = e instanceof DecodeError ? e.message : `Could not decode: ${e.message}`;
    return;
  }
  const { answer, fields, unixMs } = decoded;
  const bits = document.getElementById("decode-bits");
  bits.replaceChildren();
  if (fields) {
    const binary = decoded.value.toString(2).padStart(64, "0");
    let offset = 0;
    for (const f of fields) {
      const n = Number(f.bits);
      bits.append(el("span", { class: `field ${FIELD_CLASS[f.name]}`, grow: n },
        el("span", { class: "field-bits", text: binary.slice(offset, offset + n) }),
        el("span", { class: "field-name", text: `${f.name} = ${f.value}` })));
      offset += n;
    }
    document.getElementById("decode-bits-label").textContent = fields.map((f) => `${f.name} ${f.bits} bits = ${f.value}`).join(", ");
  } else {
    bits.append(el("span", { class: "field f-ts", grow: 48 }, el("span", { class: "field-name", text: `unix_ts_ms (48 bits) = ${unixMs}` })),
      el("span", { class: "field f-seq", grow: 80 }, el("span", { class: "field-name", text: "version 7, variant, 74 random bits" })));
    document.getElementById("decode-bits-label").textContent = `UUIDv7: 48-bit Unix timestamp ${unixMs} ms, then version, variant and random bits`;
  }
  const local = new Date(Number(unixMs)).toLocaleString(undefined, { dateStyle: "full", timeStyle: "long" });
  const rows = [
    ["ID", answer.id], ["Layout", answer.layout], ["Created (UTC)", answer.created_at], ["Created (local time)", local],
    ...(answer.region_number !== undefined ? [["Region", answer.region ? `${answer.region} (number ${answer.region_number})` : `number ${answer.region_number} (not a region the registry knows)`]] : []),
    ...(answer.machine !== undefined ? [["Machine", String(answer.machine)], ["Sequence", String(answer.sequence)]] : []),
  ];
  const dl = document.getElementById("decode-fields");
  dl.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { "data-field": k, text: v })]));
  result.hidden = false;
}

/// Asks for confirmation in the page's dialog; resolves true if the operator confirms.
function confirmWrite(title, text, action) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-button").textContent = action;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), { once: true }));
}

async function write(form) {
  const result = document.getElementById("write-result");
  const error = document.getElementById("write-error");
  result.textContent = "";
  error.textContent = "";
  const data = Object.fromEntries(new FormData(form));
  let request;
  switch (form.dataset.write) {
    case "add-region":
      request = {
        title: `Add region ${data.name}?`,
        text: `${data.name} gets the lowest region number never handed out. Region numbers are never reused: if it is retired later, its number stays retired for good.`,
        action: "Add region", method: "POST", path: "/v1/regions", body: { name: data.name },
        done: (r) => `Added ${r.name} as region number ${r.number}.`,
      };
      break;
    case "retire-region": {
      // The name is given twice, chosen and typed: the registry refuses the retirement if they differ.
      const region = state.regions.find((r) => r.name === data.name);
      const number = region?.number ?? "?";
      const body = { confirm: data.confirm.trim() };
      const at = data.at?.trim();
      if (data.now) body.now = true;
      else if (at) body.at = at;
      const when = data.now
        ? "at once: its workers stop issuing at their next registry refresh"
        : `${at ? `at ${at}` : "a grace from now (the registry's retire_grace_ms)"}: its workers keep issuing until then and stop at that time on their own; until then the retirement can be cancelled`;
      request = {
        title: `Retire region ${data.name}?`,
        text: `${data.name} is retired ${when}. Its region number ${number} is never handed out again: region numbers are never reused.`,
        action: "Retire region", method: "POST", path: `/v1/regions/${encodeURIComponent(data.name)}:retire`, body,
        done: (r) => r.retires_at
          ? `${r.name} retires at ${r.retires_at}; number ${r.number} is never reused.`
          : `Retired ${r.name}; number ${r.number} is never reused.`,
      };
      break;
    }
    case "cancel-retire": {
      const region = state.regions.find((r) => r.name === data.name);
      request = {
        title: `Cancel the retirement of ${data.name}?`,
        text: `${data.name} was to retire at ${region?.retires_at ?? "?"}. It stays active, and its workers keep issuing.`,
        action: "Cancel retirement", method: "POST", path: `/v1/regions/${encodeURIComponent(data.name)}:cancel-retire`,
        body: { confirm: data.confirm.trim() },
        done: (r) => `Cancelled the retirement of ${r.name}; it stays active.`,
      };
      break;
    }
    case "add-layout": {
      const body = { name: data.name, region_bits: Number(data.region_bits), machine_bits: Number(data.machine_bits), sequence_bits: Number(data.sequence_bits), from: data.from.trim() };
      request = {
        title: `Schedule layout ${data.name}?`,
        text: `From ${body.from}, every generator issues under ${data.name} (${body.region_bits} region, ${body.machine_bits} machine, ${body.sequence_bits} sequence bits). A scheduled layout cannot be moved or removed, and the horizon never moves back.`,
        action: "Schedule layout", method: "POST", path: "/v1/layouts", body,
        done: (r) => `Scheduled ${r.added}.`,
      };
      break;
    }
    default:
      return;
  }
  if (!(await confirmWrite(request.title, request.text, request.action))) {
    result.textContent = "Cancelled; nothing was written.";
    return;
  }
  try {
    const answer = await api(request.method, request.path, request.body);
    result.textContent = answer ? request.done(answer) : "Done.";
    form.reset();
    await load();
  } catch (e) {
    error.textContent = `The registry refused: ${e.message}`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("decode-form").addEventListener("submit", (event) => {
    event.preventDefault();
    showDecode(document.getElementById("decode-input").value);
  });
  for (const form of document.querySelectorAll("form[data-write]")) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      write(form);
    });
  }
  load();
});

// For the browser test: the decode this page shows, as a worker's decode endpoint answers it.
window.idgenConsole = {
  decode: (text) => decodeId(text, state.schedule, state.regions).answer,
  ready: () => state.schedule !== null,
};
