// What every view of the page shares: the element helper, and the words for colours,
// seats, options and results.

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
  const who = seat.kind === "bot" ? `${seat.name} (bot)` : seat.name || `player ${seat.seat}`;
  return held ? `${who} — you` : who;
}

// Why a game ended: the end reason of the log, and for a natural end the engine's rule.
const ENDINGS = {
  resignation: "by resignation",
  time_forfeit: "on time",
  abort: "aborted",
  "no-moves": "no placement left",
  "all-passed": "both passed",
  "house-emptied": "a house emptied",
  line: "a line",
  square: "a square",
  ring: "a ring of six",
  triangle: "a triangle",
  "move-limit": "move limit",
};

function endingText(result) {
  const rule = result.reason === "natural" ? result.detail : result.reason;
  return ENDINGS[rule] || rule || "";
}

/** "Orange wins — a square", "Draw — move limit". */
export function resultText(result, seats) {
  if (!result) return "";
  const why = endingText(result);
  const tail = why ? ` — ${why}` : "";
  if (result.reason === "abort") return `Aborted${result.detail ? ` — ${result.detail}` : ""}`;
  if (!result.winner) return `Draw${tail}`;
  const seat = seats.find((s) => s.seat === result.winner);
  return `${seat ? capital(COLOUR_NAMES[seat.colour]) : `Seat ${result.winner}`} wins${tail}`;
}

export function capital(text) {
  return text ? text[0].toUpperCase() + text.slice(1) : text;
}

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  el.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}
