// Agon's move notation (RULES.md §9) as the page needs it: which cells a move touches,
// and the legal moves arranged for clicking. The server alone decides legality; the page
// only offers what the view's `legal_moves` lists.
//
//   C4      place a piece          xC4     remove a warehouse
//   C4-D5   step a marker          C4>NE   sow a stack toward a direction
//   pass    pass                   swap    swap sides (Hexade, second ply)

const CELL = "([A-Z]+[0-9]+)";
const FORMS = [
  ["remove", new RegExp(`^x${CELL}$`, "i")],
  ["step", new RegExp(`^${CELL}-${CELL}$`, "i")],
  ["sow", new RegExp(`^${CELL}>(N|NE|E|SE|S|SW|W|NW)$`, "i")],
  ["place", new RegExp(`^${CELL}$`, "i")],
];

// (drow, dcol) of each compass direction on a square board
export const DIRECTIONS = {
  N: [1, 0], NE: [1, 1], E: [0, 1], SE: [-1, 1],
  S: [-1, 0], SW: [-1, -1], W: [0, -1], NW: [1, -1],
};

export function parseMove(text) {
  const word = text.toLowerCase();
  if (word === "pass" || word === "swap") return { kind: word, text: word };
  for (const [kind, re] of FORMS) {
    const m = re.exec(text);
    if (!m) continue;
    if (kind === "step") return { kind, text, from: m[1].toUpperCase(), to: m[2].toUpperCase() };
    if (kind === "sow") return { kind, text, from: m[1].toUpperCase(), dir: m[2].toUpperCase() };
    return { kind, text, cell: m[1].toUpperCase() };
  }
  return { kind: "unknown", text };
}

/** The label of the cell one step from `label` in a compass direction, or null. */
export function neighbour(geometry, label, dir) {
  const cell = geometry.byLabel.get(label);
  const [dr, dc] = DIRECTIONS[dir] || [0, 0];
  return cell ? geometry.byRowCol.get(`${cell.row + dr},${cell.col + dc}`)?.label ?? null : null;
}

/** The cells a move touches: where a piece lands, leaves or is removed. */
export function cellsOf(move, geometry) {
  const m = parseMove(move);
  if (m.kind === "place" || m.kind === "remove") return [m.cell];
  if (m.kind === "step") return [m.from, m.to];
  if (m.kind === "sow") return [m.from, neighbour(geometry, m.from, m.dir)].filter(Boolean);
  return [];
}

/**
 * The legal moves arranged for clicking:
 * - `direct`: cell -> {move, kind}: one click plays it (a placement or a removal);
 * - `sources`: cell -> Map(target cell -> move): the first click of a step or a sowing,
 *   the second click picks the target (for a sowing, the neighbour in its direction);
 * - `words`: the moves that are buttons ("pass", "swap").
 */
export function clickPlan(legalMoves, geometry) {
  const direct = new Map();
  const sources = new Map();
  const words = [];
  for (const text of legalMoves) {
    const m = parseMove(text);
    if (m.kind === "place" || m.kind === "remove") {
      direct.set(m.cell, { move: text, kind: m.kind });
    } else if (m.kind === "step" || m.kind === "sow") {
      const to = m.kind === "step" ? m.to : neighbour(geometry, m.from, m.dir);
      if (!to) continue;
      if (!sources.has(m.from)) sources.set(m.from, new Map());
      sources.get(m.from).set(to, text);
    } else if (m.kind === "pass" || m.kind === "swap") {
      words.push(text);
    }
  }
  return { direct, sources, words };
}

/** A move as a sentence for the live region: "blue plays C4", "orange removes D5". */
export function describeMove(move) {
  const m = parseMove(move);
  switch (m.kind) {
    case "place":
      return `plays ${m.cell}`;
    case "remove":
      return `removes ${m.cell}`;
    case "step":
      return `moves ${m.from} to ${m.to}`;
    case "sow":
      return `sows ${m.from} toward ${m.dir}`;
    case "pass":
      return "passes";
    case "swap":
      return "swaps sides";
    default:
      return `plays ${move}`;
  }
}

/**
 * Why a click on `label` plays nothing when the seat may move: "occupied", the rule of the
 * game that forbids the cell where the view shows it (a removal comes first, a placement
 * would leave its chain in deficit, Supplier Sabotage's banned site, a marker with nowhere
 * to step), else "no legal move there". `plan` is `clickPlan` of the view's legal moves,
 * `selected` the first cell of a two-click move, `mover` the colour to move.
 */
export function whyNot(view, plan, label, selected, mover) {
  const cell = view.board.cells.find((c) => c.label === label);
  if (!cell) return "no legal move there";
  const deficit = view.board.deficit_warehouses || {};
  const removing = [...plan.direct.values()].some((d) => d.kind === "remove");
  if (removing) {
    const theirs = deficit[String(3 - mover)] || [];
    if ((deficit[String(mover)] || []).length && theirs.includes(label)) {
      return "remove your own deficit warehouses first";
    }
    return "a deficit warehouse must be removed first (the ones marked ✕)";
  }
  if (selected) return `${selected} cannot move there`;
  if ("height" in cell) return cell.height ? "no legal sowing from this stack" : "empty: choose a stack";
  if (plan.sources.size) {
    if (!cell.piece) return "choose one of your markers first";
    return cell.piece === mover ? "this marker has no empty square to step to" : "not your marker";
  }
  if (cell.piece) return "occupied";
  if (view.game === "supply-chains") return "would leave your chain in deficit";
  if (view.game === "supplier-sabotage") return "not where you last removed your own warehouse";
  return "no legal move there";
}
