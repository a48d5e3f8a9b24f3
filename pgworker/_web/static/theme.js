/* pgworker's dashboard: the theme toggle (auto, dark, light, auto...). The choice is kept in a
 * cookie on the dashboard's path (data-cookie-path of <body>), which the server reads to write
 * <html data-theme> into every page: the first paint is already in the chosen theme. "auto" (no
 * cookie) follows the browser's prefers-color-scheme. The change is applied at once, and said to
 * the charts (event "pgworker:theme") so that they redraw in the new colours. */
(function () {
  "use strict";
  var button = document.querySelector("[data-theme-toggle]");
  if (!button) { return; }
  var NEXT = { auto: "dark", dark: "light", light: "auto" };
  var root = document.documentElement;
  var path = document.body.getAttribute("data-cookie-path") || "/";

  function apply(theme) {
    if (theme === "auto") {
      root.removeAttribute("data-theme");
      document.cookie = "pgworker_theme=; path=" + path + "; max-age=0; SameSite=Strict";
    } else {
      root.setAttribute("data-theme", theme);
      document.cookie = "pgworker_theme=" + theme + "; path=" + path +
        "; max-age=31536000; SameSite=Strict" +
        (location.protocol === "https:" ? "; Secure" : "");
    }
    button.setAttribute("data-theme-toggle", theme);
    button.textContent = "Theme: " + theme;
    document.dispatchEvent(new CustomEvent("pgworker:theme", { detail: theme }));
  }

  button.hidden = false;
  button.addEventListener("click", function () {
    apply(NEXT[button.getAttribute("data-theme-toggle")] || "auto");
  });
  if (window.matchMedia) {
    var query = window.matchMedia("(prefers-color-scheme: dark)");
    var changed = function () {
      if (!root.hasAttribute("data-theme")) {
        document.dispatchEvent(new CustomEvent("pgworker:theme", { detail: "auto" }));
      }
    };
    if (query.addEventListener) { query.addEventListener("change", changed); }
  }
})();
