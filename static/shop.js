/* Two small things a page asks for with data- attributes, with no inline script (the pages'
   Content-Security-Policy allows none) and nothing from a CDN.

   <time datetime="ISO" data-local>: the UTC text in the page is replaced by the reader's own
   local time (to the second with data-seconds). Without this script the UTC text stays.

   <main data-poll="URL" data-state="S">: while the page waits on something (a payment being
   processed, the provider unreachable), ask URL for its JSON every few seconds; when the order's
   state differs from S, fetch the page again and swap in its <main>: no full reload. */
(function () {
  "use strict";

  function localise(root) {
    root.querySelectorAll("time[data-local]").forEach(function (el) {
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at.getTime())) { return; }
      var options = {year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
                     timeZoneName: "short"};
      if (el.hasAttribute("data-seconds")) { options.second = "2-digit"; }
      el.textContent = at.toLocaleString(undefined, options);
      el.title = el.getAttribute("datetime");
    });
  }

  function stateOf(json) {
    return json.status + (json.payment ? "/" + json.payment.status : "");
  }

  function poll(main) {
    var url = main.getAttribute("data-poll");
    var every = parseInt(main.getAttribute("data-poll-seconds") || "3", 10) * 1000;
    function tick() {
      fetch(url, {headers: {"Accept": "application/json"}, credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (json) {
          if (json && stateOf(json) !== main.getAttribute("data-state")) {
            return fetch(url, {headers: {"Accept": "text/html"}, credentials: "same-origin"})
              .then(function (r) { return r.text(); })
              .then(function (html) {
                var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
                if (!fresh) { return; }
                main.innerHTML = fresh.innerHTML;
                ["data-poll", "data-state"].forEach(function (name) {
                  if (fresh.hasAttribute(name)) { main.setAttribute(name, fresh.getAttribute(name)); }
                  else { main.removeAttribute(name); }
                });
                localise(main);
              });
          }
        })
        .catch(function () { /* offline for a moment: the next tick tries again */ })
        .then(function () { if (main.hasAttribute("data-poll")) { setTimeout(tick, every); } });
    }
    setTimeout(tick, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    localise(document);
    var main = document.querySelector("main[data-poll]");
    if (main) { poll(main); }
  });
}());
