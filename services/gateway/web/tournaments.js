// Tournaments, matches and leaderboards, read-only: the list (`/tournaments`, refreshed
// every few seconds), one tournament (`/tournaments/{id}`: progress, standings, crosstable,
// pairs with Elo and LOS, the bots' health, Glicko-2 ratings, every game with a link to its
// replay, and for a match the SPRT's LLR after each pair; refreshed while it runs) and the
// leaderboards of a game (`/leaderboards?game=NAME`). The server computes every number;
// the page only lays them out.

import { api, ApiError, catalogue } from "./api.js";
import { gameTitle, h, NO_RESULT, optionsText, REASONS, svg } from "./ui.js";

const LIST_REFRESH_MS = 3000;
const REFRESH_MS = 2000;
const BOARD_REFRESH_MS = 5000;
const FORMATS = {
  "round-robin": "Round robin",
  swiss: "Swiss",
  gauntlet: "Gauntlet",
  match: "Match",
};
// Why a tournament ended (TournamentEnded's reason).
const ENDINGS = {
  completed: "completed",
  cancelled: "cancelled",
  "no-pairing": "no pairing left",
  h0: "H0 accepted",
  h1: "H1 accepted",
  "max-pairs": "pair limit reached",
};
export function showTournaments(main) {
  const view = new TournamentList(main);
  view.open();
  return () => view.close();
}

export function showTournament(main, id, announce) {
  const view = new TournamentPage(main, id, announce);
  view.open();
  return () => view.close();
}

export function showLeaderboards(main) {
  const view = new Leaderboards(main);
  view.open();
  return () => view.close();
}

// -- shared pieces ------------------------------------------------------------------------------
function formatName(format) {
  return FORMATS[format] || format;
}

function endingText(reason) {
  return ENDINGS[reason] || reason || "";
}

function points(p) {
  return Number.isInteger(p) ? String(p) : p.toFixed(1);
}

function wld(c) {
  return `${c.wins}-${c.losses}-${c.draws}`;
}

/** "+12", "−3.50", "0": a difference with its sign (a true minus sign). */
function signed(n, digits = 0) {
  const text = Math.abs(n).toFixed(digits);
  if (Number(text) === 0) return text;
  return `${n < 0 ? "−" : "+"}${text}`;
}

function moveTime(ms) {
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  return `${Number.isInteger(s) ? s : s.toFixed(1)} s`;
}

let tables = 0;

/**
 * A table in a scrolling box of its own (a phone scrolls the table, not the page): when
 * there is something to scroll, the box is a region named by the caption and takes the
 * keyboard focus, so that it scrolls with the arrow keys.
 */
function table(id, caption, head, rows, { cls = "", empty = "Nothing yet." } = {}) {
  const capId = `cap-${id || ++tables}`;
  const body = rows.length
    ? rows
    : [h("tr", { class: "empty" }, h("td", { colspan: String(head.length) }, empty))];
  const el = h("table", { id, class: `data ${cls}`.trim() },
    h("caption", { id: capId }, caption),
    h("thead", {}, h("tr", {}, ...head.map((c) => (typeof c === "string"
      ? h("th", { scope: "col" }, c)
      : c)))),
    h("tbody", {}, ...body));
  // A column of numbers is right-aligned, its heading too.
  const first = rows[0]?.children;
  el.querySelectorAll("thead th").forEach((th, i) => {
    if (first?.[i]?.classList.contains("num")) th.classList.add("num");
  });
  const wrap = h("div", { class: "table-wrap", "data-caption": capId }, el);
  fitScroll(wrap);
  return wrap;
}

/**
 * Roles spelled out on a table that a narrow window lays out as blocks (CSS display), so
 * that it stays a table to a screen reader.
 */
function keepTableRoles(wrap) {
  const el = wrap.querySelector("table");
  el.setAttribute("role", "table");
  for (const g of el.querySelectorAll("thead, tbody")) g.setAttribute("role", "rowgroup");
  for (const tr of el.querySelectorAll("tr")) tr.setAttribute("role", "row");
  for (const th of el.querySelectorAll("th")) {
    th.setAttribute("role", th.getAttribute("scope") === "row" ? "rowheader" : "columnheader");
  }
  for (const td of el.querySelectorAll("td")) td.setAttribute("role", "cell");
  return wrap;
}

// A box that scrolls is a focusable region; its width is for the caption, which stays in
// view while the table scrolls under it (CSS).
const overflow = new ResizeObserver((entries) => {
  for (const { target } of entries) {
    if (target.scrollWidth > target.clientWidth + 1) {
      target.setAttribute("tabindex", "0");
      target.setAttribute("role", "region");
      target.setAttribute("aria-labelledby", target.dataset.caption);
      target.dataset.scrolls = ""; // CSS: a shadow where more is, the caption says so
    } else {
      for (const name of ["tabindex", "role", "aria-labelledby"]) target.removeAttribute(name);
      delete target.dataset.scrolls;
    }
    target.style.setProperty("--box-width", `${target.clientWidth}px`);
  }
});

function fitScroll(wrap) {
  overflow.observe(wrap);
}

/** Stop watching the tables and charts under `root` (about to be replaced). */
function forget(root) {
  for (const wrap of root.querySelectorAll(".table-wrap")) overflow.unobserve(wrap);
  for (const box of root.querySelectorAll(".chart")) charts.unobserve(box);
}

function num(value, attrs = {}) {
  return h("td", { class: "num", ...attrs }, String(value));
}

function statusBadge(status, ended) {
  const badge = h("span", { class: `badge ${status === "running" ? "playing" : "ended"}` }, status);
  return ended ? [badge, " ", h("span", { class: "ended-why" }, endingText(ended))] : [badge];
}

const PROVISIONAL = () =>
  h("span", { class: "prov", title: "Provisional: too few games yet for a settled rating" },
    h("span", { "aria-hidden": "true" }, "?"),
    h("span", { class: "sr-only" }, " (provisional)"));

/** The rows of a Glicko-2 board: rank, name, rating ± deviation (? provisional), games.
 * `who` heads the names' column: the bots, or the people (named human seats) apart. */
function ratingTable(board, id, caption, who = "Bot") {
  const rows = board.rows.map((r, i) =>
    h("tr", { "data-bot": r.name, "data-provisional": String(r.provisional) },
      num(i + 1),
      h("th", { scope: "row" }, r.name),
      h("td", { class: "num rating" },
        h("strong", {}, Math.round(r.rating)),
        r.provisional ? PROVISIONAL() : h("span", { class: "prov", "aria-hidden": "true" }),
        h("span", { class: "pm" }, ` ± ${Math.round(r.deviation)}`)),
      num(r.games)));
  const deviation = "the rating's deviation: within twice it of the rating, 95% sure";
  const head = ["#", who,
    h("th", { scope: "col" }, "Rating ", h("abbr", { title: deviation }, "±")),
    "Games"];
  const note = board.rows.some((r) => r.provisional)
    ? h("p", { class: "hint" }, "? a provisional rating: too few games yet.")
    : null;
  return [table(id, caption, head, rows, { empty: "No rated games yet." }), note];
}

function boardCaption(board) {
  const opts = optionsText(board.options);
  return `${gameTitle(board.game)}${opts ? ` · ${opts}` : ""}`;
}

function notFound(main, text) {
  main.replaceChildren(
    h("div", { class: "card notice" },
      h("h1", {}, "Not found"),
      h("p", {}, text),
      h("p", {}, h("a", { href: "/tournaments", "data-link": true }, "All tournaments"))));
}

/** Redraws a part only when its data changed: focus, scroll and selection stay put. */
class Parts {
  constructor() {
    this.drawn = new Map();
  }

  set(el, key, data, draw) {
    const text = JSON.stringify(data);
    if (this.drawn.get(key) === text) return;
    this.drawn.set(key, text);
    const focused = document.activeElement;
    const keep = el.contains(focused) && focused.dataset?.game;
    forget(el);
    el.replaceChildren(...[draw()].flat(Infinity).filter((c) => c !== null && c !== undefined));
    if (keep) el.querySelector(`a[data-game="${CSS.escape(keep)}"]`)?.focus();
  }
}

// -- the list -----------------------------------------------------------------------------------
class TournamentList {
  constructor(main) {
    this.main = main;
    this.closed = false;
    this.drawn = "";
  }

  open() {
    document.title = "Agon — tournaments";
    this.body = h("div", { "aria-busy": "true" }, h("p", { class: "loading" }, "Loading…"));
    this.main.replaceChildren(
      h("section", { class: "tours card" },
        h("div", { class: "games-head" },
          h("h1", {}, "Tournaments"),
          h("a", { href: "/leaderboards", "data-link": true }, "Leaderboards")),
        this.body));
    this.refresh();
    this.timer = setInterval(() => document.hidden || this.refresh(), LIST_REFRESH_MS);
  }

  close() {
    this.closed = true;
    clearInterval(this.timer);
    forget(this.main);
  }

  async refresh() {
    let got;
    try {
      got = await api("/api/tournaments");
    } catch (err) {
      if (!this.drawn && !this.closed) {
        const why = `Cannot list tournaments: ${err.message}`;
        this.body.replaceChildren(h("p", { class: "message" }, why));
      }
      return;
    } finally {
      this.body.setAttribute("aria-busy", "false");
    }
    if (this.closed) return;
    const drawn = JSON.stringify(got.tournaments);
    if (drawn === this.drawn) return;
    this.drawn = drawn;
    const focused = document.activeElement?.closest?.("#tournaments a[data-id]")?.dataset.id;
    forget(this.body);
    const rows = got.tournaments.map((t) => this.row(t));
    const empty = "No tournaments yet: the operator starts them with “agon tournament” or "
      + "“agon match”.";
    const list = table("tournaments", "Tournaments and matches, newest first",
      ["Tournament", "Format", "Game", "Bots", "Status", "Games"], rows, { empty });
    this.body.replaceChildren(keepTableRoles(list));
    if (focused) this.body.querySelector(`a[data-id="${CSS.escape(focused)}"]`)?.focus();
  }

  row(t) {
    const created = new Date(t.created);
    return h("tr", { "data-id": t.id, "data-status": t.status },
      h("th", { scope: "row" },
        h("a", { href: `/tournaments/${t.id}`, "data-link": true, "data-id": t.id },
          t.name || t.id),
        h("small", { class: "sub" },
          t.name ? `${t.id} · ` : "",
          h("time", { datetime: created.toISOString() }, created.toLocaleString()))),
      h("td", { class: "format" }, formatName(t.format)),
      h("td", { class: "game" }, gameTitle(t.game)),
      h("td", { class: "bots" }, t.bots.join(", ")),
      h("td", { class: "state" }, ...statusBadge(t.status, t.ended)),
      h("td", {
        class: "num count", "data-finished": String(t.finished),
        title: "games finished of those scheduled",
      }, `${t.finished}/${t.games}`));
  }
}

// -- one tournament -----------------------------------------------------------------------------
class TournamentPage {
  constructor(main, id, announce) {
    this.main = main;
    this.id = id;
    this.announce = announce;
    this.closed = false;
    this.parts = new Parts();
    this.status = null;
    this.verdict = null;
  }

  open() {
    document.title = `Agon — tournament ${this.id}`;
    this.main.replaceChildren(h("p", { class: "loading" }, "Loading the tournament…"));
    this.refresh();
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    forget(this.main);
  }

  async refresh() {
    let rep;
    try {
      rep = await api(`/api/tournaments/${encodeURIComponent(this.id)}`);
    } catch (err) {
      if (this.closed) return;
      if (err instanceof ApiError && err.status === 404) {
        notFound(this.main, `There is no tournament ${this.id}.`);
        return;
      }
      if (!this.layout) {
        const why = `Cannot load the tournament: ${err.message}`;
        this.main.replaceChildren(h("p", { class: "message", role: "alert" }, why));
      }
      this.later();
      return;
    }
    if (this.closed) return;
    if (!this.layout) this.build(rep);
    this.draw(rep);
    this.tell(rep);
    if (rep.status === "running") this.later();
  }

  later() {
    this.timer = setTimeout(() => {
      if (document.hidden) this.later();
      else this.refresh();
    }, REFRESH_MS);
  }

  /** What a screen reader hears: the end, and a match's verdict when it changes. */
  tell(rep) {
    const was = this.status;
    this.status = rep.status;
    if (was === "running" && rep.status === "ended") {
      this.announce(`The tournament ended: ${endingText(rep.ended?.reason)}.`);
    }
    const verdict = rep.sprt?.verdict ?? null;
    if (this.verdict !== null && verdict !== this.verdict) this.announce(this.verdictText(rep));
    this.verdict = verdict;
  }

  build(rep) {
    const spec = rep.spec;
    const match = spec.format === "match";
    const who = match ? `${spec.bots[0]} vs ${spec.bots[1]}` : formatName(spec.format);
    const title = spec.name || `${who} · ${gameTitle(spec.game)}`;
    document.title = `Agon — ${title}`;
    const part = (id, cls = "") => h("section", { class: `card ${cls}`.trim(), id: `part-${id}` });
    this.head = h("div", { class: "tour-state" });
    this.el = {
      sprt: match ? part("sprt", "wide") : null,
      standings: part("standings"),
      crosstable: part("crosstable"),
      pairs: part("pairs"),
      ratings: part("ratings"),
      health: part("health", "wide"),
      schedule: part("schedule", "wide"),
    };
    const el = this.el;
    this.layout = h("div", { class: "tour", "data-format": spec.format, "data-id": rep.id },
      h("section", { class: "card tour-head wide" },
        h("p", { class: "crumbs" },
          h("a", { href: "/tournaments", "data-link": true }, "Tournaments"), " / ", rep.id),
        h("h1", {}, title),
        h("p", { class: "meta" }, ...this.meta(spec)),
        this.head),
      match ? [el.sprt, el.pairs, el.standings] : [el.standings, el.crosstable, el.pairs],
      el.ratings,
      match ? el.crosstable : null,
      el.health,
      el.schedule);
    this.main.replaceChildren(this.layout);
  }

  meta(spec) {
    const opts = optionsText(spec.options) || "default options";
    const bank = spec.time_bank_ms ? ` + ${moveTime(spec.time_bank_ms)} bank` : "";
    const bits = [
      formatName(spec.format),
      gameTitle(spec.game),
      opts,
      `${moveTime(spec.move_time_ms)} per move${bank}`,
      spec.format === "match"
        ? `SPRT Elo ${spec.sprt.elo0} vs ${spec.sprt.elo1}, at most ${spec.max_pairs} pairs`
        : `${spec.rounds} ${spec.rounds === 1 ? "round" : "rounds"}`,
      `${spec.concurrency} at once`,
    ];
    const sep = () => h("span", { class: "sep", "aria-hidden": "true" }, " · ");
    return bits.flatMap((b, i) => (i ? [sep(), b] : [b]));
  }

  draw(rep) {
    const el = this.el;
    const set = (key, data, draw) => el[key] && this.parts.set(el[key], key, data, draw);
    this.parts.set(this.head, "head", [rep.status, rep.ended, rep.games, rep.rounds], () =>
      this.state(rep));
    // The verdict reads "so far" while the match runs, "after" once it ended.
    if (rep.sprt) set("sprt", [rep.sprt, rep.status], () => this.sprt(rep));
    set("standings", rep.standings, () => [
      h("h2", {}, "Standings"),
      this.standings(rep),
    ]);
    set("crosstable", [rep.crosstable, rep.standings.map((s) => s.name)], () => [
      h("h2", {}, "Crosstable"),
      this.crosstable(rep),
    ]);
    set("pairs", rep.pairs, () => [h("h2", {}, "Pairs"), this.pairs(rep)]);
    set("ratings", rep.ratings, () => [
      h("h2", {}, "Glicko-2 ratings"),
      h("p", { class: "hint" }, "From this tournament's games alone."),
      ...(rep.ratings.length
        ? rep.ratings.map((b, i) => ratingTable(b, i ? `ratings-${i}` : "ratings", boardCaption(b)))
        : [h("p", { class: "hint" }, "No rated games yet.")]),
    ]);
    set("health", [rep.health, rep.terminations, rep.faults], () => [
      h("h2", {}, "Health"),
      this.health(rep),
      this.terminations(rep),
    ]);
    set("schedule", [rep.schedule, rep.byes], () => [h("h2", {}, "Games"), this.schedule(rep)]);
  }

  state(rep) {
    const { scheduled, finished } = rep.games;
    const share = scheduled ? finished / scheduled : 0;
    const ended = rep.ended
      ? [" ", h("span", { class: "ended-why" }, endingText(rep.ended.reason)),
        rep.ended.detail ? h("span", { class: "hint" }, ` — ${rep.ended.detail}`) : null]
      : [];
    const rounds = `${rep.rounds} ${rep.rounds === 1 ? "round" : "rounds"} paired`;
    return [
      h("p", { class: "tour-status", id: "tour-status", "data-status": rep.status },
        h("span", { class: `badge ${rep.status === "running" ? "playing" : "ended"}` }, rep.status),
        ...ended),
      h("div", {
          class: "progress", id: "progress", role: "progressbar", "aria-label": "Games finished",
          "aria-valuemin": "0", "aria-valuemax": String(scheduled),
          "aria-valuenow": String(finished), "aria-valuetext": `${finished} of ${scheduled} games`,
        },
        h("span", { class: "bar", style: `width: ${(share * 100).toFixed(1)}%` })),
      h("p", { class: "progress-text" },
        h("span", {}, `${finished} of ${scheduled} games finished · ${rounds}`),
        h("a", {
          href: `/api/tournaments/${encodeURIComponent(rep.id)}/standings.csv`,
          download: `${rep.id}-standings.csv`, id: "csv",
        }, "Standings as CSV")),
    ];
  }

  standings(rep) {
    const rows = rep.standings.map((s) =>
      h("tr", { "data-bot": s.name, "data-points": String(s.points), "data-rank": String(s.rank) },
        num(s.rank),
        h("th", { scope: "row" }, s.name),
        h("td", { class: "num points" }, h("strong", {}, points(s.points))),
        num(s.games),
        num(s.wins),
        num(s.losses),
        num(s.draws),
        num(points(s.buchholz)),
        num(points(s.sonneborn_berger))));
    const head = ["#", "Bot", "Points", "Games",
      h("th", { scope: "col" }, h("abbr", { title: "Wins" }, "W")),
      h("th", { scope: "col" }, h("abbr", { title: "Losses" }, "L")),
      h("th", { scope: "col" }, h("abbr", { title: "Draws" }, "D")),
      h("th", { scope: "col" }, h("abbr", { title: "Buchholz: the opponents' points" }, "Buch.")),
      h("th", { scope: "col" }, h("abbr", { title: "Sonneborn–Berger" }, "S-B"))];
    const caption = "Points: 1 a win, ½ a draw; ties broken by Buchholz, then Sonneborn–Berger";
    return table("standings", caption, head, rows, { cls: "standings" });
  }

  crosstable(rep) {
    const names = rep.standings.map((s) => s.name);
    for (const n of Object.keys(rep.crosstable)) if (!names.includes(n)) names.push(n);
    const head = ["Bot", ...names.map((n, i) =>
      h("th", { scope: "col", title: n, class: "num" },
        h("span", { "aria-hidden": "true" }, String(i + 1)), h("span", { class: "sr-only" }, n)))];
    const rows = names.map((a, i) =>
      h("tr", { "data-bot": a },
        h("th", { scope: "row" },
          h("span", { class: "idx", "aria-hidden": "true" }, String(i + 1)), a),
        ...names.map((b) => this.cross(a, b, rep.crosstable[a]?.[b]))));
    return table("crosstable", "Wins-losses-draws of the row against the column (hover: per seat)",
      head, rows, { cls: "crosstable" });
  }

  cross(a, b, c) {
    if (a === b) return h("td", { class: "self", "aria-label": "itself" }, "—");
    if (!c) return h("td", { "data-row": a, "data-col": b, class: "none" }, "");
    const n = c.wins + c.losses + c.draws;
    const score = n ? (c.wins + c.draws / 2) / n : 0.5;
    const seat = `as first ${wld(c.as_first)}, as second ${wld(c.as_second)}`;
    const tone = score > 0.5 ? "up" : score < 0.5 ? "down" : "even";
    return h("td", {
        "data-row": a, "data-col": b, "data-wld": wld(c), class: `wld ${tone}`,
        title: `${a} against ${b}: ${wld(c)}; ${seat}`,
      },
      h("span", { class: "wld-text" }, wld(c)),
      h("span", { class: "sr-only" }, `; ${seat}`));
  }

  pairs(rep) {
    const rows = rep.pairs.map((p) =>
      h("tr", { "data-pair": `${p.a}|${p.b}` },
        h("th", { scope: "row" }, p.a, h("span", { class: "vs" }, " vs "), p.b),
        h("td", { class: "num" }, `${p.wins}-${p.losses}-${p.draws}`),
        h("td", { class: "num penta", title: `Pairs where ${p.a} scored 0, ½, 1, 1½, 2 points` },
          p.penta.join(" · ")),
        h("td", { class: "num elo" }, p.elo === null
          ? "—"
          : [signed(p.elo), h("span", { class: "pm" }, ` ± ${Math.round(p.elo_error)}`)]),
        h("td", { class: "num" }, p.los === null ? "—" : `${(p.los * 100).toFixed(1)}%`)));
    const penta = "Pentanomial: pairs of games scoring 0, ½, 1, 1½, 2 for the first";
    const head = ["Pair", "W-L-D",
      h("th", { scope: "col" }, h("abbr", { title: penta }, "Penta")),
      h("th", { scope: "col" }, "Elo ", h("abbr", { title: "95% error bars" }, "±")),
      h("th", { scope: "col" }, h("abbr", { title: "Likelihood of superiority" }, "LOS"))];
    return table("pairs", "Each pair from the first's side: results, Elo difference, LOS",
      head, rows, { cls: "pairs", empty: "No finished pair of games yet." });
  }

  /** The entries of a per-bot table, in the order of the standings. */
  byStanding(rep, table) {
    const order = new Map(rep.standings.map((s, i) => [s.name, i]));
    const at = (name) => order.get(name) ?? order.size;
    return Object.entries(table).sort(([a], [b]) => at(a) - at(b) || (a < b ? -1 : a > b ? 1 : 0));
  }

  health(rep) {
    const rows = this.byStanding(rep, rep.health).map(([name, b]) =>
      h("tr", { "data-bot": name },
        h("th", { scope: "row" }, name),
        num(b.games), num(b.moves),
        num(b.timeouts, { class: `num${b.timeouts ? " bad" : ""}` }),
        num(b.illegal_moves, { class: `num${b.illegal_moves ? " bad" : ""}` }),
        num(b.no_replies, { class: `num${b.no_replies ? " bad" : ""}` }),
        num(b.disconnects, { class: `num${b.disconnects ? " bad" : ""}` }),
        num(b.think_p50_ms), num(b.think_p95_ms),
        num(b.lag_p95_ms), num(b.interrupted, { class: `num${b.interrupted ? " bad" : ""}` })));
    const head = ["Bot", "Games", "Moves", "Timeouts", "Illegal", "No reply", "Disconnects",
      h("th", { scope: "col" }, h("abbr", { title: "Median think time, ms" }, "p50 ms")),
      h("th", { scope: "col" }, h("abbr", { title: "95th percentile think time, ms" }, "p95 ms")),
      h("th", { scope: "col" }, h("abbr", {
        title: "The platform's lag before the bot's turns reached it (95th percentile, ms):"
          + " not counted on the bot's clock" }, "Lag ms")),
      h("th", { scope: "col" }, h("abbr", {
        title: "Games the platform ended (a turn it did not deliver in time): replayed,"
          + " not scored" }, "Platform"))];
    return table("health", "Each bot's games, moves, faults, think times and the platform's lag",
      head, rows,
      { cls: "health", empty: "No finished games yet." });
  }

  terminations(rep) {
    const reasons = [...new Set(Object.values(rep.terminations).flatMap(Object.keys))].sort();
    const rows = this.byStanding(rep, rep.terminations).map(([name, counts]) =>
      h("tr", { "data-bot": name },
        h("th", { scope: "row" }, name),
        ...reasons.map((r) => {
          const fault = rep.faults?.[name]?.[r] || 0;
          return h("td", { class: "num", "data-reason": r },
            String(counts[r] || 0),
            fault ? h("span", { class: "fault" }, ` (${fault} at fault)`) : null);
        })));
    const name = (r) => (r === "natural" ? "by the rules" : REASONS[r] || r);
    const head = ["Bot",
      ...reasons.map((r) => h("th", { scope: "col", "data-reason": r }, name(r)))];
    return table("terminations", "How each bot's games ended", head, rows,
      { cls: "terminations", empty: "No finished games yet." });
  }

  schedule(rep) {
    const rows = rep.schedule.map((g) => {
      const [first, second] = g.seats;
      const winner = g.result === 1 ? first : g.result === 2 ? second : null;
      const result = g.result === null ? "" : String(g.result);
      const names = [first, h("span", { class: "vs" }, " vs "), second];
      // A game the director has not created yet has no page to link to.
      const players = g.status === "waiting"
        ? h("span", {}, ...names)
        : h("a", { href: `/games/${g.game_id}`, "data-link": true, "data-game": g.game_id },
          ...names);
      return h("tr", { "data-game": g.game_id, "data-result": result, "data-status": g.status },
        num(g.round),
        h("th", { scope: "row" },
          players,
          h("small", { class: "sub" },
            g.game_id, g.replay_of ? ` · replays ${g.replay_of}` : "")),
        h("td", { class: "result" }, this.result(g, winner)));
    });
    const byes = Object.entries(rep.byes || {});
    return [
      table("schedule",
        "Every game (the bot moving first named first), with a link to watch or replay it",
        ["Round", "Game", "Result"], rows, { cls: "schedule", empty: "No game scheduled yet." }),
      byes.length
        ? h("p", { class: "hint byes" }, "Byes: ", byes.map(([n, k]) => `${n} ${k}`).join(", "))
        : null,
    ];
  }

  result(g, winner) {
    if (g.result === null) {
      // Not recorded yet: waiting to be created, playing, or just ended.
      return h("span", { class: `badge ${g.status}` }, g.status === "ended" ? "finished" : g.status);
    }
    const why = REASONS[g.reason] ?? g.reason ?? "";
    if (NO_RESULT.has(g.reason)) return `No result — ${why}`;
    const text = winner ? `${winner} wins` : "Draw";
    return why ? [text, h("span", { class: "hint" }, ` — ${why}`)] : text;
  }

  verdictText(rep) {
    const s = rep.sprt;
    const [a, b] = rep.spec.bots;
    const [h0, h1] = [signed(s.elo0), signed(s.elo1)];
    if (s.verdict === "H1") return `H1 accepted: ${a} against ${b} is nearer ${h1} Elo than ${h0}.`;
    if (s.verdict === "H0") return `H0 accepted: ${a} against ${b} is nearer ${h0} Elo than ${h1}.`;
    const pairs = s.trajectory.length;
    return rep.status === "ended"
      ? `Undecided after ${pairs} ${pairs === 1 ? "pair" : "pairs"}.`
      : `Undecided so far: ${pairs} ${pairs === 1 ? "pair" : "pairs"} played.`;
  }

  sprt(rep) {
    const s = rep.sprt;
    const [a, b] = rep.spec.bots;
    const tone = s.verdict === "H1" ? "h1" : s.verdict === "H0" ? "h0" : "open";
    return [
      h("h2", {}, `SPRT: ${a} against ${b}`),
      h("p", { class: `verdict ${tone}`, id: "verdict", "data-verdict": s.verdict },
        this.verdictText(rep)),
      h("div", { class: "sprt-body" },
        chartBox(s),
        h("dl", { class: "facts" },
          fact("LLR", signed(s.llr, 2), { id: "llr-value" }),
          fact("Bounds", `${signed(s.lower, 2)} … ${signed(s.upper, 2)}`),
          fact("Hypotheses", `H0 Elo ${signed(s.elo0)} · H1 Elo ${signed(s.elo1)}`),
          fact("Errors", `α ${s.alpha} · β ${s.beta} · ${s.model}`),
          fact("Pentanomial", s.penta.join(" · "),
            { title: `Pairs where ${a} scored 0, ½, 1, 1½, 2` }))),
    ];
  }
}

function fact(term, value, attrs = {}) {
  return h("div", {}, h("dt", {}, term), h("dd", attrs, value));
}


// The chart is drawn at the size it is shown (a unit of its box is a CSS pixel), so its
// text is as legible on a phone as on a wide screen; it is drawn again when that changes.
const CHART_MAX = 640;
const charts = new ResizeObserver((entries) => {
  for (const { target } of entries) drawChart(target);
});

function chartBox(s) {
  const box = h("div", { class: "chart" });
  box.sprt = s;
  charts.observe(box);
  return box;
}

function drawChart(box) {
  if (!box.isConnected) {
    charts.unobserve(box);
    return;
  }
  const width = Math.round(Math.min(box.clientWidth, CHART_MAX));
  if (!width || width === box.drawnWidth) return;
  box.drawnWidth = width;
  box.replaceChildren(llrChart(box.sprt, width));
}

/** The LLR after each complete pair, with the bounds at which the test decides. */
function llrChart(s, W) {
  const H = Math.round(Math.max(180, Math.min(260, W * 0.5)));
  const left = 44;
  const right = 52;
  const top = 14;
  const bottom = 30;
  const traj = s.trajectory;
  const n = Math.max(traj.length, 1);
  const lo = Math.min(s.lower, 0, ...traj);
  const hi = Math.max(s.upper, 0, ...traj);
  const pad = (hi - lo) * 0.08 || 1;
  const [y0, y1] = [lo - pad, hi + pad];
  const x = (i) => left + ((W - left - right) * i) / n;
  const y = (v) => top + ((H - top - bottom) * (y1 - v)) / (y1 - y0);
  const r = (v) => v.toFixed(1);
  const pairs = `${traj.length} ${traj.length === 1 ? "pair" : "pairs"}`;
  const last = traj.length ? traj[traj.length - 1] : 0;
  const across = (cls, v) =>
    svg("line", { class: cls, x1: r(left), x2: r(W - right), y1: r(y(v)), y2: r(y(v)) });
  const tick = (v, text) => svg("text", {
    class: "tick", x: left - 6, y: r(y(v)), "text-anchor": "end", "dominant-baseline": "central",
  }, text);
  const bound = (v, cls, label) => [
    across(`bound ${cls}`, v),
    tick(v, signed(v, 2)),
    svg("text", {
      class: `bound-label ${cls}`, x: r(W - right + 6), y: r(y(v)), "dominant-baseline": "central",
    }, label),
  ];
  const below = (x0, anchor, cls, text) =>
    svg("text", { class: cls, x: r(x0), y: H - 10, "text-anchor": anchor }, text);
  const points = traj.map((v, i) => `${r(x(i + 1))},${r(y(v))}`).join(" ");
  return svg("svg", {
      id: "llr", class: "llr", viewBox: `0 0 ${W} ${H}`, role: "img",
      "aria-labelledby": "llr-title", "data-points": String(traj.length),
    },
    svg("title", { id: "llr-title" }, `LLR after ${pairs}: ${signed(last, 2)}; the test `
      + `accepts H1 at ${signed(s.upper, 2)} and H0 at ${signed(s.lower, 2)}`),
    svg("rect", {
      class: "plot", x: left, y: top, width: W - left - right, height: H - top - bottom,
    }),
    across("zero", 0),
    tick(0, "0"),
    ...bound(s.upper, "upper", "H1"),
    ...bound(s.lower, "lower", "H0"),
    traj.length // from the start (no pair, LLR 0) to the first pair
      ? svg("line", { class: "lead", x1: r(x(0)), y1: r(y(0)), x2: r(x(1)), y2: r(y(traj[0])) })
      : "",
    svg("polyline", { class: "trajectory", points }),
    traj.length
      ? svg("circle", { class: "last", cx: r(x(traj.length)), cy: r(y(last)), r: 4 })
      : "",
    below(left, "start", "tick", "0"),
    below(W - right, "end", "tick", String(traj.length)),
    below((left + W - right) / 2, "middle", "axis", "pairs played"));
}

// -- leaderboards -------------------------------------------------------------------------------
class Leaderboards {
  constructor(main) {
    this.main = main;
    this.closed = false;
    this.drawn = "";
    this.asked = 0;
    this.game = new URLSearchParams(location.search).get("game") || "";
  }

  async open() {
    document.title = "Agon — leaderboards";
    this.select = h("select", { id: "lb-game", onchange: () => this.chosen() });
    this.boards = h("div", { class: "boards", id: "boards", "aria-busy": "true" },
      h("p", { class: "loading" }, "Loading…"));
    this.main.replaceChildren(
      h("section", { class: "card leaderboards" },
        h("div", { class: "games-head" },
          h("h1", {}, "Leaderboards"),
          h("div", { class: "filters" }, h("label", {}, "Game ", this.select))),
        h("p", { class: "hint" },
          "Glicko-2 ratings from every finished game between two named players, per option set; "
          + "people who played under a name are listed apart from the bots (anonymous seats "
          + "are not rated)."),
        this.boards));
    let cat;
    try {
      cat = await catalogue();
    } catch (err) {
      const why = `Cannot load the games: ${err.message}`;
      this.boards.replaceChildren(h("p", { class: "message" }, why));
      return;
    }
    if (this.closed) return;
    if (!cat.games.some((g) => g.name === this.game)) this.game = cat.games[0]?.name || "";
    this.select.append(...cat.games.map((g) =>
      h("option", { value: g.name, selected: g.name === this.game }, g.title)));
    this.refresh();
    this.timer = setInterval(() => document.hidden || this.refresh(), BOARD_REFRESH_MS);
  }

  close() {
    this.closed = true;
    clearInterval(this.timer);
    forget(this.main);
  }

  chosen() {
    this.game = this.select.value;
    const url = new URL(location.href);
    url.searchParams.set("game", this.game);
    history.replaceState(history.state, "", url);
    this.drawn = "";
    this.boards.setAttribute("aria-busy", "true");
    this.refresh();
  }

  async refresh() {
    if (!this.game) return;
    const asked = ++this.asked;
    let got;
    try {
      got = await api(`/api/leaderboards/${encodeURIComponent(this.game)}`);
    } catch (err) {
      if (!this.closed && asked === this.asked && !this.drawn) {
        const why = `Cannot load the ratings: ${err.message}`;
        this.boards.replaceChildren(h("p", { class: "message" }, why));
      }
      return;
    }
    if (this.closed || asked !== this.asked) return;
    this.boards.setAttribute("aria-busy", "false");
    const drawn = JSON.stringify(got);
    if (drawn === this.drawn) return;
    this.drawn = drawn;
    forget(this.boards);
    if (!got.boards.length) {
      this.boards.replaceChildren(
        h("p", { class: "empty" }, `No rated games of ${gameTitle(got.game)} yet.`));
      return;
    }
    this.boards.replaceChildren(...got.boards.map((b, i) => {
      const id = i ? `leaderboard-${i}` : "leaderboard";
      const bots = { ...b, rows: b.rows.filter((r) => !r.person) };
      const people = { ...b, rows: b.rows.filter((r) => r.person) };
      return h("div", { class: "board-table", "data-options": JSON.stringify(b.options) },
        ratingTable(bots, id, boardCaption(b)),
        people.rows.length
          ? ratingTable(people, `${id}-people`, `${boardCaption(b)} · people`, "Person")
          : null);
    }));
  }
}
