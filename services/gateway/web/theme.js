// The theme before the first paint: the one chosen with the toggle, else the system's.
// A classic script loaded from the head (not a module, which would run after the first
// paint); it is a file of its own because the page's policy allows no inline script.
document.documentElement.dataset.theme = localStorage.getItem("agon.theme")
  || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
