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
  // As explorer/figures/engines/llama_cpp.py: llama.cpp's cells per layer, one padded stream per sequence (or one for
  // all, kv_unified), a sliding or chunked layer admitting its window(s) plus one micro-batch unless swa_full; V
  // widened to the widest layer's without flash attention; a recurrent kind's F32 rows, one per sequence.
  function pad(n) { return ceilDiv(n, B(d.ll.pad)) * B(d.ll.pad); }
  function cells(k, c, seqs, ll) {
    if (!cached(k)) return 0n;
    var streams = ll.unified ? 1n : seqs, per = pad(pad(c * seqs) / streams), cap = k.w || k.c;
    if (cap && !ll.swaFull) per = pad(min(per, B(cap) * (seqs / streams) + ll.ubatch));
    return per * streams;
  }
  function widestV() { var v = 0; d.kinds.forEach(function (k) { if (k.v > v) v = k.v; }); return B(v); }
  function cellElements(k, ll) { return ll.flash || !k.v ? B(k.p) : B(k.p) - B(k.v) + widestV(); }
  function llKind(k, c, seqs, ll) {
    if (!cached(k)) return B(k.n) * B(k.lr) * (seqs > 1n ? seqs : 1n) * B(d.ll.rb);
    return B(k.n) * cellElements(k, ll) * cells(k, c, seqs, ll) * B(d.ll.bytes);
  }
  function onOff(b) { return b ? "on" : "off"; }

  function evaluate(c, batch, kv, wname, ll, vs, gs) {
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
      var llTotal = 0n, llParts = [], states = false;
      d.kinds.forEach(function (k) {
        llTotal += llKind(k, c, batch, ll);
        if (!cached(k)) { states = true; llParts.push(k.n + " × " + fmt(B(k.lr)) + " × " + (batch > 1n ? batch : 1n) + " × " + d.ll.rb); }
        else llParts.push(k.n + " × " + fmt(cellElements(k, ll)) + " × " + fmt(cells(k, c, batch, ll)) + " × " + d.ll.bytes);
      });
      lines.push(["llama-cpp", "llama.cpp allocates: K and V at F16 in cells padded to " + d.ll.pad +
                  (states ? " and recurrent states at F32" : "") + " (" + batch + " × " + fmt(c) + " tokens, swa_full " +
                  onOff(ll.swaFull) + ", n_ubatch " + fmt(ll.ubatch) + ", flash_attn " + onOff(ll.flash) + ", kv_unified " +
                  onOff(ll.unified) + ")", llTotal, llParts.join(" + ")]);
    }
    var r = { lines: lines, half: half, w: w, c: c, batch: batch, kv: kv, wname: wname, ll: ll, vs: vs, gs: gs };
    r.lines = r.lines.concat(vllmLines(r), sglangLines(r));
    return r;
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
  function llamaCache(ll) {
    return function (c, n) { var t = 0n; d.kinds.forEach(function (k) { t += llKind(k, c, n, ll); }); return t; };
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
      var ll = llamaCache(r.ll);
      out.push(["fits-llama-context", "Longest context of one sequence in " + budget + ", llama.cpp's allocation", mc(ll),
                "largest C ≤ " + fmt(MAX) + " with " + fmt(w) + " + llama.cpp's allocation(C, 1) ≤ " + fmt(memory)]);
      out.push(["fits-llama-sequences", "Most sequences of " + fmt(c) + " tokens in " + budget + ", llama.cpp's allocation",
                ms(ll), "largest n_seq with " + fmt(w) + " + llama.cpp's allocation(" + fmt(c) + ", n_seq) ≤ " + fmt(memory)]);
    }
    return out;
  }
  // As explorer/figures/engines/rule.py's ratio_text: 800 -> "0.8".
  function ratioText(m) {
    var t = (m / 1000n).toString() + "." + (m % 1000n).toString().padStart(3, "0");
    return t.replace(/0+$/, "").replace(/\.$/, "");
  }
  // As explorer/figures/engines/vllm.py: pages per layer kind, the hybrid block, unified pages and layer groups.
  var FULL = "full attention", SLIDING = "sliding window", CHUNKED = "chunked local attention", STATE = "recurrent state";
  function isState(k) { return B(k.sv) > 0n; }
  // Sparse attention's MLA at FP8 takes the fp8_ds_mla layout (explorer/figures/engines/rule.py's sparse_mla_fp8).
  function dsFp8(k, half) { return k.ix > 0 && half === 2n && k.p - k.ix === d.vl.dsw; }
  function tokBytes(k, half) { return dsFp8(k, half) ? B(d.vl.ds) : (B(k.p) - B(k.ix)) * half / 2n; }
  function ixBytes(k, q) { return B(k.ix) + B(k.ix) / B(q) * 4n; }
  function vlAttention(half) { var a = []; d.kinds.forEach(function (k) { if (!isState(k)) a.push(tokBytes(k, half)); }); return a; }
  function vlBlock(half, vs) {
    var states = [], att = vlAttention(half);
    d.kinds.forEach(function (k) { if (isState(k)) states.push(B(k.sv)); });
    if (!states.length || !att.length) return vs.bs;
    var al = vs.bs > B(d.vl.al) ? vs.bs : B(d.vl.al), top = states.reduce(function (x, y) { return x > y ? x : y; });
    var grown = al * ceilDiv(top, al * att[0]);
    return grown > vs.bs ? grown : vs.bs;
  }
  function vlLayout(half, vs) {
    var block = vlBlock(half, vs), att = vlAttention(half), specs = [];
    var padded = att.length ? block * att[0] : 0n;
    function add(cls, n, page, b, span) {
      var hit = null;
      specs.forEach(function (x) { if (x.cls === cls && x.page === page && x.block === b && x.span === span) hit = x; });
      if (hit) hit.layers += n; else specs.push({ cls: cls, layers: n, page: page, block: b, span: span });
    }
    d.kinds.forEach(function (k) {
      var n = B(k.n);
      if (isState(k)) { add(STATE, n, padded > B(k.sv) ? padded : B(k.sv), 1n, 0n); return; }
      add(k.w ? SLIDING : k.c ? CHUNKED : FULL, n, block * tokBytes(k, half), block, B(k.w || k.c));
      if (k.ix) add(FULL, n, block * ixBytes(k, d.vl.iq), block, 0n);
    });
    var kinds = {};
    specs.forEach(function (x) { kinds[x.cls + "|" + x.span] = 1; });
    if (Object.keys(kinds).length === 1) return { specs: specs, gs: 0n, block: block };
    var largest = 0n, fewest = null, most = 0n;
    specs.forEach(function (x) { if (x.page > largest) largest = x.page; });
    specs = specs.map(function (x) {
      return { cls: x.cls, layers: x.layers, page: largest, block: x.cls === STATE ? x.block : x.block * (largest / x.page),
               span: x.span };
    });
    specs.forEach(function (x) { if (fewest === null || x.layers < fewest) fewest = x.layers; if (x.layers > most) most = x.layers; });
    return { specs: specs, gs: 2n * most < 3n * fewest ? most : fewest, block: block };
  }
  function vlPages(x, c, vs) {
    if (x.cls === STATE) return 1n;
    if (x.cls === SLIDING) return ceilDiv(min(x.span - 1n + vs.mnbt, c), x.block) + 1n;
    if (x.cls === CHUNKED) return ceilDiv(min(x.span + vs.mnbt, c), x.block);
    return ceilDiv(c, x.block);
  }
  function vlSlots(lay, x) { return lay.gs === 0n ? x.layers : ceilDiv(x.layers, lay.gs) * lay.gs; }
  function vlBytes(lay, c, n, vs) {
    var t = 0n;
    lay.specs.forEach(function (x) { t += n * vlSlots(lay, x) * vlPages(x, c, vs) * x.page; });
    return t;
  }
  function vllmLines(r) {
    if (d.vl.why[r.kv]) return [];
    var vs = r.vs, lay = vlLayout(r.half, vs), parts = [], states = [], att = vlAttention(r.half);
    lay.specs.forEach(function (x) {
      parts.push(fmt(vlSlots(lay, x)) + " × " + fmt(vlPages(x, r.c, vs)) + " × " + fmt(x.page) + " × " + r.batch);
    });
    d.kinds.forEach(function (k) { if (isState(k)) states.push(B(k.sv)); });
    var al = vs.bs > B(d.vl.al) ? vs.bs : B(d.vl.al);
    var eq = states.length && att.length
      ? "max(" + vs.bs + ", " + al + " × cdiv(" + fmt(states.reduce(function (x, y) { return x > y ? x : y; })) + ", " + al +
        " × " + fmt(att[0]) + "))"
      : "block_size " + vs.bs;
    return [["count-vllm-block", "vLLM's attention block, tokens (block_size, grown where a recurrent state page shares the pool)", lay.block, eq],
            ["vllm", "vLLM allocates: pages per layer (" + r.batch + " × " + fmt(r.c) + " tokens, block_size " + vs.bs +
             ", max_num_batched_tokens " + fmt(vs.mnbt) + ")", vlBytes(lay, r.c, r.batch, vs),
             parts.join(" + ") + " (layers × pages × page bytes × requests)"]];
  }

  // As explorer/figures/engines/sglang.py: cells per pool, the pools a budget gives, what they admit.
  function sgCells(half) {
    var c = { full: 0n, swa: 0n, window: 0n, state: 0n };
    d.kinds.forEach(function (k) {
      var n = B(k.n);
      if (!isState(k) && !k.w) c.full += n * (tokBytes(k, half) + ixBytes(k, d.sg.iq));
      if (k.w) { c.swa += n * B(k.p) * half / 2n; if (B(k.w) > c.window) c.window = B(k.w); }
      c.state += n * B(k.sv);
    });
    return c;
  }
  function sgPools(c, budget, gs) {
    var slots = 0n, requests = null, rest = budget;
    if (c.state) {
      var sb = budget * gs.mr / (1000n + gs.mr);
      slots = sb / c.state - 1n; if (slots < 0n) slots = 0n;
      rest = budget - (slots + 1n) * c.state;
      requests = slots / B(d.sg.spr);
    }
    if (rest < 0n) rest = 0n;
    if (!c.swa) return { full: c.full ? rest / c.full : 0n, swa: 0n, slots: slots, requests: requests };
    var full = c.full ? rest * 1000n / (1000n * c.full + gs.sr * c.swa) : rest / c.swa;
    return { full: c.full ? full : 0n, swa: c.full ? full * gs.sr / 1000n : full, slots: slots, requests: requests };
  }
  function sgAdmits(c, p, ctx, n) {
    if (c.full && p.full < ctx * n) return false;
    if (c.swa && p.swa < n * (min(ctx, c.window) + B(d.sg.pg))) return false;
    return p.requests === null || p.requests >= n;
  }
  function sgNeed(c, ctx, n, gs) {
    var hi = 1n;
    while (!sgAdmits(c, sgPools(c, hi, gs), ctx, n)) hi *= 2n;
    var lo = hi / 2n;
    while (lo < hi - 1n) { var mid = (lo + hi) / 2n; if (sgAdmits(c, sgPools(c, mid, gs), ctx, n)) hi = mid; else lo = mid; }
    return hi;
  }
  function sgEquation(c, p, budget) {
    var parts = [];
    if (c.full) parts.push(fmt(p.full) + " full cells × " + fmt(c.full));
    if (c.swa) parts.push(fmt(p.swa) + " sliding cells × " + fmt(c.swa));
    if (c.state) parts.push(fmt(p.slots + 1n) + " state slots × " + fmt(c.state));
    return parts.join(" + ") + " ≤ " + fmt(budget);
  }
  function sglangLines(r) {
    if (d.sg.why[r.kv]) return [];
    var c = sgCells(r.half), need = sgNeed(c, r.c, r.batch, r.gs);
    return [["sglang", "SGLang: the smallest KV budget whose pools admit " + r.batch + " × " + fmt(r.c) +
             " tokens (swa_full_tokens_ratio " + ratioText(r.gs.sr) + ", mamba_full_memory_ratio " + ratioText(r.gs.mr) +
             ")", need, sgEquation(c, sgPools(c, need, r.gs), need)]];
  }
  function engineFitLines(r, gb) {
    var memory = gb * B(d.gb), w = r.w, budget = fmt(gb) + " GB", c = r.c, out = [];
    if (!d.vl.why[r.kv]) {
      var vs = r.vs, usable = memory * vs.ut / 1000n, lay = vlLayout(r.half, vs);
      var cap = function (a) { return fmt(w) + " + vLLM's pages(" + a + ") ≤ " + fmt(memory) + " × " + vs.ut + " / 1000 = " + fmt(usable); };
      out.push(["fits-vllm-context", "Longest context of one sequence in " + budget + ", vLLM's pages",
                largest(function (x) { return w + vlBytes(lay, x, 1n, vs) <= usable; }, MAX),
                "largest C ≤ " + fmt(MAX) + " with " + cap("C, 1")]);
      out.push(["fits-vllm-sequences", "Most sequences of " + fmt(c) + " tokens in " + budget + ", vLLM's pages",
                largest(function (n) { return w + vlBytes(lay, c, n, vs) <= usable; }, memory > 1n ? memory : 1n),
                "largest B with " + cap(fmt(c) + ", B")]);
    }
    if (!d.sg.why[r.kv]) {
      var cs = sgCells(r.half), rest = memory > w ? memory - w : 0n, p = sgPools(cs, rest, r.gs);
      var split = "pools of " + fmt(memory) + " − " + fmt(w) + ": " + sgEquation(cs, p, rest);
      out.push(["count-sglang-full", "SGLang's full-pool tokens in " + budget + " less the weights", p.full, split]);
      if (cs.swa) out.push(["count-sglang-swa", "SGLang's sliding-pool tokens in " + budget + " less the weights (" +
                            ratioText(r.gs.sr) + " of the full pool's)", p.swa, "⌊" + fmt(p.full) + " × " + r.gs.sr + " / 1000⌋"]);
      if (cs.state) out.push(["count-sglang-requests", "SGLang's requests the state slots allow in " + budget + " (slots ÷ " +
                              d.sg.spr + ")", p.requests || 0n, "⌊" + fmt(p.slots) + " / " + d.sg.spr + "⌋"]);
      var top = p.full + p.swa > 1n ? p.full + p.swa : 1n;
      out.push(["fits-sglang-context", "Longest context of one sequence in " + budget + ", SGLang's pools",
                largest(function (x) { return sgAdmits(cs, p, x, 1n); }, MAX), "largest C ≤ " + fmt(MAX) + " the pools admit"]);
      out.push(["fits-sglang-sequences", "Most sequences of " + fmt(c) + " tokens in " + budget + ", SGLang's pools",
                largest(function (n) { return sgAdmits(cs, p, c, n); }, top), "largest B the pools admit at " + fmt(c) + " tokens"]);
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
  // An engine setting as evaluated (as the engines' `clamped`): a whole number of at least one, its default when
  // empty; a ratio typed as a decimal ("0.9"), read in thousandths as explorer/figures/engines/rule.py's milli.
  function atLeastOne(v, dflt) { return v === null ? B(dflt) : v < 1n ? 1n : v; }
  function milliOf(input, dflt) {
    var v = Number(String(input.value).replace(/[,_\s]/g, ""));
    return input.value !== "" && Number.isFinite(v) && Math.abs(v) <= 1e12 ? B(Math.floor(v * 1000 + 0.5)) : B(dflt);
  }
  function within(v, top) { return v < 1n ? 1n : top && v > top ? top : v; }

  function row(line) {
    var tr = document.createElement("tr"), flops = line[0].indexOf("decode") === 0 || line[0] === "prefill" ||
      line[0].indexOf("fits") === 0 || line[0].indexOf("bound") === 0 || line[0].indexOf("count") === 0;
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
    var vs = { bs: atLeastOne(whole(form.elements.vblock), d.vl.bs), mnbt: atLeastOne(whole(form.elements.vmnbt), d.vl.mnbt),
               ut: within(milliOf(form.elements.vutil, d.vl.ut), 1000n) };
    var gs = { sr: within(milliOf(form.elements.sswa, d.sg.sr), 1000n), mr: within(milliOf(form.elements.smamba, d.sg.mr), 0n) };
    var ll = { ubatch: ub === null ? B(d.ll.ubatch) : ub < 1n ? 1n : ub, swaFull: form.elements.swafull.checked,
               flash: form.elements.flashattn.checked, unified: form.elements.kvunified.checked };
    var r = evaluate(c, batch, form.elements.kv.value, form.elements.weights.value, ll, vs, gs);
    var g = whole(form.elements.gpu), preset = null;
    d.gpus.forEach(function (x) { if (x[0] === form.elements.preset.value) preset = x; });
    if ((g === null || g < 1n) && preset) g = B(preset[1]) / B(d.gb);
    if (g !== null && g >= 1n) r.lines = r.lines.concat(fitLines(r, g), engineFitLines(r, g));
    if (preset) {
      var pre = 0n;
      r.lines.forEach(function (l) { if (l[0] === "prefill") pre = l[2]; });
      r.lines = r.lines.concat(boundLines(r, preset, pre));
    }
    var body = out.tBodies[0];
    while (body.firstChild) body.removeChild(body.firstChild);
    r.lines.forEach(function (line) { body.appendChild(row(line)); });
    if (g === null || g < 1n) fitsOut.textContent = "Give a GPU memory size to see how many tokens fit.";
    else {
      var f = fits(batch, r.half, r.w, g * B(d.gb));
      fitsOut.textContent = f === 0n
        ? "Nothing fits in " + fmt(g) + " GB: the weights and fixed state alone exceed it."
        : fmt(f) + " tokens per sequence" + (f === MAX ? " (the maximum context)" : "") + " fit in " + fmt(g) +
          " GB for " + fmt(batch) + " sequence(s).";
    }
    shown = { r: r, gb: g !== null && g >= 1n ? g : null, preset: preset ? preset[0] : "" };
  }

  // "Save plan": the inputs as evaluated and every figure shown, as a JSON file the browser downloads (exact integers
  // as strings: JavaScript's numbers are not exact past 2^53).
  var shown = null;
  function plan() {
    var r = shown.r;
    return {
      page: document.title,
      inputs: { context: r.c.toString(), batch: r.batch.toString(), kv_cache_dtype: r.kv, weights: r.wname,
                gpu: shown.preset, gpu_memory_gb: shown.gb === null ? null : shown.gb.toString(),
                llama_cpp: { n_ubatch: r.ll.ubatch.toString(), swa_full: r.ll.swaFull, flash_attn: r.ll.flash,
                             kv_unified: r.ll.unified },
                vllm: { block_size: r.vs.bs.toString(), max_num_batched_tokens: r.vs.mnbt.toString(),
                        gpu_memory_utilization: ratioText(r.vs.ut) },
                sglang: { swa_full_tokens_ratio: ratioText(r.gs.sr), mamba_full_memory_ratio: ratioText(r.gs.mr) } },
      figures: r.lines.map(function (l) { return { key: l[0], label: l[1], value: l[2].toString(), equation: l[3] }; }),
      fits: fitsOut.textContent, note: noteOut.textContent
    };
  }
  var save = document.getElementById("calc-save");
  if (save) {
    save.hidden = false;
    save.addEventListener("click", function () {
      var blob = new Blob([JSON.stringify(plan(), null, 1)], { type: "application/json" });
      var a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = "memory-plan.json";
      document.body.appendChild(a);
      a.click();
      document.body.removeChild(a);
      setTimeout(function () { URL.revokeObjectURL(a.href); }, 0);
    });
  }

  form.hidden = false;
  out.hidden = false;
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  form.addEventListener("submit", function (e) { e.preventDefault(); update(); });
  update();
})();
