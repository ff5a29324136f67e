// The serving calculator: no dependencies, no network, works from file://. It evaluates the layer kinds the build
// wrote into the page (explorer/calculator.py's page_data) with the same integer arithmetic as
// explorer/calculator.py's evaluate (BigInt: exact past 2^53); the page is complete without it (the table at fixed
// contexts stays).
(function () {
  "use strict";
  var form = document.querySelector("form.calc");
  var node = document.getElementById("calc-data");
  if (!form || !node) return;
  var d = JSON.parse(node.textContent);
  var out = document.querySelector("table.calc-out");
  var fitsOut = document.getElementById("calc-fits");
  var noteOut = document.getElementById("calc-note");
  var B = BigInt, MAX = B(d.max), BLOCK = B(d.block);

  function fmt(n) { return n.toString().replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  // As explorer/calculator.py's size: the largest decimal unit the bytes fill once, two decimals truncated.
  function size(n) {
    var p = 0, scale = 1n;
    while (p + 1 < d.units.length && n >= scale * 1000n) { p += 1; scale *= 1000n; }
    if (p === 0) return fmt(n) + " bytes";
    var h = n * 100n / scale;
    return fmt(h / 100n) + "." + (h % 100n).toString().padStart(2, "0") + " " + d.units[p];
  }
  function min(a, b) { return a < b ? a : b; }
  function ceilDiv(a, b) { return (a + b - 1n) / b; }

  // As explorer/components/serving.py's LayerKind.
  function cached(k) { return k.p > 0 || k.e > 0; }
  function entries(k, c) { return cached(k) ? min(c, B(k.w || k.c) || c) / B(k.r) : 0n; }
  function keysRead(k, c) {
    if (k.c) return (c - 1n) % B(k.c) + 1n;
    var e = entries(k, c);
    return k.k ? min(e, B(k.k)) : e;
  }
  function triangle(c, cap) {
    if (!cap || cap >= c) return c * (c + 1n) / 2n;
    return cap * (cap + 1n) / 2n + (c - cap) * cap;
  }
  function pooledTo(n, r) { var q = n / r, rest = n % r; return r * q * (q - 1n) / 2n + q * (rest + 1n); }
  function pooled(c, r, cap) {
    if (!cap || c < cap * r) return pooledTo(c, r);
    return pooledTo(cap * r - 1n, r) + cap * (c - cap * r + 1n);
  }
  function readPrefill(k, c) {
    if (!cached(k)) return 0n;
    if (k.c) { var ch = B(k.c), full = c / ch, rest = c % ch; return full * ch * (ch + 1n) / 2n + rest * (rest + 1n) / 2n; }
    if (k.r === 1) return triangle(c, k.w ? B(k.w) : k.k ? B(k.k) : 0n);
    return pooled(c, B(k.r), k.k ? B(k.k) : 0n);
  }
  function scoredPrefill(k, c) { return k.r === 1 ? triangle(c, k.w ? B(k.w) : 0n) : pooled(c, B(k.r), 0n); }
  function bytes(elements, half) { return ceilDiv(elements * half, 2n); }
  function buffered(k, c) {
    if (k.r === 1) return 0n;
    return B(k.b) * (c % B(k.r)) + (c >= B(k.r) ? B(k.o) : 0n);
  }
  function kindBytes(k, c, batch, half, block) {
    if (!cached(k)) return B(k.n) * B(k.s) * batch;
    var e = ceilDiv(entries(k, c), block) * block;
    return bytes(B(k.n) * (B(k.e) * e + buffered(k, c)) * batch, half);
  }
  function layers(n) { return n + (n === 1 ? " layer" : " layers"); }
  var SIZE = { 4: "2 bytes", 2: "1 byte", 1: "0.5 byte" };

  // As explorer/calculator.py's evaluate: the same lines, labels and equations.
  // As explorer/figures/engines.py: llama.cpp's cells per layer, one padded stream per sequence, a sliding or chunked
  // layer admitting its window plus one micro-batch in each stream unless swa_full.
  function pad(n) { return ceilDiv(n, B(d.ll.pad)) * B(d.ll.pad); }
  function cells(k, c, seqs, ubatch, swaFull) {
    var perSeq = pad(pad(c * seqs) / seqs), cap = k.w || k.c;
    if (cap && !swaFull) perSeq = pad(min(perSeq, B(cap) + ubatch));
    return perSeq * seqs;
  }

  function evaluate(c, batch, kv, wname, ubatch, swaFull) {
    var half = 0n, w = 0n, i;
    d.kv.forEach(function (x) { if (x[0] === kv) half = B(x[1]); });
    d.weights.forEach(function (x) { if (x[0] === wname) w = B(x[1]); });
    var lines = [["weights", "Weights (" + wname + ")", w, fmt(w) + " bytes"]];
    var cache = 0n, engine = 0n, perToken = 0n, fixed = 0n, state = 0n, dec = [], abs = [], pre = [], parts = [];
    var mla = false;
    d.kinds.forEach(function (k, i) {
      var v = kindBytes(k, c, batch, half, 1n), n = B(k.n), buf = buffered(k, c);
      cache += v; parts.push(fmt(v));
      engine += kindBytes(k, c, batch, half, BLOCK);
      if (k.g) perToken += n * B(k.p);
      fixed += B(k.fx);
      if (!cached(k)) state += n * B(k.s);
      var held = fmt(B(k.e)) + " × " + fmt(entries(k, c));
      lines.push(cached(k)
        ? ["kind-" + i, k.t + " (" + layers(k.n) + ")", v,
           k.n + " × " + (buf ? "(" + held + " + " + fmt(buf) + " buffered)" : held) + " × " + SIZE[half] + " × " + batch]
        : ["kind-" + i, k.t + ": fixed state (" + layers(k.n) + ")", v, k.n + " × " + fmt(B(k.s)) + " × " + batch]);
      dec.push(n * (B(k.q) * keysRead(k, c) + B(k.x) * entries(k, c)));
      abs.push(n * (B(k.a || k.q) * keysRead(k, c) + B(k.x) * entries(k, c)));  // MLA's absorbed form, as decode_costs
      if (k.a) mla = true;
      pre.push(n * (B(k.q) * readPrefill(k, c) + B(k.x) * scoredPrefill(k, c)));
    });
    var m = B(d.matmul), sum = function (a) { return a.reduce(function (x, y) { return x + y; }, 0n); };
    lines.push(["per-token", "Cache growth per added token, all layers (" + kv + ")", bytes(perToken, half),
                fmt(perToken) + " elements × " + SIZE[half]]);
    lines.push(["fixed", "Fixed part per sequence once full: windows, chunks, buffers and states (" + kv + " cache)",
                bytes(fixed, half) + state, fmt(fixed) + " elements × " + SIZE[half] + " + " + fmt(state) +
                " bytes of state"]);
    lines.push(["cache", "Cache, all layer kinds (" + batch + " × " + fmt(c) + " tokens)", cache, parts.join(" + ") || "0"]);
    lines.push(["total", "Total: weights + cache", w + cache, fmt(w) + " + " + fmt(cache)]);
    lines.push(["engine", "Engine view: cache in blocks of " + d.block + " tokens per layer", engine,
                "each layer's cached entries rounded up to a multiple of " + d.block]);
    lines.push(["engine-total", "Engine view: weights + block-rounded cache", w + engine, fmt(w) + " + " + fmt(engine)]);
    lines.push(["decode", "FLOPs per token, decode at " + fmt(c) + " context" + (mla ? d.mla[0] : ""), 2n * m + sum(dec),
                "2 × " + fmt(m) + " + " + (dec.map(fmt).join(" + ") || "0")]);
    if (mla) {
      lines.push(["decode-absorbed", "FLOPs per token, decode at " + fmt(c) + " context" + d.mla[1], 2n * m + sum(abs),
                  "2 × " + fmt(m) + " + " + abs.map(fmt).join(" + ")]);
    }
    lines.push(["prefill", "FLOPs, prefill of " + fmt(c) + " tokens (one sequence)", c * 2n * m + sum(pre),
                fmt(c) + " × 2 × " + fmt(m) + " + " + (pre.map(fmt).join(" + ") || "0")]);
    if (!d.ll.why) {
      var ll = 0n, llParts = [];
      d.kinds.forEach(function (k) {
        var n = cells(k, c, batch, ubatch, swaFull);
        ll += B(k.n) * B(k.p) * n * B(d.ll.bytes);
        llParts.push(k.n + " × " + fmt(B(k.p)) + " × " + fmt(n) + " × " + d.ll.bytes);
      });
      lines.push(["llama-cpp", "llama.cpp allocates: K and V at F16 in cells padded to " + d.ll.pad + " (" + batch +
                  " × " + fmt(c) + " tokens, swa_full " + (swaFull ? "on" : "off") + ", n_ubatch " + fmt(ubatch) + ")",
                  ll, llParts.join(" + ")]);
    }
    return { lines: lines, half: half, w: w, c: c, batch: batch, kv: kv, wname: wname, ubatch: ubatch, swaFull: swaFull };
  }

  // As explorer/figures/fits.py and calculator.py's fit_lines, cache_read and bound_lines.
  function largest(ok, top) {
    var lo = 0n, hi = top;
    if (ok(hi)) return hi;
    while (lo < hi - 1n) { var mid = (lo + hi) / 2n; if (ok(mid)) lo = mid; else hi = mid; }
    return lo;
  }
  function theoryCache(half) {
    return function (c, n) { var t = 0n; d.kinds.forEach(function (k) { t += kindBytes(k, c, n, half, 1n); }); return t; };
  }
  function llamaCache(ubatch, swaFull) {
    return function (c, n) {
      var t = 0n;
      d.kinds.forEach(function (k) { t += B(k.n) * B(k.p) * cells(k, c, n, ubatch, swaFull) * B(d.ll.bytes); });
      return t;
    };
  }
  function fitLines(r, gb) {
    var memory = gb * B(d.gb), w = r.w, budget = fmt(gb) + " GB", c = r.c;
    var th = theoryCache(r.half), out = [];
    var mc = function (f) { return largest(function (x) { return w + f(x, 1n) <= memory; }, MAX); };
    var ms = function (f) { return largest(function (n) { return w + f(c, n) <= memory; }, memory > 1n ? memory : 1n); };
    out.push(["fits-context", "Longest context of one sequence in " + budget + ", theory (weights + cache only)", mc(th),
              "largest C ≤ " + fmt(MAX) + " with " + fmt(w) + " + cache(C, 1) ≤ " + fmt(memory)]);
    out.push(["fits-sequences", "Most sequences of " + fmt(c) + " tokens in " + budget + ", theory", ms(th),
              "largest B with " + fmt(w) + " + cache(" + fmt(c) + ", B) ≤ " + fmt(memory)]);
    if (!d.ll.why) {
      var ll = llamaCache(r.ubatch, r.swaFull);
      out.push(["fits-llama-context", "Longest context of one sequence in " + budget + ", llama.cpp's allocation", mc(ll),
                "largest C ≤ " + fmt(MAX) + " with " + fmt(w) + " + llama.cpp's K and V(C, 1) ≤ " + fmt(memory)]);
      out.push(["fits-llama-sequences", "Most sequences of " + fmt(c) + " tokens in " + budget + ", llama.cpp's allocation",
                ms(ll), "largest n_seq with " + fmt(w) + " + llama.cpp's K and V(" + fmt(c) + ", n_seq) ≤ " + fmt(memory)]);
    }
    return out;
  }
  function cacheRead(c, half) {
    var t = 0n;
    d.kinds.forEach(function (k) {
      t += cached(k) ? bytes(B(k.n) * B(k.e) * keysRead(k, c), half) : B(k.n) * B(k.s);
    });
    return t;
  }
  function peakOf(g, dtype) {
    while (!(dtype in g[3])) { if (!(dtype in d.wd)) return null; dtype = d.wd[dtype]; }
    return [dtype, B(g[3][dtype])];
  }
  function boundLines(r, g, prefill) {
    var read = 0n, bw = B(g[2]), c = r.c, batch = r.batch;
    d.rd.forEach(function (x) { if (x[0] === r.wname) read = B(x[1]); });
    var cache = cacheRead(c, r.half), bws = fmt(bw) + " bytes/s", out = [];
    out.push(["bound-decode", "Bound: decode tokens/s of one sequence at " + fmt(c) + " context on " + g[0] + " (at most)",
              bw / (read + cache), bws + " ÷ (" + fmt(read) + " weights read + " + fmt(cache) + " cache read) bytes"]);
    out.push(["bound-aggregate", "Bound: decode tokens/s of " + fmt(batch) + " sequences together on " + g[0] + " (at most)",
              bw * batch / (read + batch * cache),
              fmt(batch) + " × " + bws + " ÷ (" + fmt(read) + " + " + fmt(batch) + " × " + fmt(cache) + ") bytes"]);
    var dtype = r.wname === "as stored" ? d.sc : (d.cd[r.wname] || "FP4"), pk = peakOf(g, dtype);
    if (pk) {
      out.push(["bound-prefill", "Bound: prefill of " + fmt(c) + " tokens on " + g[0] + ", microseconds (at least, " +
                pk[0] + " dense peak)", ceilDiv(prefill * 1000000n, pk[1]),
                fmt(prefill) + " FLOPs × 10⁶ ÷ " + fmt(pk[1]) + " FLOP/s"]);
    }
    return out;
  }

  function fits(batch, half, w, memory) {
    function ok(c) { var t = w; d.kinds.forEach(function (k) { t += kindBytes(k, c, batch, half, 1n); }); return t <= memory; }
    var lo = 0n, hi = MAX;
    if (ok(hi)) return hi;
    while (lo < hi - 1n) { var mid = (lo + hi) / 2n; if (ok(mid)) lo = mid; else hi = mid; }
    return lo;
  }

  // A whole number as the reader typed it: "100000", "100,000" or "1e5" (Number reads exponents, parseInt stops at
  // the "e"); null when it is none.
  function whole(input) {
    var v = Number(String(input.value).replace(/[,_\s]/g, ""));
    return input.value !== "" && Number.isFinite(v) && Math.abs(v) <= 1e18 ? B(Math.floor(v)) : null;
  }
  // As explorer/calculator.py's clamp_note.
  function clampNote(c, batch) {
    var notes = [];
    if (c > MAX) notes.push("Context " + fmt(c) + " is beyond this model's maximum: evaluated at " + fmt(MAX) + " tokens.");
    else if (c < 1n) notes.push("Context " + fmt(c) + " is below one token: evaluated at 1.");
    if (batch < 1n) notes.push("Batch " + fmt(batch) + " is below one sequence: evaluated at 1.");
    return notes.join(" ");
  }
  function clamp(v, top) { return v < 1n ? 1n : top && v > top ? top : v; }

  function row(line) {
    var tr = document.createElement("tr"), flops = line[0].indexOf("decode") === 0 || line[0] === "prefill" ||
      line[0].indexOf("fits") === 0 || line[0].indexOf("bound") === 0;
    tr.setAttribute("data-key", line[0]);
    var cells = [["th", line[1]], ["td", fmt(line[2])], ["td", flops ? "" : size(line[2])], ["td", line[3]]];
    cells.forEach(function (c, i) {
      var el = document.createElement(c[0]);
      if (i === 0) el.setAttribute("scope", "row");
      if (i === 1) el.className = "num";
      if (i === 3) { var code = document.createElement("code"); code.textContent = c[1]; el.appendChild(code); }
      else el.textContent = c[1];
      tr.appendChild(el);
    });
    return tr;
  }

  function update() {
    var rawC = whole(form.elements.context), rawB = whole(form.elements.batch);
    if (rawC === null) rawC = 1n;
    if (rawB === null) rawB = 1n;
    noteOut.textContent = clampNote(rawC, rawB);
    noteOut.hidden = !noteOut.textContent;
    var c = clamp(rawC, MAX), batch = clamp(rawB, 0n);
    var ub = whole(form.elements.ubatch);
    var r = evaluate(c, batch, form.elements.kv.value, form.elements.weights.value, ub === null ? B(d.ll.ubatch) : ub < 1n ? 1n : ub,
                     form.elements.swafull.checked);
    var g = whole(form.elements.gpu), preset = null;
    d.gpus.forEach(function (x) { if (x[0] === form.elements.preset.value) preset = x; });
    if ((g === null || g < 1n) && preset) g = B(preset[1]) / B(d.gb);
    if (g !== null && g >= 1n) r.lines = r.lines.concat(fitLines(r, g));
    if (preset) {
      var pre = 0n;
      r.lines.forEach(function (l) { if (l[0] === "prefill") pre = l[2]; });
      r.lines = r.lines.concat(boundLines(r, preset, pre));
    }
    var body = out.tBodies[0];
    while (body.firstChild) body.removeChild(body.firstChild);
    r.lines.forEach(function (line) { body.appendChild(row(line)); });
    if (g === null || g < 1n) { fitsOut.textContent = "Give a GPU memory size to see how many tokens fit."; return; }
    var f = fits(batch, r.half, r.w, g * B(d.gb));
    fitsOut.textContent = f === 0n
      ? "Nothing fits in " + fmt(g) + " GB: the weights and fixed state alone exceed it."
      : fmt(f) + " tokens per sequence" + (f === MAX ? " (the maximum context)" : "") + " fit in " + fmt(g) +
        " GB for " + fmt(batch) + " sequence(s).";
  }

  form.hidden = false;
  out.hidden = false;
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  form.addEventListener("submit", function (e) { e.preventDefault(); update(); });
  update();
})();
