// What every view of the page shares: the element helper, and the words for colours,
// seats, options and results (how a game ended: `words.js`, which the gateway writes from
// the table the command line words results with, schemas/wording.py).

import { NO_RESULT as NO_RESULT_LIST, REASONS, RULES } from "./words.js";

export { REASONS };
// Ends with no result: neither a win nor a draw (the server's NO_RESULT_REASONS).
export const NO_RESULT = new Set(NO_RESULT_LIST);

export const COLOUR_NAMES = { 1: "blue", 2: "orange" };

export function gameTitle(name) {
  return name
    .split("-")
    .map((w) => w[0].toUpperCase() + w.slice(1))
    .join(" ");
}

/** "hex-3-5 · adjacent", "size 6": a bare number says which option it is. */
export function optionsText(options) {
  return Object.entries(options || {})
    .map(([name, value]) => (/^\d+$/.test(value) ? `${name} ${value}` : value))
    .join(" · ");
}

export function seatName(seat, held) {
  const who = seat.kind === "bot" ? `${seat.name} (bot)` : seat.name || "anonymous";
  return held ? `${who} — you` : who;
}

function endingText(result) {
  if (result.reason === "natural") return RULES[result.detail] || result.detail || "";
  return REASONS[result.reason] ?? result.reason ?? "";
}

/** "Orange wins — a square", "Draw — move limit", "Aborted — aborted by the platform". */
export function resultText(result, seats) {
  if (!result) return "";
  const why = endingText(result);
  const tail = why ? ` — ${why}` : "";
  if (NO_RESULT.has(result.reason)) return `Aborted${result.detail ? ` — ${result.detail}` : tail}`;
  if (!result.winner) return `Draw${tail}`;
  const seat = seats.find((s) => s.seat === result.winner);
  return `${seat ? capital(COLOUR_NAMES[seat.colour]) : `Seat ${result.winner}`} wins${tail}`;
}

export function capital(text) {
  return text ? text[0].toUpperCase() + text.slice(1) : text;
}

const SVG = "http://www.w3.org/2000/svg";

/** An SVG element: attributes (null and undefined left out) and children. */
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== null && v !== undefined) el.setAttribute(k, v);
  }
  el.append(...children);
  return el;
}

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    // Through the CSSOM: the page's policy refuses style attributes (no 'unsafe-inline').
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  el.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}
