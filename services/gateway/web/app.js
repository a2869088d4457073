// The page's entry: the theme (the system's, or the one chosen with the toggle), the
// router (`/` the lobby, `/games/{id}[?ply=N]` a board, `/tournaments[/{id}]` and
// `/leaderboards[?game=NAME]`: one HTML shell, no reloads between them) and the live region
// every view announces through.

import { showGame } from "./game.js";
import { showLobby } from "./lobby.js";
import { showLeaderboards, showTournament, showTournaments } from "./tournaments.js";

const main = document.getElementById("main");
const live = document.getElementById("announce");
let leave = null;

// -- theme ------------------------------------------------------------------------------------
const THEME = "agon.theme";
const toggle = document.getElementById("theme");

function theme() {
  return document.documentElement.dataset.theme;
}

function showTheme() {
  const dark = theme() === "dark";
  toggle.setAttribute("aria-pressed", String(dark)); // the label stays "Dark theme"
  toggle.title = `Switch to the ${dark ? "light" : "dark"} theme`;
  toggle.textContent = dark ? "☀" : "☾";
}

toggle.addEventListener("click", () => {
  document.documentElement.dataset.theme = theme() === "dark" ? "light" : "dark";
  localStorage.setItem(THEME, theme());
  showTheme();
});
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", (e) => {
  if (localStorage.getItem(THEME)) return; // a choice made with the toggle stays
  document.documentElement.dataset.theme = e.matches ? "dark" : "light";
  showTheme();
});
showTheme();

// -- announcements ----------------------------------------------------------------------------
function announce(text) {
  if (!text) return;
  const line = document.createElement("p");
  line.textContent = text;
  live.append(line);
  while (live.children.length > 5) live.firstChild.remove();
}

// -- routing ----------------------------------------------------------------------------------
function route() {
  if (leave) leave();
  const path = location.pathname;
  const game = /^\/games\/([A-Za-z0-9_.-]{1,64})\/?$/.exec(path);
  const tournament = /^\/tournaments\/([A-Za-z0-9_-]{1,24})\/?$/.exec(path);
  let section = "/";
  if (game) {
    // A number, or the text of a malformed ?ply= (shown at the last ply, with a note).
    const ply = new URLSearchParams(location.search).get("ply");
    const wanted = ply !== null && /^\d{1,7}$/.test(ply) ? Number(ply) : ply;
    leave = showGame(main, game[1], wanted, announce);
    section = null;
  } else if (tournament) {
    leave = showTournament(main, tournament[1], announce);
    section = "/tournaments";
  } else if (/^\/tournaments\/?$/.test(path)) {
    leave = showTournaments(main);
    section = "/tournaments";
  } else if (/^\/leaderboards\/?$/.test(path)) {
    leave = showLeaderboards(main);
    section = "/leaderboards";
  } else {
    leave = showLobby(main, navigate);
  }
  for (const a of document.querySelectorAll(".top nav a[data-link]")) {
    if (a.getAttribute("href") === section) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  main.focus({ preventScroll: true });
}

function navigate(url) {
  history.pushState(null, "", url);
  route();
  window.scrollTo(0, 0);
}

document.addEventListener("click", (e) => {
  const a = e.target.closest?.("a[data-link]");
  if (!a || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  e.preventDefault();
  navigate(a.getAttribute("href"));
});
window.addEventListener("popstate", route);
route();
