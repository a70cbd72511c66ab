"use strict";
// The attention explorer. Data lives in <script> blocks written by inspection/explorer.py: the metadata as
// JSON, thumbnails and one block per head as base64 zlib streams (see explorer.py for the format).
(() => {
  const meta = JSON.parse(document.getElementById("explorer-meta").textContent);
  const L = meta.n_layer, H = meta.n_head, T = meta.n_tokens, S = meta.thumb;
  const LUT = meta.colours; // 256 x [r, g, b], the same ramp as the PNG grids
  const MASKED = [236, 236, 240]; // keys after the query: not attended (causal mask)
  const MAP_PIXELS = 560; // target side of the full map; whole pixels per token
  const state = { layer: 0, head: 0, pinned: null, hover: null, scale: "prob", topk: 3, sort: null };
  const heads = new Map(); // head index -> Promise<{rowMax, tri}>
  const $ = (id) => document.getElementById(id);
  const formedAt = new Map(meta.formations.map((f) => [f.layer * H + f.head, f]));

  function fail(message) {
    const box = $("error");
    box.hidden = false;
    box.textContent = "The explorer could not draw: " + message;
  }
  window.addEventListener("error", (e) => fail(e.message));
  window.addEventListener("unhandledrejection", (e) => fail(String(e.reason)));

  function base64Bytes(text) {
    const binary = atob(text.trim());
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }

  // The row maxima are stored as IEEE half floats (little-endian), half the bytes of float32.
  function float16(bits) {
    const exponent = (bits >> 10) & 0x1f, fraction = bits & 0x3ff, sign = bits & 0x8000 ? -1 : 1;
    if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
    if (exponent === 31) return fraction ? NaN : sign * Infinity;
    return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
  }

  async function inflate(id) {
    const bytes = base64Bytes(document.getElementById(id).textContent);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  function headData(index) {
    if (!heads.has(index)) {
      heads.set(index, inflate("explorer-head-" + index).then((bytes) => ({
        rowMax: Float32Array.from(new Uint16Array(bytes.buffer, 0, T), float16),
        tri: bytes.subarray(2 * T),
      })));
    }
    return heads.get(index);
  }

  const rowStart = (i) => (i * (i + 1)) / 2;
  // Colour level 0..255 of weight (i, j), j <= i: relative to the row's largest, or the probability itself.
  function level(data, i, j) {
    const q = data.tri[rowStart(i) + j];
    return state.scale === "row" ? q : Math.round(q * data.rowMax[i]);
  }
  const weight = (data, i, j) => (j > i ? 0 : (data.tri[rowStart(i) + j] / 255) * data.rowMax[i]);

  // Keys of query i ordered by weight, strongest first; ties go to the earlier key.
  function topKeys(data, i, k) {
    const keys = Array.from({ length: i + 1 }, (_, j) => j);
    const base = rowStart(i);
    keys.sort((a, b) => data.tri[base + b] - data.tri[base + a] || a - b);
    return keys.slice(0, k);
  }

  function putPixels(ctx, width, height, colourAt) {
    const image = ctx.createImageData(width, height);
    const px = image.data;
    for (let y = 0, o = 0; y < height; y++) {
      for (let x = 0; x < width; x++, o += 4) {
        const c = colourAt(y, x);
        px[o] = c[0]; px[o + 1] = c[1]; px[o + 2] = c[2]; px[o + 3] = 255;
      }
    }
    ctx.putImageData(image, 0, 0);
  }

  // ---- colour bar and header ----
  function drawColourBar() {
    const canvas = $("colourbar");
    putPixels(canvas.getContext("2d"), canvas.width, canvas.height,
      (y, x) => LUT[Math.round((x / (canvas.width - 1)) * 255)]);
  }

  // ---- thumbnails: the layer x head grid ----
  let thumbs = null;
  function buildGrid() {
    const grid = $("grid");
    grid.style.gridTemplateColumns = `auto repeat(${H}, auto)`;
    grid.append(Object.assign(document.createElement("span"), { className: "axis" }));
    for (let h = 0; h < H; h++) {
      grid.append(Object.assign(document.createElement("span"), { className: "axis", textContent: "H" + h }));
    }
    for (let l = 0; l < L; l++) {
      grid.append(Object.assign(document.createElement("span"), { className: "axis", textContent: "L" + l }));
      for (let h = 0; h < H; h++) {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "thumb";
        button.dataset.layer = l;
        button.dataset.head = h;
        const f = formedAt.get(l * H + h);
        button.title = `layer ${l}, head ${h}` + (f ? ` · induction head formed at step ${f.step}` : "");
        if (f) button.classList.add("formed");
        const canvas = document.createElement("canvas");
        canvas.width = canvas.height = S;
        button.append(canvas);
        button.addEventListener("click", () => select(l, h));
        grid.append(button);
      }
    }
  }

  function drawThumbs() {
    const edges = Array.from({ length: S + 1 }, (_, k) => (k === S ? T : Math.floor((k * T) / S)));
    const offset = state.scale === "row" ? L * H * S * S : 0;
    for (const button of document.querySelectorAll(".thumb")) {
      const index = Number(button.dataset.layer) * H + Number(button.dataset.head);
      const base = offset + index * S * S;
      const canvas = button.firstChild;
      putPixels(canvas.getContext("2d"), S, S, (y, x) =>
        edges[x] > edges[y + 1] - 1 ? MASKED : LUT[thumbs[base + y * S + x]]);
    }
  }

  // ---- the full map of the selected head ----
  const map = $("map"), overlay = $("map-overlay");
  const geometry = { cell: 1, margin: 0 };
  function measureMap() {
    const cell = Math.max(1, Math.floor(MAP_PIXELS / T));
    let margin = 0;
    if (cell >= 9) {
      const ctx = map.getContext("2d");
      ctx.font = "10px ui-monospace, monospace";
      margin = Math.min(110, 6 + Math.max(...meta.labels.map((s) => ctx.measureText(s).width)));
    }
    geometry.cell = cell;
    geometry.margin = Math.ceil(margin);
    const side = geometry.margin + T * cell;
    for (const canvas of [map, overlay]) { canvas.width = side; canvas.height = side; }
  }

  async function drawMap() {
    const { layer, head } = state;
    const data = await headData(layer * H + head);
    if (layer !== state.layer || head !== state.head) return; // another head was chosen meanwhile
    const { cell, margin } = geometry;
    const ctx = map.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, map.width, map.height);
    const tile = document.createElement("canvas");
    tile.width = tile.height = T;
    putPixels(tile.getContext("2d"), T, T, (i, j) => (j > i ? MASKED : LUT[level(data, i, j)]));
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(tile, margin, margin, T * cell, T * cell);
    if (margin) drawLabels(ctx);
    Object.assign(map.dataset, { layer, head, scale: state.scale, cell, margin });
    drawOverlay();
  }

  function drawLabels(ctx) {
    const { cell, margin } = geometry;
    ctx.fillStyle = "#333";
    ctx.font = "10px ui-monospace, monospace";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    meta.labels.forEach((label, i) => ctx.fillText(label, margin - 4, margin + (i + 0.5) * cell, margin - 6));
    ctx.save();
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    meta.labels.forEach((label, j) => ctx.fillText(label, -margin + 4, margin + (j + 0.5) * cell, margin - 6));
    ctx.restore();
  }

  function drawOverlay() {
    const ctx = overlay.getContext("2d");
    ctx.clearRect(0, 0, overlay.width, overlay.height);
    const i = query();
    const { cell, margin } = geometry;
    ctx.strokeStyle = "#1f77b4";
    ctx.lineWidth = Math.max(1, Math.min(2, cell / 4));
    ctx.strokeRect(margin + 0.5, margin + i * cell + 0.5, (i + 1) * cell - 1, Math.max(cell - 1, 1));
  }

  // ---- the text, shaded by the query's attention ----
  const query = () => (state.hover ?? state.pinned ?? T - 1);
  function buildText() {
    const box = $("text");
    meta.tokens.forEach((token, i) => {
      const span = document.createElement("span");
      span.textContent = token;
      span.dataset.i = i;
      const generated = meta.prompt_len != null && i >= meta.prompt_len;
      span.title = `${i}: ${meta.labels[i]}` + (meta.prompt_len == null ? "" : generated ? " (generated)" : " (prompt)");
      if (meta.prompt_len != null) span.classList.add(generated ? "generated" : "prompt");
      if (token.includes("\n")) span.classList.add("nl");
      box.append(span);
    });
    box.addEventListener("mouseover", (e) => { if (e.target.dataset.i) setHover(Number(e.target.dataset.i)); });
    box.addEventListener("mouseleave", () => setHover(null));
    box.addEventListener("click", (e) => { if (e.target.dataset.i) pin(Number(e.target.dataset.i)); });
  }

  async function updateText() {
    const { layer, head } = state;
    const data = await headData(layer * H + head);
    if (layer !== state.layer || head !== state.head) return;
    const i = query();
    const top = new Set(topKeys(data, i, state.topk));
    const spans = $("text").children;
    const row = rowStart(i);
    for (let j = 0; j < T; j++) {
      const span = spans[j];
      const a = j <= i ? data.tri[row + j] / 255 : 0;
      span.style.backgroundColor = a > 0 ? `rgba(255, 127, 14, ${(0.85 * a).toFixed(3)})` : "";
      span.classList.toggle("future", j > i);
      span.classList.toggle("query", j === i);
      span.classList.toggle("top", top.has(j));
    }
    Object.assign($("text").dataset, { query: i, layer, head, topKeys: [...top].join(",") });
    const best = [...top].map((j) => `${meta.labels[j]} ${weight(data, i, j).toFixed(3)}`).join(" · ");
    $("readout").textContent = `query ${i} “${meta.labels[i]}” attends most to: ${best}`;
  }

  function setHover(i) { state.hover = i; drawOverlay(); updateText(); }
  function pin(i) { state.pinned = i === null ? null : Math.max(0, Math.min(T - 1, i)); state.hover = null; drawOverlay(); updateText(); }

  map.addEventListener("mousemove", async (e) => {
    const rect = map.getBoundingClientRect();
    const x = (e.clientX - rect.left) * (map.width / rect.width) - geometry.margin;
    const y = (e.clientY - rect.top) * (map.height / rect.height) - geometry.margin;
    const i = Math.floor(y / geometry.cell), j = Math.floor(x / geometry.cell);
    if (i < 0 || i >= T) return;
    if (state.hover !== i) setHover(i);
    if (j >= 0 && j < T) {
      const data = await headData(state.layer * H + state.head);
      $("readout").textContent = `query ${i} “${meta.labels[i]}” → key ${j} “${meta.labels[j]}”: ` +
        (j > i ? "masked (a later token)" : `p = ${weight(data, i, j).toFixed(4)}`);
    }
  });
  map.addEventListener("mouseleave", () => setHover(null));
  map.addEventListener("click", () => pin(state.hover));

  // ---- the selected head ----
  function statValue(name, l, h) { return meta.stats[name][l][h]; }
  function describeHead() {
    const { layer: l, head: h } = state;
    $("head-title").textContent = `Layer ${l}, head ${h}` + (meta.step != null ? ` · step ${meta.step}` : "");
    const parts = Object.entries(meta.statistics).map(([k, title]) => `${title} <b>${statValue(k, l, h).toFixed(3)}</b>`);
    const f = formedAt.get(l * H + h);
    if (f) parts.push(`<b>induction head formed at step ${f.step}</b>`);
    $("head-stats").innerHTML = parts.join(" · ");
    for (const b of document.querySelectorAll(".thumb")) {
      b.classList.toggle("selected", Number(b.dataset.layer) === l && Number(b.dataset.head) === h);
    }
    for (const tr of $("stats-table").tBodies[0].rows) {
      tr.classList.toggle("selected", Number(tr.dataset.layer) === l && Number(tr.dataset.head) === h);
    }
  }

  function select(l, h) {
    state.layer = Math.max(0, Math.min(L - 1, l));
    state.head = Math.max(0, Math.min(H - 1, h));
    describeHead();
    drawHistoryLine();
    return Promise.all([drawMap(), updateText()]);
  }

  // ---- statistics table ----
  function buildTable() {
    const columns = [["layer", "layer"], ["head", "head"], ...Object.entries(meta.statistics), ["formed", "induction head formed at step"]];
    const head = document.createElement("tr");
    for (const [key, title] of columns) {
      const th = document.createElement("th");
      th.textContent = title;
      th.dataset.key = key;
      th.tabIndex = 0;
      th.addEventListener("click", () => sortBy(key));
      th.addEventListener("keydown", (e) => { if (e.key === "Enter") sortBy(key); });
      head.append(th);
    }
    $("stats-table").tHead.append(head);
    for (const [key, title] of Object.entries(meta.statistics)) {
      head.querySelector(`th[data-key="${key}"]`).title = meta.meanings[key];
      const item = document.createElement("div");
      item.innerHTML = "<dt></dt><dd></dd>";
      item.querySelector("dt").textContent = title;
      item.querySelector("dd").textContent = meta.meanings[key];
      $("meanings").append(...item.children);
    }
    const maxima = Object.fromEntries(Object.keys(meta.statistics).map((k) => [k, Math.max(1e-12, ...meta.stats[k].flat())]));
    const body = $("stats-table").tBodies[0];
    for (let l = 0; l < L; l++) {
      for (let h = 0; h < H; h++) {
        const tr = document.createElement("tr");
        Object.assign(tr.dataset, { layer: l, head: h });
        const f = formedAt.get(l * H + h);
        const cells = [["layer", l], ["head", h], ...Object.keys(meta.statistics).map((k) => [k, statValue(k, l, h)]), ["formed", f ? f.step : null]];
        for (const [key, value] of cells) {
          const td = document.createElement("td");
          td.dataset.key = key;
          td.dataset.value = value ?? "";
          td.textContent = value == null ? "" : key in meta.statistics ? value.toFixed(3) : String(value);
          if (key in meta.statistics) { td.classList.add("bar"); td.style.setProperty("--w", `${(100 * Math.max(0, value)) / maxima[key]}%`); }
          tr.append(td);
        }
        tr.addEventListener("click", () => select(l, h));
        body.append(tr);
      }
    }
  }

  function sortBy(key) {
    const descending = state.sort && state.sort.key === key ? !state.sort.descending : !["layer", "head"].includes(key);
    state.sort = { key, descending };
    const body = $("stats-table").tBodies[0];
    const index = [...$("stats-table").tHead.rows[0].cells].findIndex((th) => th.dataset.key === key);
    const value = (tr) => { const v = tr.cells[index].dataset.value; return v === "" ? -Infinity : Number(v); };
    const rows = [...body.rows].sort((a, b) => (descending ? value(b) - value(a) : value(a) - value(b)));
    body.append(...rows);
    for (const th of $("stats-table").tHead.rows[0].cells) {
      if (th.dataset.key === key) th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    }
  }

  // ---- heads over training ----
  const history = meta.history;
  const historyStat = $("history-stat");
  function buildHistory() {
    if (history.length < 2) return;
    $("history-panel").hidden = false;
    for (const [key, title] of Object.entries(meta.statistics)) historyStat.append(new Option(title, key));
    historyStat.value = "induction";
    historyStat.addEventListener("change", () => { drawHistory(); drawHistoryLine(); });
    const canvas = $("history");
    canvas.addEventListener("mousemove", (e) => {
      const hit = historyCell(canvas, e);
      if (!hit) return;
      const v = history[hit.col].stats[historyStat.value][hit.l][hit.h];
      $("history-readout").textContent = `L${hit.l}H${hit.h} at step ${history[hit.col].step}: ${v.toFixed(3)}`;
    });
    canvas.addEventListener("click", (e) => { const hit = historyCell(canvas, e); if (hit) select(hit.l, hit.h); });
    drawHistory();
  }

  const historyGeometry = { left: 44, cw: 4, ch: 3 };
  function historyCell(canvas, e) {
    const rect = canvas.getBoundingClientRect();
    const { left, cw, ch } = historyGeometry;
    const col = Math.floor((e.clientX - rect.left - left) / cw), row = Math.floor((e.clientY - rect.top) / ch);
    if (col < 0 || col >= history.length || row < 0 || row >= L * H) return null;
    return { col, l: Math.floor(row / H), h: row % H };
  }

  function statRange(key) {
    const values = history.flatMap((x) => x.stats[key].flat());
    const lo = Math.min(...values), hi = Math.max(...values);
    return [lo, hi > lo ? hi : lo + 1];
  }

  function drawHistory() {
    if (history.length < 2) return;
    const key = historyStat.value;
    const rows = L * H, cols = history.length;
    const cw = Math.max(3, Math.min(24, Math.floor(640 / cols))), ch = Math.max(3, Math.min(12, Math.floor(480 / rows)));
    Object.assign(historyGeometry, { cw, ch, left: ch >= 9 ? 44 : 0 });
    const canvas = $("history");
    canvas.width = historyGeometry.left + cols * cw;
    canvas.height = rows * ch;
    const ctx = canvas.getContext("2d");
    const [lo, hi] = statRange(key);
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) {
        const v = history[c].stats[key][Math.floor(r / H)][r % H];
        const rgb = LUT[Math.round((255 * (v - lo)) / (hi - lo))];
        ctx.fillStyle = `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
        ctx.fillRect(historyGeometry.left + c * cw, r * ch, cw, ch);
      }
      if (historyGeometry.left) {
        ctx.fillStyle = "#333";
        ctx.font = "10px ui-monospace, monospace";
        ctx.textBaseline = "middle";
        ctx.fillText(`L${Math.floor(r / H)}H${r % H}`, 2, r * ch + ch / 2);
      }
    }
    ctx.fillStyle = "#d62728";
    for (const f of meta.formations) {
      const c = history.findIndex((x) => x.step >= f.step);
      if (c < 0) continue;
      const x = historyGeometry.left + c * cw + cw / 2, y = (f.layer * H + f.head) * ch + ch / 2, r = Math.max(2, Math.min(cw, ch) / 2);
      ctx.beginPath(); ctx.moveTo(x, y - r); ctx.lineTo(x + r, y); ctx.lineTo(x, y + r); ctx.lineTo(x - r, y); ctx.fill();
    }
  }

  // The selected statistic over training: the selected head in red, the other heads of its layer in grey.
  function drawHistoryLine() {
    if (history.length < 2) return;
    const key = historyStat.value, canvas = $("history-line");
    canvas.width = 420; canvas.height = 220;
    const ctx = canvas.getContext("2d");
    const pad = { l: 44, r: 10, t: 18, b: 24 };
    const w = canvas.width - pad.l - pad.r, h = canvas.height - pad.t - pad.b;
    let [lo, hi] = statRange(key);
    if (key === "induction" && meta.threshold != null) { lo = Math.min(lo, meta.threshold); hi = Math.max(hi, meta.threshold); }
    const first = history[0].step, last = history[history.length - 1].step;
    const X = (step) => pad.l + (w * (step - first)) / Math.max(1, last - first);
    const Y = (v) => pad.t + h - (h * (v - lo)) / (hi - lo || 1);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.strokeStyle = "#ccc"; ctx.strokeRect(pad.l, pad.t, w, h);
    ctx.fillStyle = "#333"; ctx.font = "11px system-ui, sans-serif";
    ctx.fillText(`${meta.statistics[key]} of L${state.layer}H${state.head} (grey: its layer)`, pad.l, 12);
    ctx.fillText(hi.toFixed(2), 4, pad.t + 8); ctx.fillText(lo.toFixed(2), 4, pad.t + h);
    ctx.fillText(String(first), pad.l, canvas.height - 6);
    ctx.textAlign = "right"; ctx.fillText(`step ${last}`, pad.l + w, canvas.height - 6); ctx.textAlign = "left";
    if (key === "induction" && meta.threshold != null) {
      ctx.setLineDash([4, 3]); ctx.strokeStyle = "#999";
      ctx.beginPath(); ctx.moveTo(pad.l, Y(meta.threshold)); ctx.lineTo(pad.l + w, Y(meta.threshold)); ctx.stroke();
      ctx.setLineDash([]);
    }
    const line = (hd, colour, width) => {
      ctx.strokeStyle = colour; ctx.lineWidth = width; ctx.beginPath();
      history.forEach((x, c) => { const v = x.stats[key][state.layer][hd]; c ? ctx.lineTo(X(x.step), Y(v)) : ctx.moveTo(X(x.step), Y(v)); });
      ctx.stroke();
    };
    for (let hd = 0; hd < H; hd++) if (hd !== state.head) line(hd, "#bbb", 1);
    line(state.head, "#d62728", 2);
    const f = formedAt.get(state.layer * H + state.head);
    if (f) {
      ctx.strokeStyle = "#d62728"; ctx.setLineDash([2, 2]); ctx.lineWidth = 1;
      ctx.beginPath(); ctx.moveTo(X(f.step), pad.t); ctx.lineTo(X(f.step), pad.t + h); ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = "#d62728"; ctx.fillText(`formed at ${f.step}`, Math.min(X(f.step) + 3, pad.l + w - 90), pad.t + 12);
    }
  }

  // ---- controls and keyboard ----
  function setScale(scale) {
    state.scale = scale;
    $("scale").value = scale;
    drawThumbs();
    drawMap();
  }

  function onKey(e) {
    if (e.target.closest("input, select, textarea") || e.ctrlKey || e.metaKey || e.altKey) return;
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (e.key in moves) {
      const [dl, dh] = moves[e.key];
      select(state.layer + dl, state.head + dh);
      document.querySelector(`.thumb[data-layer="${state.layer}"][data-head="${state.head}"]`).focus({ preventScroll: true });
    } else if (e.key === "j") pin(query() + 1);
    else if (e.key === "k") pin(query() - 1);
    else if (e.key === "Home") pin(0);
    else if (e.key === "End") pin(T - 1);
    else if (e.key === "s") setScale(state.scale === "prob" ? "row" : "prob");
    else if (e.key === "Escape") pin(null);
    else if (e.key === "?") $("help").hidden = !$("help").hidden;
    else return;
    e.preventDefault();
  }

  async function start() {
    if (typeof DecompressionStream === "undefined") throw new Error("this browser lacks DecompressionStream; open the file in a current Chrome, Firefox or Safari");
    const started = performance.now();
    $("title").textContent = meta.title;
    $("summary").textContent = `${L} layers × ${H} heads · ${T} tokens` + (meta.step != null ? ` · step ${meta.step}` : "") +
      (meta.formations.length ? ` · ${meta.formations.length} induction head(s) formed (threshold ${meta.threshold})` : "");
    drawColourBar();
    buildGrid();
    buildText();
    buildTable();
    buildHistory();
    thumbs = await inflate("explorer-thumbs");
    drawThumbs();
    measureMap();
    $("scale").addEventListener("change", (e) => setScale(e.target.value));
    $("topk").addEventListener("input", (e) => { state.topk = Math.max(1, Math.min(20, Number(e.target.value) || 1)); updateText(); });
    $("help-button").addEventListener("click", () => { $("help").hidden = !$("help").hidden; });
    document.addEventListener("keydown", onKey);
    if (meta.prompt_len != null) $("text-legend").textContent = ` · ${meta.prompt_len} prompt tokens, then ${T - meta.prompt_len} generated (italic, dotted underline)`;
    await select(...(meta.initial_head ?? [0, 0]));
    document.documentElement.dataset.readyMs = (performance.now() - started).toFixed(1);
    document.documentElement.dataset.ready = "1";
  }

  // For scripts and tests: the state, selection by code, and how many heads were decoded so far.
  window.explorer = { state, select, pin, decodedHeads: () => heads.size };
  start().catch((err) => { fail(err.message); throw err; });
})();
