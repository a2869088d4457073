// The gateway's API as the page uses it: JSON in and out, refusals as ApiError (the
// server's {code, message, seq}), the seat tokens this browser holds, and the few things
// worth fetching once per page (the catalogue of games and bots, board geometries).

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.code || `http_${status}`;
    this.seq = body?.seq ?? null;
  }
}

export async function api(path, { method = "GET", body } = {}) {
  const init = { method, headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

// -- seat tokens: {gameId: {seat: token}} in localStorage ---------------------------------
const TOKENS = "agon.tokens";

function readTokens() {
  try {
    return JSON.parse(localStorage.getItem(TOKENS) || "{}") || {};
  } catch {
    return {};
  }
}

export const tokens = {
  /** The seats this browser holds in a game: {seat: token}. */
  of(gameId) {
    return readTokens()[gameId] || {};
  },
  keep(gameId, seat, token) {
    const all = readTokens();
    all[gameId] = { ...(all[gameId] || {}), [seat]: token };
    localStorage.setItem(TOKENS, JSON.stringify(all));
  },
};

// -- fetched once per page ------------------------------------------------------------------
const once = new Map();

function memo(key, load) {
  if (!once.has(key)) {
    const promise = load();
    promise.catch(() => once.delete(key)); // a failure is not remembered
    once.set(key, promise);
  }
  return once.get(key);
}

export const catalogue = () => memo("catalogue", () => api("/api/catalogue"));
export const boardGeometry = (name) =>
  memo(`board:${name}`, () => api(`/api/boards/${encodeURIComponent(name)}`));
