// A game's page: the board, the players, the moves, play for the seats this browser holds
// a token for, live updates and replay.
//
// The game's log is the source of truth here as everywhere: the page reads it once
// (`GET /api/games/{id}/events`), then follows it over the WebSocket from the last seq it
// has, and after a dropped connection asks again from that seq, so every move is in the
// list once and in order. Events are applied strictly in seq order; one that arrives early
// waits for the gap to be read from the log. The board of the newest position is the
// server's view (`GET /api/games/{id}`, fetched again after events); the page runs no rules.
// The board at an earlier ply is the server's view at that ply, fetched once and kept, a page
// of plies per request (`/plies`, folded in one pass): a finished game's plies are all fetched
// in the background, so stepping through it needs no round trip.

import { api, ApiError, boardGeometry, tokens } from "./api.js";
import {
  capital,
  COLOUR_NAMES,
  gameTitle,
  h,
  optionsText,
  resultText,
  seatName,
  svg,
} from "./ui.js";
import { BoardView, prepare } from "./board.js";
import { cellsOf, clickPlan, describeMove, whyNot } from "./notation.js";

const PREFETCH_AT_ONCE = 4;
// Views per request (the server's `PLIES_PER_PAGE`).
const PLY_PAGE = 50;
// Games longer than this prefetch only the plies within PREFETCH_AROUND of the one shown.
const PREFETCH_ALL = 600;
const PREFETCH_AROUND = 150;
const RECONNECT_MIN_MS = 250;
const RECONNECT_MAX_MS = 5000;
const LIVE_STATES = { open: "live", connecting: "connecting…", closed: "reconnecting…" };

export function showGame(main, id, ply, announce) {
  const page = new GamePage(main, id, ply, announce);
  page.open();
  return () => page.close();
}

class GamePage {
  constructor(main, id, ply, announce) {
    this.main = main;
    this.id = id;
    this.wantedPly = ply;
    this.announce = announce;
    this.closed = false;
    this.seq = 0; // the last event of the log applied
    this.moves = []; // per ply: {ply, seat, colour, move}
    this.early = new Map(); // seq -> event that arrived before the ones before it
    this.head = null; // the server's view of the newest position
    this.views = new Map(); // ply -> the server's view at that ply
    this.loading = new Map(); // ply -> its view on the way
    this.shown = null; // the ply shown; null: the newest, live
    this.selected = null; // the first cell of a two-click move
    this.sending = false;
    this.played = 0; // the seq of this page's last move
    this.connects = 0;
    this.timers = new Set();
    this.onKey = (e) => this.key(e);
  }

  // -- opening and closing --------------------------------------------------------------
  async open() {
    this.main.replaceChildren(h("p", { class: "loading" }, "Loading the game…"));
    let log;
    try {
      [this.head, log] = await Promise.all([
        api(`/api/games/${this.id}`),
        api(`/api/games/${this.id}/events`),
      ]);
      const name = this.head.board.name;
      this.geometry = name ? prepare(await boardGeometry(name)) : null;
    } catch (err) {
      if (this.closed) return;
      const missing = err instanceof ApiError && err.status === 404;
      this.main.replaceChildren(
        h("section", { class: "card notice" },
          h("h1", {}, missing ? "No such game" : "The game could not be loaded"),
          h("p", {}, missing ? `There is no game ${this.id}.` : err.message),
          h("p", {}, h("a", { href: "/", "data-link": true }, "Back to the lobby"))),
      );
      return;
    }
    if (this.closed) return;
    for (const ev of log) this.apply(ev, false);
    this.keepView(this.head);
    this.build();
    this.startAt(this.wantedPly);
    document.addEventListener("keydown", this.onKey);
    this.render();
    this.connect();
    if (this.head.status === "ended" || this.shown !== null) this.prefetch();
    this.every(250, () => this.tick());
  }

  /** The ply the address asks for (a number, or the text of a malformed one): shown if the
   * game has it; otherwise the last, with a note, and the address corrected. */
  startAt(wanted) {
    if (wanted === null) return;
    const total = this.total;
    if (typeof wanted === "number" && wanted < total) {
      this.shown = wanted;
      return;
    }
    if (wanted === total) return;
    const what = typeof wanted === "number"
      ? `There is no move ${wanted}`
      : `“${wanted.slice(0, 12)}${wanted.length > 12 ? "…" : ""}” is not a move number`;
    this.note(`${what}: showing the last position (move ${total}).`);
    const url = new URL(location.href);
    // A finished game's last ply is a place to come back to; a live game's is the newest.
    if (this.head.status === "ended") url.searchParams.set("ply", String(total));
    else url.searchParams.delete("ply");
    history.replaceState(history.state, "", url);
  }

  close() {
    this.closed = true;
    document.removeEventListener("keydown", this.onKey);
    for (const t of this.timers) clearTimeout(t); // one pool of ids for timeouts and intervals
    if (this.ws) this.ws.close();
  }

  every(ms, fn) {
    this.timers.add(setInterval(fn, ms));
  }

  later(ms, fn) {
    const t = setTimeout(() => {
      this.timers.delete(t);
      if (!this.closed) fn();
    }, ms);
    this.timers.add(t);
  }

  // -- the log ------------------------------------------------------------------------------
  /** Apply one event of the log; in seq order, each once. */
  apply(ev, live = true) {
    if (ev.seq <= this.seq) return;
    if (ev.seq > this.seq + 1) {
      this.early.set(ev.seq, ev);
      this.readLog();
      return;
    }
    this.seq = ev.seq;
    if (ev.type === "move_played") {
      const move = { ply: ev.ply, seat: ev.seat, colour: ev.colour, move: ev.move };
      this.moves[ev.ply] = move;
      const said = `Move ${ev.ply + 1}: ${COLOUR_NAMES[ev.colour]} ${describeMove(ev.move)}`;
      if (live) this.announce(said);
    }
    const next = this.early.get(this.seq + 1);
    if (next) {
      this.early.delete(next.seq);
      this.apply(next, live);
    }
  }

  /** Read the log from the last seq applied: after a snapshot, or to fill a gap. */
  async readLog() {
    if (this.reading) return;
    this.reading = true;
    try {
      const events = await api(`/api/games/${this.id}/events?since=${this.seq}`);
      for (const ev of events) this.apply(ev);
      this.changed();
    } catch {
      this.later(1000, () => this.readLog());
    } finally {
      this.reading = false;
    }
  }

  // -- the socket ---------------------------------------------------------------------------
  connect() {
    if (this.closed) return;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}/ws/games/${this.id}?since=${this.seq}`;
    const ws = new WebSocket(url);
    this.ws = ws;
    this.liveState("connecting");
    ws.onopen = () => {
      this.connects += 1;
      this.backoff = RECONNECT_MIN_MS;
      this.liveState("open");
      this.refresh(); // what happened while the socket was away shows at once
    };
    ws.onmessage = (e) => this.message(JSON.parse(e.data));
    ws.onclose = () => {
      if (this.ws !== ws || this.closed) return;
      this.liveState("closed");
      this.backoff = Math.min((this.backoff || RECONNECT_MIN_MS) * 2, RECONNECT_MAX_MS);
      this.later(this.backoff, () => this.connect());
    };
  }

  message(msg) {
    if (msg.type === "event") {
      this.apply(msg.event);
      this.changed();
    } else if (msg.type === "snapshot") {
      // Too far behind for the events: the view at `seq`; the log fills in the moves.
      this.takeHead(msg.view);
      this.readLog();
    }
  }

  liveState(state) {
    if (!this.liveEl) return;
    this.liveEl.dataset.state = state;
    this.liveEl.dataset.connects = String(this.connects);
    this.liveEl.textContent = LIVE_STATES[state];
  }

  // -- views ----------------------------------------------------------------------------------
  keepView(view) {
    this.views.set(view.ply, view);
  }

  takeHead(view) {
    if (!this.head || view.seq >= this.head.seq) {
      const ended = view.status === "ended" && this.head?.status !== "ended";
      if (this.head && view.ply !== this.head.ply && this.noteEl?.dataset.kind === "why") {
        this.note(""); // a refusal's reason is of the position it was clicked in
      }
      this.head = view;
      this.keepView(view);
      if (ended) {
        this.announce(resultText(view.result, view.seats));
        this.prefetch();
      }
    }
  }

  /** Something new in the log: show it, and fetch the newest view (one fetch at a time). */
  changed() {
    this.render();
    this.refresh();
  }

  async refresh() {
    if (this.fetching) {
      this.again = true;
      return;
    }
    this.fetching = true;
    try {
      for (let tries = 0; tries < 5 && !this.closed; tries++) {
        this.again = false;
        this.takeHead(await api(`/api/games/${this.id}`));
        if (!this.again && this.head.seq >= this.seq) break;
      }
      this.render();
    } catch {
      this.later(1000, () => this.refresh());
    } finally {
      this.fetching = false;
    }
  }

  /** The view at a ply: kept, or fetched once with its page of plies (and kept). */
  viewAt(ply) {
    const kept = this.views.get(ply);
    if (kept) return Promise.resolve(kept);
    const first = ply - (ply % PLY_PAGE);
    if (!this.loading.has(first)) {
      const load = this.fetchViews(first).finally(() => this.loading.delete(first));
      this.loading.set(first, load);
    }
    return this.loading.get(first).then(() => {
      const view = this.views.get(ply);
      if (!view) throw new Error(`no view of ply ${ply}`);
      return view;
    });
  }

  /** The views of plies `first` to `first + PLY_PAGE - 1`, folded by the server in one pass. */
  async fetchViews(first) {
    const last = first + PLY_PAGE - 1;
    for (;;) {
      try {
        const page = await api(`/api/games/${this.id}/plies?from_ply=${first}&to_ply=${last}`);
        for (const view of page.views) this.keepView(view);
        return;
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 429) || this.closed) throw err;
        await new Promise((r) => setTimeout(r, 1000)); // rate limited: wait and ask again
      }
    }
  }

  /** Fetch the views of the plies around the one shown (of every ply, unless the game is
   * very long), nearest first, a few at a time. */
  async prefetch() {
    if (this.prefetching) {
      this.prefetchAgain = true;
      return;
    }
    this.prefetching = true;
    do {
      this.prefetchAgain = false;
      const around = this.shown ?? this.moves.length;
      const reach = this.moves.length > PREFETCH_ALL ? PREFETCH_AROUND : Infinity;
      const missing = [...Array(this.moves.length + 1).keys()]
        .filter((p) => !this.views.has(p) && Math.abs(p - around) <= reach)
        .sort((a, b) => Math.abs(a - around) - Math.abs(b - around));
      const worker = async () => {
        while (missing.length && !this.closed) {
          await this.viewAt(missing.shift()).catch(() => {});
        }
      };
      await Promise.all(Array.from({ length: PREFETCH_AT_ONCE }, worker));
    } while (this.prefetchAgain && !this.closed);
    this.prefetching = false;
    if (this.replayEl) this.replayEl.dataset.cached = String(this.views.size);
  }

  // -- the page -----------------------------------------------------------------------------
  build() {
    const head = this.head;
    document.title = `${gameTitle(head.game)} · Agon`;
    this.board = this.geometry ? new BoardView(this.geometry, (cell) => this.click(cell)) : null;
    this.liveEl = h("span", { class: "live", id: "live", "data-state": "connecting" });
    this.slider = h("input", {
      type: "range", id: "ply", min: "0", max: "0", value: "0", step: "1",
      "aria-label": "Position after move", oninput: () => this.go(Number(this.slider.value)),
    });
    this.plyText = h("span", { class: "ply-text", id: "ply-text" });
    this.liveButton = button("to-live", "link", "Back to live", () => this.go(null));
    const group = { class: "replay", id: "replay", role: "group", "aria-label": "Replay" };
    this.replayEl = h("div", group,
      iconButton("first", "M3 3h2v10H3zM13 3 6 8l7 5z", "First position (Home)", () => this.go(0)),
      iconButton("prev", "M11 3 4 8l7 5z", "Previous move (←)", () => this.step(-1)),
      this.slider,
      iconButton("next", "M5 3l7 5-7 5z", "Next move (→)", () => this.step(1)),
      iconButton("last", "M3 3l7 5-7 5zM11 3h2v10h-2z", "Last position (End)", () => this.go(null)),
    );
    this.statusEl = h("p", { class: "status", id: "status" });
    this.playersEl = h("div", { class: "players", id: "players" });
    // The buttons stay in place (shown or hidden), so keyboard focus stays on them.
    this.buttons = {
      pass: button("pass", "", "Pass", () => this.send("pass")),
      swap: button("swap", "", "Swap sides", () => this.send("swap")),
      resign: button("resign", "danger", "Resign", () => this.resign()),
      cancel: button("cancel", "link", "Cancel (Esc)", () => this.unselect()),
    };
    this.actionsEl = h("div", { class: "actions", id: "actions" }, ...Object.values(this.buttons));
    this.messageEl = h("p", { class: "message", id: "message", role: "alert" });
    // Why a click did nothing, or what became of the address's ?ply=: near the board.
    this.noteEl = h("p", { class: "board-note", id: "board-note", role: "status" });
    this.movesEl = h("ol", { class: "moves", id: "moves", "aria-label": "Moves" });
    const board = this.board ? this.board.el : h("p", {}, head.error || "No board");
    this.section = h("section", { class: "game", "data-game": head.game, "data-id": this.id },
      h("div", { class: "board-col" },
        h("header", { class: "game-head" },
          h("h1", {}, gameTitle(head.game)),
          h("span", { class: "opts" }, optionsText(head.options)),
          this.liveEl),
        h("div", { class: "board-wrap" }, board),
        this.noteEl,
        h("div", { class: "replay-row" }, this.replayEl, this.plyText, this.liveButton)),
      h("aside", { class: "side" },
        this.statusEl,
        this.playersEl,
        this.actionsEl,
        this.messageEl,
        h("h2", { class: "moves-title" }, "Moves"),
        this.movesEl));
    this.main.replaceChildren(this.section);
    this.movesEl.addEventListener("click", (e) => {
      const b = e.target.closest("button[data-ply]");
      if (b) this.go(Number(b.dataset.ply));
    });
  }

  /** The moves the page lists: those of the log, but never beyond the newest view's ply
   * (the board shows that view; its move list must not run ahead of it). */
  get total() {
    return Math.min(this.moves.length, this.head.ply);
  }

  /** The ply shown, as a number. */
  get plyShown() {
    return this.shown ?? this.total;
  }

  /** The view to draw: the newest, or the one at the shown ply (null while it loads). */
  get view() {
    if (this.shown === null) return this.head;
    return this.views.get(this.shown) || null;
  }

  render() {
    if (!this.movesEl) return;
    const total = this.total;
    const ply = this.plyShown;
    this.slider.max = String(total);
    this.slider.value = String(ply);
    const where = ply ? `after move ${ply} of ${total}` : `start, ${total} moves`;
    this.slider.setAttribute("aria-valuetext", where);
    this.plyText.textContent = `${ply} / ${total}`;
    this.liveButton.hidden = this.shown === null || this.head.status === "ended";
    this.liveEl.hidden = this.shown !== null || this.head.status === "ended";
    this.renderMoves(total, ply);
    const view = this.view;
    const wrap = this.section.querySelector(".board-wrap");
    wrap.classList.toggle("loading", !view);
    if (!view) {
      this.viewAt(this.shown).then(() => this.render(), () => {});
      return;
    }
    this.section.dataset.seq = String(view.seq);
    this.section.dataset.ply = String(view.ply);
    this.section.dataset.status = view.status;
    const live = this.shown === null;
    const plan = this.canPlay() ? clickPlan(view.legal_moves, this.geometry) : null;
    if (this.selected && !plan?.sources.has(this.selected)) this.selected = null;
    this.plan = plan;
    if (this.board) {
      const last = new Set(view.last_move ? cellsOf(view.last_move.move, this.geometry) : []);
      const mover = this.moverColour(view);
      const winning = new Set(view.board.winning || []);
      this.board.update(view.board, { marks: this.marks(plan), last, mover, winning });
    }
    this.renderStatus(view, live);
    this.renderPlayers(view, live);
    this.renderActions(plan);
  }

  marks(plan) {
    const marks = new Map();
    if (!plan) return marks;
    for (const [cell, { kind }] of plan.direct) marks.set(cell, kind);
    for (const cell of plan.sources.keys()) marks.set(cell, "source");
    if (this.selected) {
      marks.set(this.selected, "selected");
      for (const target of plan.sources.get(this.selected).keys()) marks.set(target, "dest");
    }
    return marks;
  }

  moverColour(view) {
    const seat = view.seats.find((s) => s.seat === view.to_move);
    return seat ? seat.colour : 0;
  }

  held() {
    return tokens.of(this.id);
  }

  /** Whether a click may play: the newest position, this browser's seat to move. */
  canPlay() {
    const head = this.head;
    return (
      this.shown === null &&
      head.status === "playing" &&
      head.seq >= this.seq &&
      head.seq >= this.played &&
      !this.sending &&
      Boolean(this.held()[head.to_move])
    );
  }

  renderStatus(view, live) {
    const head = this.head;
    const mover = view.seats.find((s) => s.seat === view.to_move);
    const colour = mover ? capital(COLOUR_NAMES[mover.colour]) : "";
    let text = "";
    if (!live) {
      const who = mover ? `, ${colour.toLowerCase()} to move` : "";
      const total = this.total;
      text = (this.shown ? `After move ${this.shown} of ${total}` : "Start of the game") + who;
    } else if (head.status === "ended") {
      text = resultText(head.result, head.seats);
    } else if (head.status === "waiting") {
      text = "Waiting for players";
    } else if (mover) {
      const who = this.held()[mover.seat] ? "your turn" : seatName(mover, false);
      text = `${colour} to move — ${who}`;
    }
    this.statusEl.textContent = text;
    this.statusEl.dataset.status = live ? head.status : "replay";
  }

  renderPlayers(view, live) {
    const held = this.held();
    const hands = view.board.hands;
    const swapped = view.seats[0]?.colour === 2;
    const overflow = view.board.cells.some((c) => "house" in c);
    const playing = live ? this.head.status === "playing" : true;
    this.playersEl.replaceChildren(
      ...view.seats.map((seat) => {
        const c = seat.colour;
        const toMove = playing && view.to_move === seat.seat;
        const score = view.scores ? view.scores[c - 1] : null;
        const hand = hands ? hands[c - 1] : null;
        const facts = [capital(COLOUR_NAMES[c]), `seat ${seat.seat}`];
        if (swapped) facts.push("swapped");
        const house = overflow
          ? [" · house ", h("span", { class: `house c${c}`, "aria-label": "shaded squares" })]
          : null;
        const inHand = hand === null ? null : h("small", { class: "hand", "data-hand": hand },
          h("span", { class: `hand-dots c${c}`, "aria-hidden": "true" }, "●".repeat(hand)),
          ` ${hand} in hand`);
        const clock = toMove && live && view.deadline
          ? h("span", { class: "clock-box" },
            h("small", { class: "label" }, "time left"),
            h("span", { class: "clock", "data-deadline": view.deadline }))
          : null;
        return h("div", {
            class: toMove ? "player to-move" : "player", "data-seat": seat.seat, "data-colour": c,
            "aria-current": toMove ? "true" : null,
          },
          h("span", { class: `swatch c${c}`, "aria-hidden": "true" }),
          h("div", { class: "who" },
            h("strong", {}, seatName(seat, Boolean(held[seat.seat]))),
            h("small", {}, facts.join(" · "), house),
            inHand),
          score === null
            ? null
            : h("span", { class: "score", "data-score": score },
              h("small", { class: "label" }, "score"), String(score)),
          clock);
      }),
    );
    this.tick();
  }

  renderActions(plan) {
    const { pass, swap, resign, cancel } = this.buttons;
    const words = plan?.words || [];
    pass.hidden = !words.includes("pass");
    swap.hidden = !words.includes("swap");
    resign.hidden = !(this.head.status === "playing" && Object.keys(this.held()).length);
    resign.textContent = this.resignArmed ? "Confirm resignation" : "Resign";
    resign.classList.toggle("armed", Boolean(this.resignArmed));
    cancel.hidden = !this.selected;
  }

  renderMoves(count, ply) {
    const list = this.movesEl;
    if (list.children.length > count) list.replaceChildren();
    for (let i = list.children.length; i < count; i++) {
      const m = this.moves[i];
      list.append(h("li", {},
        h("button", { type: "button", "data-ply": i + 1, "data-move": m?.move ?? "" },
          h("span", { class: "num" }, `${i + 1}.`),
          h("span", { class: `dot c${m?.colour}`, "aria-hidden": "true" }),
          h("span", { class: "text" }, m?.move ?? "…"))));
    }
    const longest = Math.max(3, ...this.moves.slice(0, count).map((m) => m?.move.length || 0));
    list.style.setProperty("--move-chars", String(longest));
    for (const b of list.querySelectorAll("[aria-current]")) b.removeAttribute("aria-current");
    const current = list.children[ply - 1]?.firstChild;
    if (current) {
      current.setAttribute("aria-current", "step");
      if (this.shown !== null || this.lastScrolled !== ply) {
        scrollWithin(list, current);
        this.lastScrolled = ply;
      }
    }
  }

  tick() {
    for (const clock of this.playersEl?.querySelectorAll(".clock") || []) {
      const left = Math.max(0, Number(clock.dataset.deadline) - Date.now());
      const s = Math.ceil(left / 1000);
      clock.textContent = `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
      clock.classList.toggle("low", s <= 10);
    }
  }

  // -- replay ---------------------------------------------------------------------------------
  go(ply) {
    const total = this.total;
    const target = ply === null || ply >= total ? null : Math.max(0, ply);
    if (target === this.shown) return;
    this.note("");
    this.shown = target;
    this.selected = null;
    const url = new URL(location.href);
    if (target === null) url.searchParams.delete("ply");
    else url.searchParams.set("ply", String(target));
    history.replaceState(history.state, "", url);
    if (target !== null) this.prefetch();
    this.render();
  }

  step(delta) {
    this.go(Math.min(this.total, Math.max(0, this.plyShown + delta)));
  }

  key(e) {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    const t = e.target;
    // The slider steps itself with the same keys.
    if (t instanceof HTMLElement && t.closest("input, select, textarea")) return;
    if (e.key === "ArrowLeft") this.step(-1);
    else if (e.key === "ArrowRight") this.step(1);
    else if (e.key === "Home") this.go(0);
    else if (e.key === "End") this.go(null);
    else if (e.key === "Escape") return this.unselect();
    else return;
    e.preventDefault();
  }

  // -- play -----------------------------------------------------------------------------------
  click(label) {
    const plan = this.plan;
    if (plan && this.canPlay()) {
      if (this.selected) {
        const targets = plan.sources.get(this.selected);
        if (targets?.has(label)) return this.send(targets.get(label));
        if (label === this.selected) return this.unselect();
      }
      if (plan.direct.has(label)) return this.send(plan.direct.get(label).move);
      if (plan.sources.has(label)) {
        this.note("");
        this.selected = label;
        this.render();
        const first = plan.sources.get(label).keys().next().value;
        this.board.focus(first);
        this.announce(`${label} selected: choose where to move`);
        return;
      }
    }
    this.note(`${label}: ${this.whyNot(label)}`, "why");
  }

  /** Why a click on a cell plays nothing: whose turn it is, then the cell and the rules. */
  whyNot(label) {
    const head = this.head;
    if (this.shown !== null) return "an earlier position: go to the last one (End) to play";
    if (head.status === "ended") return "the game is over";
    if (head.status === "waiting") return "the game has not started: a seat is open";
    const held = this.held();
    if (!Object.keys(held).length) return "you are watching: you hold no seat here";
    if (!held[head.to_move]) {
      const mover = head.seats.find((s) => s.seat === head.to_move);
      return mover?.kind === "bot" ? `not your turn: ${mover.name} is thinking` : "not your turn";
    }
    if (!this.plan || !this.canPlay()) return "not your turn yet: your move is on its way";
    return whyNot(head, this.plan, label, this.selected, this.moverColour(head));
  }

  /** The line under the board: `kind` "why" (a click's refusal) or "ply" (the address). The
   * same words again are said again (a status region speaks only what changed). */
  note(text, kind = "ply") {
    const el = this.noteEl;
    if (!el) return;
    el.dataset.kind = kind;
    if (el.textContent === text && text) {
      el.textContent = "";
      this.later(60, () => { el.textContent = text; });
    } else {
      el.textContent = text;
    }
  }

  unselect() {
    if (!this.selected) return;
    const was = this.selected;
    this.selected = null;
    this.render();
    this.board.focus(was);
  }

  async send(move) {
    const head = this.head;
    const token = this.held()[head.to_move];
    if (!token) return;
    this.sending = true;
    this.selected = null;
    this.messageEl.textContent = "";
    this.note("");
    this.render();
    try {
      const body = { move, seq: head.seq, token };
      const accepted = await api(`/api/games/${this.id}/moves`, { method: "POST", body });
      this.played = accepted.seq; // until a view shows it, the targets on the board are stale
      this.messageEl.textContent = "";
    } catch (err) {
      this.refused(err);
    } finally {
      this.sending = false;
      this.refresh();
    }
  }

  async resign() {
    if (!this.resignArmed) {
      this.resignArmed = true;
      this.render();
      this.later(4000, () => {
        this.resignArmed = false;
        this.render();
      });
      return;
    }
    this.resignArmed = false;
    const held = this.held();
    const token = held[this.head.to_move] || Object.values(held)[0];
    try {
      await api(`/api/games/${this.id}/resign`, { method: "POST", body: { token } });
    } catch (err) {
      this.refused(err);
    }
    this.refresh();
  }

  refused(err) {
    const text = err instanceof ApiError ? `${err.message} (${err.code})` : String(err);
    this.messageEl.textContent = text;
    this.announce(`Refused: ${text}`);
  }
}

function button(id, cls, text, onclick) {
  return h("button", { type: "button", id, class: cls || null, onclick }, text);
}

function iconButton(id, path, label, onclick) {
  const el = svg("svg", { viewBox: "0 0 16 16", "aria-hidden": "true" }, svg("path", { d: path }));
  const attrs = { type: "button", id, class: "icon", "aria-label": label, title: label, onclick };
  return h("button", attrs, el);
}

/** Bring `item` into view inside the scrolling list `box`, never scrolling the page (on a
 * narrow window the list does not scroll itself, and the board must stay where it is). */
function scrollWithin(box, item) {
  const outer = box.getBoundingClientRect();
  const inner = item.getBoundingClientRect();
  if (inner.top < outer.top) box.scrollTop -= outer.top - inner.top;
  else if (inner.bottom > outer.bottom) box.scrollTop += inner.bottom - outer.bottom;
}
