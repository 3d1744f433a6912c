/* Two small things a page asks for with data- attributes, with no inline script (the pages'
   Content-Security-Policy allows none) and nothing from a CDN.

   <time datetime="ISO" data-local>: the UTC text in the page is replaced by the reader's own
   local time (to the second with data-seconds; with data-beside, the console's, local time is
   added beside the UTC text instead). Without this script the UTC text stays.

   <main data-poll="URL" data-state="S">: while the page waits on something (a payment being
   processed, the provider unreachable), ask URL for its JSON every few seconds; when the order's
   state differs from S, fetch the page again and swap in its <main>: no full reload. The wait
   between asks grows while nothing changes, up to half a minute.

   With data-continue (an order in line for its payment page), the page goes on to the payment
   page by itself as soon as the order's JSON has one; data-poll-max-seconds caps the wait
   between asks.

   <body data-address="URL">: a refused form is answered at its POST address with the page it
   concerns; the address bar is set to that page's own GET address, so a reload or a copied
   link is the page, not the form's action. Polls say so (X-Backstop-Poll), so that in the
   console they do not count as the operator's activity. */
(function () {
  "use strict";

  function localise(root) {
    root.querySelectorAll("time[data-local]").forEach(function (el) {
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at.getTime())) { return; }
      var options = {year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
                     timeZoneName: "short"};
      if (el.hasAttribute("data-seconds")) { options.second = "2-digit"; }
      var local = at.toLocaleString(undefined, options);
      if (el.hasAttribute("data-beside")) {  /* the console: the UTC text stays, local time beside it */
        var utc = el.getAttribute("data-utc") || el.textContent;
        el.setAttribute("data-utc", utc);
        el.textContent = utc + " (" + local + " here)";
      } else {
        el.textContent = local;
      }
      el.title = el.getAttribute("datetime");
    });
  }

  /* The same string as shop/orders/views.py, watch_state. */
  function stateOf(json) {
    return [json.status, json.payment ? json.payment.status : "-", json.inventory_restored ? "restored" : "-",
            (json.refunds || []).map(function (r) { return r.status; }).join(",")].join("/");
  }

  function poll(main) {
    var url = main.getAttribute("data-poll");
    var first = parseInt(main.getAttribute("data-poll-seconds") || "3", 10) * 1000;
    var most = parseInt(main.getAttribute("data-poll-max-seconds") || "30", 10) * 1000;
    var every = first;
    function tick() {
      fetch(url, {headers: {"Accept": "application/json", "X-Backstop-Poll": "1"}, credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (json) {
          if (json && main.hasAttribute("data-continue") && json.status === "PaymentInitiated" && json.payment &&
              json.payment.status === "open" && json.payment.url) {
            window.location.assign(json.payment.url);
            return null;
          }
          if (!json || stateOf(json) === main.getAttribute("data-state")) {
            every = Math.min(every * 1.5, most);
            return null;
          }
          every = first;
          return fetch(url, {headers: {"Accept": "text/html", "X-Backstop-Poll": "1"}, credentials: "same-origin"})
              .then(function (r) { return r.text(); })
              .then(function (html) {
                var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
                if (!fresh) { return; }
                main.innerHTML = fresh.innerHTML;
                ["data-poll", "data-state", "data-continue", "data-poll-max-seconds"].forEach(function (name) {
                  if (fresh.hasAttribute(name)) { main.setAttribute(name, fresh.getAttribute(name)); }
                  else { main.removeAttribute(name); }
                });
                localise(main);
                reachable(main);
              });
        })
        .catch(function () { /* offline for a moment: the next tick tries again */ })
        .then(function () { if (main.hasAttribute("data-poll")) { setTimeout(tick, every); } });
    }
    setTimeout(tick, every);
  }

  /* <main data-refresh="N">: the page fetches itself every N seconds and swaps in its <main>,
     so a console page stays current without a reload; "[data-updated]" says how long ago that
     was. Never while the operator is typing in a form on the page (their words would be lost),
     or has a card's acknowledgement form open, nor while the tab is hidden. A <details> with an id
     that was open stays open. */
  function busy(main) {
    var el = document.activeElement;
    // An open form behind a <details> (a card's "Acknowledge…") is being used even before the
    // operator clicks into it: a swap would close it under their pointer.
    if (main.querySelector("details.ack[open]")) { return true; }
    return el && main.contains(el) && /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName) && el.type !== "submit";
  }

  function refresh(main) {
    var every = Math.max(2, parseInt(main.getAttribute("data-refresh"), 10) || 5) * 1000;
    var last = Date.now();
    function label() {
      var seconds = Math.round((Date.now() - last) / 1000);
      main.querySelectorAll("[data-updated]").forEach(function (el) {
        el.textContent = "Updated " + (seconds < 2 ? "just now" : seconds + " s ago") + "; refreshes by itself.";
      });
    }
    function tick() {
      if (document.hidden || busy(main)) { setTimeout(tick, every); return; }
      fetch(window.location.href, {headers: {"Accept": "text/html", "X-Backstop-Poll": "1"}, credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null || busy(main)) { return; }
          var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
          if (!fresh) { return; }
          var flashes = Array.prototype.slice.call(main.querySelectorAll(".flash"));  // shown once, kept
          // A "Technical detail" the operator opened stays open: the swap would fold it under them.
          var opened = Array.prototype.map.call(main.querySelectorAll("details[id][open]"), function (d) { return d.id; });
          main.innerHTML = fresh.innerHTML;
          opened.forEach(function (id) { var d = document.getElementById(id); if (d) { d.open = true; } });
          flashes.reverse().forEach(function (el) { main.insertBefore(el, main.firstChild); });
          last = Date.now();
          localise(main);
          reachable(main);
          label();
        })
        .catch(function () { /* the next tick tries again; the label shows how stale the page is */ })
        .then(function () { setTimeout(tick, every); });
    }
    label();
    setInterval(label, 1000);
    setTimeout(tick, every);
  }

  /* A table (or timeline, or traceback) wider than a phone scrolls sideways inside itself: one that
     has no link or button to Tab to is made focusable, so a keyboard can scroll it too (WCAG 2.1.1;
     axe-core's scrollable-region-focusable). Again after every swap of <main>, and on resize. */
  function reachable(root) {
    root.querySelectorAll("table, .timeline, pre").forEach(function (el) {
      var style = getComputedStyle(el);
      var scrolls = ((style.overflowX === "auto" || style.overflowX === "scroll") && el.scrollWidth > el.clientWidth + 1) ||
                    ((style.overflowY === "auto" || style.overflowY === "scroll") && el.scrollHeight > el.clientHeight + 1);
      // An element the page made focusable itself keeps its tabindex: only this helper's own is
      // ever taken away again (a body that stopped scrolling sideways may still scroll down).
      if (el.hasAttribute("tabindex") && !el.hasAttribute("data-scroll-focus")) return;
      if (scrolls && !el.querySelector("a[href], button, input, select, textarea, [tabindex]")) {
        el.setAttribute("tabindex", "0");
        el.setAttribute("data-scroll-focus", "");
      } else if (!scrolls && el.hasAttribute("data-scroll-focus")) {
        el.removeAttribute("tabindex");
        el.removeAttribute("data-scroll-focus");
      }
    });
  }

  new MutationObserver(function () { reachable(document); }).observe(document.documentElement,
                                                                      {childList: true, subtree: true});
  window.addEventListener("resize", function () { reachable(document); });

  document.addEventListener("DOMContentLoaded", function () {
    reachable(document);
    var address = document.body.getAttribute("data-address");
    if (address && window.history && window.history.replaceState) {
      window.history.replaceState(null, "", address);
    }
    localise(document);
    var main = document.querySelector("main[data-poll]");
    if (main) { poll(main); }
    var refreshing = document.querySelector("main[data-refresh]");
    if (refreshing) { refresh(refreshing); }
  });
}());
