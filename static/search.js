// Offline search: no dependencies, no network. The page is complete without this script; it only adds
// the search box. The index (search-index.js) is loaded on first use, by a script tag, so file:// works.
(function () {
  "use strict";
  var form = document.querySelector("form.search");
  if (!form) return;
  var root = form.getAttribute("data-root") || "";
  var model = form.getAttribute("data-model") || "";  // the model being read, whose pages come first on a tie
  var input = form.querySelector("input");
  var list = form.querySelector("ol");
  var loading = false;
  form.hidden = false;

  function load(then) {
    if (window.EXPLORER_SEARCH) return then();
    if (loading) return;
    loading = true;
    var s = document.createElement("script");
    s.src = root + "search-index.js";
    s.onload = then;
    document.head.appendChild(s);
  }

  // Whole words only (identifiers and numbers kept whole), plurals folded: "experts" finds "expert".
  function words(s) { return (s.toLowerCase().match(/[a-z_][a-z0-9_\-]*|\d[\d,]*(?:\.\d+)?/g) || []).map(stem); }
  function stem(w) { return w.length > 3 && /[^s]s$/.test(w) ? w.slice(0, -1) : w; }
  // 2 when the phrase ends the text (a title's head noun: "latent attention", not "Attention RMSNorm"),
  // 1 when it stands elsewhere in it as whole words, 0 when it does not.
  function phraseIn(phrase, text) {
    var p = words(phrase), t = words(text), found = 0;
    for (var i = 0; i + p.length <= t.length; i++) {
      if (p.every(function (w, j) { return t[i + j] === w; })) found = i + p.length === t.length ? 2 : 1;
    }
    return found;
  }
  // Own properties only: a query such as "constructor" must not read Object.prototype's members.
  var own = function (table, key) { return Object.prototype.hasOwnProperty.call(table, key) ? table[key] : undefined; };
  function weight(entry, term) { return own(entry.w, term) || own(entry.w, stem(term)) || 0; }
  var SHOWN = 12;  // results listed at first; a last item lists the rest
  var all = false;

  // A page scores for being the concept asked for: its title or acronym (100); its breadcrumb, key or step
  // program, or a title that ends in the phrase, as "latent attention" ends "Multi-head latent attention" (90);
  // the phrase elsewhere in its title (50). A synonym's concept counts nine tenths. Add the weight of the exact
  // term on the page (config key, value, tensor name), and 15 for the model being read (more than words in
  // running text add up to, less than a concept level).
  function level(entry, ph) {
    var key = words(ph).join(" ");
    var same = function (n) { return words(n).join(" ") === key; };
    if (entry.n.some(same)) return 100;
    // a parenthetical qualifier is not the title's head: "Sliding-window block (hash routing)" is a block, and
    // "hash routing" names the Hash router page before it
    var where = phraseIn(ph, entry.t.replace(/\s*\([^)]*\)/g, ""));
    if (entry.a.some(same) || where === 2) return 90;
    return where || phraseIn(ph, entry.t) ? 50 : 0;
  }

  // The query's readings through the synonyms: the whole query ("kv cache"), or a word of it, replaced by a
  // concept it names ("hash routing" -> "hash router").
  function readings(q) {
    var table = window.EXPLORER_SYNONYMS || {}, out = (own(table, q) || []).slice();
    var ws = q.split(" ");
    if (ws.length > 1) {
      ws.forEach(function (w, i) {
        (own(table, w) || []).forEach(function (ph) { out.push(ws.slice(0, i).concat([ph], ws.slice(i + 1)).join(" ")); });
      });
    }
    return out;
  }

  // A concept match (title, heading, key) ranks above any weight of words in the body: the concept level counts
  // a thousand times a body weight, so body text orders pages only within one level.
  function score(entry, q, alternatives) {
    var concept = level(entry, q);
    alternatives.forEach(function (ph) {
      concept = Math.max(concept, 0.9 * level(entry, ph));
    });
    var shorter = concept ? 0.01 * words(entry.t).length : 0;  // the shorter title names the thing more exactly
    var exact = weight(entry, q), terms = q.split(/\s+/);
    if (!exact && terms.length > 1 && terms.every(function (w) { return weight(entry, w) || phraseIn(w, entry.t); })) {
      exact = terms.reduce(function (a, w) { return a + weight(entry, w); }, 0) / terms.length;
    }
    // the model being read counts 15 at the level where the page matched: among concept matches it is 15 concept
    // points (its own latent attention before another model's KV cache figure), among body matches 15 of weight
    var ours = model && entry.u.indexOf("models/" + model + "/") === 0 ? 15 : 0;
    if (concept) return 1000 * (concept + ours) + exact - shorter;
    return exact ? exact + ours : 0;
  }

  function render() {
    var q = input.value.trim().toLowerCase();
    list.innerHTML = "";
    if (!q || !window.EXPLORER_SEARCH) return;
    q = q.replace(/\s+/g, " ");
    var alternatives = readings(q);
    var found = window.EXPLORER_SEARCH.map(function (e, i) { return [score(e, q, alternatives), i, e]; })
      .filter(function (p) { return p[0] > 0; })
      .sort(function (a, b) { return b[0] - a[0] || a[1] - b[1]; });
    var hits = all ? found : found.slice(0, SHOWN);
    if (!hits.length) {
      var none = document.createElement("li");
      none.className = "none";
      none.textContent = "No component matches “" + input.value.trim() + "”.";
      list.appendChild(none);
      return;
    }
    hits.forEach(function (p) {
      var e = p[2], li = document.createElement("li"), a = document.createElement("a");
      a.href = root + e.u;
      a.textContent = e.t;
      var where = document.createElement("span");
      where.textContent = e.m + (e.p ? " › " + e.p : "");
      a.appendChild(where);
      li.appendChild(a);
      list.appendChild(li);
    });
    if (hits.length < found.length) {
      var more = document.createElement("li"), button = document.createElement("button");
      button.type = "button";
      button.className = "more";
      button.textContent = "Show all " + found.length + " results";
      button.addEventListener("click", function () {
        all = true;
        render();
        var next = list.querySelectorAll("a")[SHOWN];
        if (next) next.focus();
      });
      more.appendChild(button);
      list.appendChild(more);
    }
  }

  input.addEventListener("focus", function () { load(render); });
  input.addEventListener("input", function () { all = false; load(render); });
  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var first = list.querySelector("a");
    if (first) window.location.href = first.href;
  });
  form.addEventListener("keydown", function (ev) {
    var links = Array.prototype.slice.call(list.querySelectorAll("a"));
    var i = links.indexOf(document.activeElement);
    if (ev.key === "ArrowDown" && links.length) { ev.preventDefault(); links[Math.min(i + 1, links.length - 1)].focus(); }
    if (ev.key === "ArrowUp" && links.length) { ev.preventDefault(); (i <= 0 ? input : links[i - 1]).focus(); }
    if (ev.key === "Escape") { input.value = ""; render(); input.focus(); }
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "/" && document.activeElement !== input && !ev.ctrlKey && !ev.metaKey) { ev.preventDefault(); input.focus(); }
  });
})();
