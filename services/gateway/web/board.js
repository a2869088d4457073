// A board drawn as SVG from the engine's geometry (`GET /api/boards/{name}`), and kept up to
// date from a game view's `board`. Every cell is a <g data-cell="C4" data-piece="1"> with an
// aria-label; what the games show beside the pieces is drawn in it: Overflow's stack height
// (`data-height`; its discs are nobody's, so `data-piece` holds the height) and the two
// houses shaded, and for Supply Chains and Supplier Sabotage the surplus number on each
// piece (`<text data-surplus>`), warehouses grey and deficit warehouses light red
// (`data-warehouse="yes"|"deficit"`). Each cell has an inner ring for what the player
// should see at once: the last move, the selected piece, keyboard focus; the cells of the
// shape that won the game (the view's `winning`) are `.win`.

import { COLOUR_NAMES, svg } from "./ui.js";

// How big pieces and numbers are, in drawing units: unit squares, hexagons of radius 1,
// unit triangles.
const SCALE = { square: 1, hex: 1.6, tri: 0.55 };

/** The geometry with lookups by label and by (row, col). */
export function prepare(geometry) {
  const byLabel = new Map(geometry.cells.map((c) => [c.label, c]));
  const byRowCol = new Map(geometry.cells.map((c) => [`${c.row},${c.col}`, c]));
  return { ...geometry, byLabel, byRowCol };
}

function shrink(points, cx, cy, f) {
  return points
    .split(" ")
    .map((p) => {
      const [x, y] = p.split(",").map(Number);
      return `${(cx + (x - cx) * f).toFixed(4)},${(cy + (y - cy) * f).toFixed(4)}`;
    })
    .join(" ");
}

export class BoardView {
  /** `onCell(label)` is called when a cell is clicked or activated from the keyboard. */
  constructor(geometry, onCell) {
    this.geometry = geometry;
    this.s = SCALE[geometry.kind] || 1;
    const [x, y, w, hgt] = geometry.view_box;
    this.el = svg("svg", {
      viewBox: `${x} ${y} ${w} ${hgt}`,
      class: `board board-${geometry.kind}`,
      role: "group",
      "aria-label": `Board ${geometry.name}, ${geometry.cells.length} cells`,
    });
    const coords = svg("g", { class: "coords", "aria-hidden": "true" });
    for (const c of geometry.coordinates) {
      const t = svg("text", { x: c.x, y: c.y, "font-size": 0.34 * Math.min(this.s, 1.3) });
      t.textContent = c.text;
      coords.append(t);
    }
    const cells = svg("g", { class: "cells" });
    this.cells = new Map();
    for (const c of geometry.cells) {
      const g = svg("g", { class: "cell", "data-cell": c.label, "data-phase": c.phase });
      const shape = svg("polygon", { class: "shape", points: c.points });
      const ring = svg("polygon", { class: "ring", points: shrink(c.points, c.x, c.y, 0.8) });
      const content = svg("g", { class: "content" });
      g.append(shape, ring, content);
      cells.append(g);
      this.cells.set(c.label, { cell: c, g, content, key: "" });
    }
    this.el.append(coords, cells);
    this.el.addEventListener("click", (e) => {
      const g = e.target.closest?.("[data-cell]");
      if (g) onCell(g.dataset.cell);
    });
    this.el.addEventListener("keydown", (e) => {
      const g = e.target.closest?.("[data-cell]");
      if (g && (e.key === "Enter" || e.key === " ")) {
        e.preventDefault();
        onCell(g.dataset.cell);
      }
    });
  }

  /**
   * Draw a view's board. `marks`: cell -> "place" | "remove" | "source" | "selected" |
   * "dest" (what a click does there), `last`: the cells of the last move, `mover`: the
   * colour a placement would be, `winning`: the cells of the shape that won.
   */
  update(board, { marks = new Map(), last = new Set(), mover = 0, winning = new Set() } = {}) {
    const warehouses = new Set();
    for (const chain of board.chains || []) for (const w of chain.warehouses) warehouses.add(w);
    const deficit = new Set(Object.values(board.deficit_warehouses || {}).flat());
    for (const cell of board.cells) {
      const entry = this.cells.get(cell.label);
      if (!entry) continue;
      const mark = marks.get(cell.label) || "";
      let warehouse = warehouses.has(cell.label) ? "yes" : "";
      if (deficit.has(cell.label)) warehouse = "deficit";
      const isLast = last.has(cell.label);
      const won = winning.has(cell.label);
      const key = JSON.stringify([cell, mark, warehouse, isLast, mover, won]);
      if (key === entry.key) continue; // unchanged: keep the element (and its focus) as it is
      entry.key = key;
      this.drawCell(entry, cell, mark, warehouse, isLast, mover, won);
    }
  }

  drawCell(entry, cell, mark, warehouse, isLast, mover, won) {
    const { g, content } = entry;
    const at = entry.cell; // where: the geometry; `cell`: what the view has there
    const s = this.s;
    const r = 0.36 * s; // a piece's radius
    const overflow = "height" in cell;
    const contents = overflow ? cell.height || "" : cell.piece || "";
    g.dataset.piece = String(contents);
    setData(g, "height", overflow ? String(cell.height) : null);
    setData(g, "house", overflow ? String(cell.house) : null);
    setData(g, "warehouse", warehouse || null);
    setData(g, "mark", mark || null);
    g.classList.toggle("last", isLast);
    g.classList.toggle("win", won);
    content.replaceChildren();
    if (overflow && cell.height) {
      // a stack: up to two discs peeking out below the top one, and its height on top
      for (let i = Math.min(cell.height, 3) - 1; i > 0; i--) {
        const d = 0.06 * s * i;
        content.append(svg("circle", { class: "disc under", cx: at.x + d, cy: at.y + d, r }));
      }
      content.append(svg("circle", { class: "disc", cx: at.x, cy: at.y, r }));
      const attrs = { "data-height": cell.height };
      content.append(text(at, String(cell.height), "height", 0.42 * s, attrs));
    } else if (cell.piece) {
      content.append(svg("circle", { class: `piece c${cell.piece}`, cx: at.x, cy: at.y, r }));
      if (cell.surplus !== undefined && cell.surplus !== null) {
        const attrs = { "data-surplus": cell.surplus };
        content.append(text(at, String(cell.surplus), `surplus c${cell.piece}`, 0.42 * s, attrs));
      }
    }
    if (mark) content.append(markFor(at, mark, s, mover));
    g.setAttribute("role", mark ? "button" : "img");
    if (mark) g.setAttribute("tabindex", "0");
    else g.removeAttribute("tabindex");
    g.setAttribute("aria-label", describeCell(cell, warehouse, mark, isLast, won));
  }

  /** Move keyboard focus to a cell (after the first click of a two-click move). */
  focus(label) {
    this.cells.get(label)?.g.focus();
  }
}

function setData(el, name, value) {
  if (value === null || value === undefined) delete el.dataset[name];
  else el.dataset[name] = value;
}

function text(at, words, cls, size, attrs) {
  const t = svg("text", { class: cls, x: at.x, y: at.y, "font-size": size, ...attrs });
  t.textContent = words;
  return t;
}

function markFor(cell, mark, s, mover) {
  const { x, y } = cell;
  if (mark === "place" || mark === "dest") {
    const cls = mark === "place" ? `mark place c${mover}` : "mark dest";
    return svg("circle", { class: cls, cx: x, cy: y, r: 0.15 * s });
  }
  if (mark === "remove") {
    // a ring round the warehouse, and a small cross beside it: the number stays readable
    const g = svg("g", { class: "mark remove" });
    g.append(svg("circle", { class: "ring", cx: x, cy: y, r: 0.44 * s }));
    const bx = x + 0.34 * s;
    const by = y - 0.34 * s;
    const d = 0.07 * s;
    g.append(svg("circle", { class: "badge", cx: bx, cy: by, r: 0.15 * s }));
    const cross = `M${bx - d},${by - d}L${bx + d},${by + d}M${bx + d},${by - d}L${bx - d},${by + d}`;
    g.append(svg("path", { class: "cross", d: cross, "stroke-width": 0.045 * s }));
    return g;
  }
  return svg("circle", { class: `mark ${mark}`, cx: x, cy: y, r: 0.44 * s }); // source, selected
}

const ACTIONS = {
  place: "place here",
  remove: "remove this warehouse",
  source: "move from here",
  selected: "selected, choose where to move",
  dest: "move here",
};

/** "C4, empty", "C4, blue warehouse, surplus 2", "C4, stack of 3, orange house". */
export function describeCell(cell, warehouse, mark, isLast, won = false) {
  const parts = [cell.label];
  if ("height" in cell) {
    parts.push(cell.height ? `stack of ${cell.height}` : "empty");
    parts.push(`${COLOUR_NAMES[cell.house]} house`);
  } else if (cell.piece) {
    const kind = warehouse === "deficit" ? " deficit warehouse" : warehouse ? " warehouse" : "";
    parts.push(`${COLOUR_NAMES[cell.piece]}${kind}`);
    if (cell.surplus !== undefined && cell.surplus !== null) parts.push(`surplus ${cell.surplus}`);
  } else {
    parts.push("empty");
  }
  if (isLast) parts.push("last move");
  if (won) parts.push("winning shape");
  if (mark) parts.push(ACTIONS[mark]);
  return parts.join(", ");
}
