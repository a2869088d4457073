// The lobby: the games (live and finished, refreshed every few seconds, filtered by game
// and status) and the form for a new game: every game and option of RULES.md §8 with its
// default first, each seat "you" or a bot, the time per move, and your name (kept in this
// browser): "your" seats are created under it and rated apart from the bots; without one
// they are anonymous and unrated. Creating a game keeps the tokens of "your" seats in
// this browser and opens the board.

import { api, catalogue, tokens } from "./api.js";
import {
  capital,
  COLOUR_NAMES,
  gameTitle,
  h,
  optionsText,
  resultText,
  seatName,
} from "./ui.js";

const REFRESH_MS = 3000;
const PAGE = 50;
const MAX_PAGE = 200;
const STATUSES = ["playing", "waiting", "ended"];
const NAME = "agon.name";
const NAME_MAX = 64; // the server's PlayerName

export function showLobby(main, navigate) {
  const lobby = new Lobby(main, navigate);
  lobby.open();
  return () => lobby.close();
}

class Lobby {
  constructor(main, navigate) {
    this.main = main;
    this.navigate = navigate;
    this.closed = false;
    this.limit = PAGE;
    this.asked = 0;
    this.drawn = "";
    const query = new URLSearchParams(location.search);
    this.filter = { game: query.get("game") || "", status: query.get("status") || "" };
  }

  async open() {
    document.title = "Agon — play, watch and replay";
    this.list = h("ul", { class: "game-list", id: "games", "aria-busy": "true" });
    this.more = h("button", {
      type: "button", class: "link", id: "more", hidden: true, onclick: () => this.showMore(),
    }, "Show more");
    const filtered = () => this.filtered();
    this.gameFilter = h("select", { id: "filter-game", onchange: filtered },
      h("option", { value: "" }, "All games"));
    this.statusFilter = h("select", { id: "filter-status", onchange: filtered },
      h("option", { value: "" }, "Any status"),
      ...STATUSES.map((s) =>
        h("option", { value: s, selected: s === this.filter.status }, capital(s))));
    this.form = h("form", { id: "new-game", class: "new-game", onsubmit: (e) => this.create(e) },
      h("p", { class: "loading" }, "Loading…"));
    this.main.replaceChildren(
      h("section", { class: "lobby" },
        h("div", { class: "card lobby-new" }, h("h1", {}, "New game"), this.form),
        h("div", { class: "card lobby-games" },
          h("div", { class: "games-head" },
            h("h1", {}, "Games"),
            h("div", { class: "filters" },
              h("label", {}, "Game ", this.gameFilter),
              h("label", {}, "Status ", this.statusFilter))),
          this.list,
          this.more)),
    );
    this.refresh();
    this.timer = setInterval(() => document.hidden || this.refresh(), REFRESH_MS);
    try {
      this.catalogue = await catalogue();
    } catch (err) {
      const why = `Cannot load the games: ${err.message}`;
      this.form.replaceChildren(h("p", { class: "message" }, why));
      return;
    }
    if (this.closed) return;
    for (const g of this.catalogue.games) {
      const selected = g.name === this.filter.game;
      this.gameFilter.append(h("option", { value: g.name, selected }, g.title));
    }
    this.buildForm();
  }

  close() {
    this.closed = true;
    clearInterval(this.timer);
  }

  // -- the list -------------------------------------------------------------------------------
  filtered() {
    this.filter = { game: this.gameFilter.value, status: this.statusFilter.value };
    this.limit = PAGE;
    const url = new URL(location.href);
    for (const [k, v] of Object.entries(this.filter)) {
      if (v) url.searchParams.set(k, v);
      else url.searchParams.delete(k);
    }
    history.replaceState(history.state, "", url);
    this.refresh();
  }

  showMore() {
    this.limit = Math.min(this.limit + PAGE, MAX_PAGE);
    this.refresh();
  }

  async refresh() {
    const query = new URLSearchParams({ limit: String(this.limit) });
    for (const [k, v] of Object.entries(this.filter)) if (v) query.set(k, v);
    const asked = ++this.asked;
    let page;
    try {
      page = await api(`/api/games?${query}`);
    } catch (err) {
      if (!this.list.children.length) {
        this.list.replaceChildren(h("li", { class: "empty" }, `Cannot list games: ${err.message}`));
      }
      return;
    } finally {
      this.list.setAttribute("aria-busy", "false");
    }
    if (this.closed || asked !== this.asked) return; // a newer question is on its way
    this.more.hidden = !page.cursor || this.limit >= MAX_PAGE;
    const drawn = JSON.stringify(page.games);
    if (drawn === this.drawn) return; // nothing new: keep the rows (and the focus on one)
    this.drawn = drawn;
    if (!page.games.length) {
      this.list.replaceChildren(h("li", { class: "empty" }, "No games yet: start one."));
      return;
    }
    const focused = document.activeElement?.closest?.("#games a[data-id]")?.dataset.id;
    this.list.replaceChildren(...page.games.map((g) => this.row(g)));
    if (focused) this.list.querySelector(`a[data-id="${CSS.escape(focused)}"]`)?.focus();
  }

  row(g) {
    const held = tokens.of(g.id);
    const seats = g.seats.map((s) =>
      h("span", { class: "seat" },
        h("span", { class: `dot c${s.colour}`, "aria-hidden": "true" }),
        seatName(s, Boolean(held[s.seat]))));
    const yours = Object.keys(held).length ? h("span", { class: "badge yours" }, "yours") : null;
    const moves = `${g.ply} ${g.ply === 1 ? "move" : "moves"}`;
    return h("li", {},
      h("a", { href: `/games/${g.id}`, "data-link": true, class: "game-row", "data-id": g.id },
        h("span", { class: "g-title" }, gameTitle(g.game), yours),
        h("span", { class: "g-opts" }, optionsText(g.options)),
        h("span", { class: "g-seats" }, ...seats),
        h("span", { class: "g-state" },
          h("span", { class: `badge ${g.status}` }, g.status),
          h("span", { class: "g-ply" }, moves),
          h("span", { class: "g-result" }, this.stateOf(g, held)))));
  }

  stateOf(g, held) {
    if (g.status === "ended") return resultText(g.result, g.seats);
    if (g.status === "waiting") return "Waiting for players";
    const mover = g.seats.find((s) => s.seat === g.to_move);
    if (!mover) return "";
    return held[mover.seat] ? "Your turn" : `${capital(COLOUR_NAMES[mover.colour])} to move`;
  }

  // -- the form -------------------------------------------------------------------------------
  buildForm() {
    const games = this.catalogue.games;
    const chosen = games.find((g) => g.name === this.filter.game)
      || games.find((g) => g.name === "supply-chains")
      || games[0];
    this.gameSelect = h("select", {
        name: "game", id: "new-game-game", onchange: () => this.showOptions(),
      },
      ...games.map((g) => h("option", { value: g.name, selected: g === chosen }, g.title)));
    this.optionsEl = h("div", { class: "options", id: "new-game-options" });
    this.moveTime = h("input", {
      type: "number", name: "move_time", id: "move-time", min: "1", max: "86400", step: "1",
      placeholder: "no clock", inputmode: "numeric",
    });
    this.message = h("p", { class: "message", role: "alert" });
    this.nameInput = h("input", {
      type: "text", name: "name", id: "your-name", maxlength: String(NAME_MAX),
      autocomplete: "nickname", placeholder: "anonymous", value: storedName(),
      "aria-describedby": "your-name-hint",
    });
    this.form.replaceChildren(
      h("label", {}, "Your name", this.nameInput),
      h("p", { class: "hint", id: "your-name-hint" },
        "Your seats play under it and are rated; without a name they are anonymous and unrated."),
      h("label", {}, "Game", this.gameSelect),
      this.optionsEl,
      h("fieldset", { class: "seats" }, h("legend", {}, "Seats"), this.seat(1), this.seat(2)),
      h("label", {}, "Seconds per move", this.moveTime),
      h("button", { type: "submit", class: "primary", id: "start" }, "Start game"),
      this.message,
    );
    this.showOptions();
  }

  /** A seat's choice: "you", or any bot (the random bot by default for the second seat). */
  seat(n) {
    const bots = this.catalogue.bots.map((b) => {
      const kind = b.kind === "built-in" ? "bot" : "registered bot";
      const selected = n === 2 && b.name === "random";
      return h("option", { value: b.name, selected }, `${b.name} (${kind})`);
    });
    const select = h("select", { name: `seat${n}`, id: `seat${n}` },
      h("option", { value: "" }, "You"), ...bots);
    const title = `${capital(COLOUR_NAMES[n])}${n === 1 ? " (moves first)" : ""}`;
    return h("label", {},
      h("span", {}, h("span", { class: `dot c${n}`, "aria-hidden": "true" }), title),
      select);
  }

  showOptions() {
    const game = this.catalogue.games.find((g) => g.name === this.gameSelect.value);
    const options = Object.entries(game.options);
    this.optionsEl.replaceChildren(
      ...options.map(([name, values]) =>
        h("label", {}, capital(name),
          h("select", { "data-option": name, id: `option-${name}` },
            ...values.map((v, i) => h("option", { value: v }, i ? v : `${v} (default)`))))),
    );
    if (!options.length) {
      this.optionsEl.append(h("p", { class: "hint" }, `${game.title} has no options.`));
    }
  }

  async create(e) {
    e.preventDefault();
    const options = {};
    for (const select of this.optionsEl.querySelectorAll("select[data-option]")) {
      options[select.dataset.option] = select.value;
    }
    const name = this.nameInput.value.trim();
    // The server refuses a bot's name too (in any case, reserved ones besides): said at once.
    const bot = this.catalogue.bots.find((b) => b.name.toLowerCase() === name.toLowerCase());
    if (bot) {
      this.message.textContent = `${bot.name} is a bot's name; a person plays under another`;
      this.nameInput.focus();
      return;
    }
    localStorage.setItem(NAME, name);
    const seats = [1, 2].map((n) => {
      const bot = this.form.elements[`seat${n}`].value;
      return bot ? { bot } : { human: name ? { name } : {} };
    });
    const body = { game: this.gameSelect.value, options, seats };
    if (this.moveTime.value) body.move_time = Number(this.moveTime.value);
    const start = this.form.querySelector("button[type=submit]");
    start.disabled = true;
    this.message.textContent = "";
    try {
      const created = await api("/api/games", { method: "POST", body });
      created.tokens.forEach((token, i) => token && tokens.keep(created.id, i + 1, token));
      this.navigate(`/games/${created.id}`);
    } catch (err) {
      this.message.textContent = `${err.message} (${err.code})`;
      start.disabled = false;
    }
  }
}

/** The name this browser plays under ("" anonymous). */
function storedName() {
  try {
    return localStorage.getItem(NAME) || "";
  } catch {
    return "";
  }
}
