/* headlab attention viewer, part 7 of 9: an image model's picture under its patch grid. Hovering a patch (or any
 * position, in the token list) shows the open view's attention from it as heat over the picture: each patch's cell
 * is filled with the weight the focused position puts on it, relative to its largest weight on a patch.
 *
 * A windowed model (Swin) runs each stage on its own grid (the image's "layers": rows, columns and the first-stage
 * patches each of its patches spans, strideY x strideX). Its positions are the first stage's patches, a later stage's
 * pattern laid over them with a stage patch's weight spread evenly over the patches it covers (images.py); in the
 * pattern view the heat is summed back onto the open head's own grid, drawn with that grid's cells.
 *
 * Test hooks: while a patch is focused the root carries data-patch ("row,column", on the grid the heat is drawn on);
 * the viewer's overlayWeights holds the weights drawn on the cells (the focused row of the matrix shown, over the
 * patch keys of that grid, row-major) and overlayPeak their largest; a cell's alpha is MAX_ALPHA * weight /
 * overlayPeak (HeadlabViewer.MAX_ALPHA).
 */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var Viewer = HV.Viewer, el = HV.el, fmtWeight = HV.fmtWeight;
  var HEAT = [220, 38, 38], MAX_ALPHA = 0.85, SIDE = 384;  // SIDE: the picture's longer side on the page, CSS px
  HV.HEAT = HEAT;
  HV.MAX_ALPHA = MAX_ALPHA;

  Viewer.prototype.buildImage = function (parent) {
    if (!this.data.items.some(function (it) { return it.image; })) return;
    var self = this, box = el("section", "hv-panel hv-image-panel");
    box.appendChild(el("h4", null, "Image"));
    box.appendChild(el("p", "hv-help", "The image as the model saw it, under its patch grid. Hover over a patch: " +
      "the open head's attention from it, as heat over the image (darkest = its largest weight on a patch); " +
      "click to pin it. Hovering a token below does the same for [CLS] and the registers."));
    var wrap = el("div", "hv-image-wrap");
    this.picture = el("img", "hv-picture");
    this.picture.alt = "the image as the model saw it";
    this.overlay = el("canvas", "hv-overlay");
    wrap.appendChild(this.picture);
    wrap.appendChild(this.overlay);
    box.appendChild(wrap);
    this.imageStatus = el("div", "hv-status", "\u00A0");
    box.appendChild(this.imageStatus);
    this.overlay.addEventListener("mousemove", function (ev) { self.imageHover(ev, false); });
    this.overlay.addEventListener("click", function (ev) { self.imageHover(ev, true); });
    this.overlay.addEventListener("mouseleave", function () { if (!self.pinned) self.clearFocus(false); });
    parent.appendChild(box);
    this.imageBox = box;
  };

  // the picture's size on the page: its longer side SIDE px
  Viewer.prototype.imageLayout = function () {
    var im = this.data.items[this.item].image, scale = SIDE / Math.max(im.width, im.height);
    var w = Math.round(im.width * scale), h = Math.round(im.height * scale);
    return { im: im, w: w, h: h, cw: w * im.coverX / im.columns, ch: h * im.coverY / im.rows };
  };

  Viewer.prototype.renderImage = function () {
    if (!this.imageBox) return;
    var im = this.data.items[this.item].image;
    this.imageBox.style.display = im ? "" : "none";
    if (!im) return;
    var L = this.imageLayout();
    if (this.picture.getAttribute("src") !== im.src) this.picture.setAttribute("src", im.src);
    this.picture.style.imageRendering = L.w > im.width ? "pixelated" : "auto";  // a small input stays sharp
    this.picture.style.width = this.overlay.style.width = L.w + "px";
    this.picture.style.height = this.overlay.style.height = L.h + "px";
    this.drawOverlay();
  };

  Viewer.prototype.imageHover = function (ev, click) {
    var L = this.imageLayout(), im = L.im, rect = this.overlay.getBoundingClientRect();
    var c = Math.floor((ev.clientX - rect.left) * (L.w / rect.width) / L.cw);
    var r = Math.floor((ev.clientY - rect.top) * (L.h / rect.height) / L.ch);
    if (r < 0 || c < 0 || r >= im.rows || c >= im.columns) return;
    var pos = im.first + r * im.columns + c;
    if (click) {
      if (this.pinned && this.focus === pos) { this.pinned = false; return; }
      this.pinned = true;
      this.setFocus(pos);
    } else if (!this.pinned && this.focus !== pos) {
      this.setFocus(pos);
    }
  };

  // the grid the heat is drawn on: in the pattern view the open head's own (a windowed model's stage), else the image's
  Viewer.prototype.heatGrid = function (im) {
    var g = im.layers && this.view === "pattern" ? im.layers[this.layerOf()] : null;
    return g ? { rows: g.rows, columns: g.columns, sy: g.strideY, sx: g.strideX, own: true } :
      { rows: im.rows, columns: im.columns, sy: 1, sx: 1, own: false };
  };

  Viewer.prototype.drawOverlay = function () {
    if (!this.imageBox || !this.data.items[this.item].image) return;
    var L = this.imageLayout(), im = L.im, dpr = window.devicePixelRatio || 1, cv = this.overlay, p = this.current;
    var G = this.heatGrid(im), cw = L.cw * G.sx, ch = L.ch * G.sy;  // a heat cell's size on the page
    cv.width = Math.round(L.w * dpr);
    cv.height = Math.round(L.h * dpr);
    var ctx = cv.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, L.w, L.h);
    this.overlayWeights = null;
    this.overlayPeak = null;
    delete this.root.dataset.patch;
    var pos = this.focus;
    if (pos !== null && p && pos < p.n) {
      var n = G.rows * G.columns, w = new Float64Array(n), peak = 0, special = 0, k;
      for (k = 0; k < im.first; k++) special += p.value(pos, k);
      for (k = 0; k < im.rows * im.columns; k++) {  // each patch's weight, summed into the heat grid's cell over it
        w[Math.floor(Math.floor(k / im.columns) / G.sy) * G.columns + Math.floor((k % im.columns) / G.sx)] +=
          p.value(pos, im.first + k);
      }
      for (k = 0; k < n; k++) if (w[k] > peak) peak = w[k];
      for (k = 0; k < n; k++) {
        if (!(peak > 0) || !(w[k] > 0)) continue;
        ctx.fillStyle = "rgba(" + HEAT.join(",") + "," + (MAX_ALPHA * w[k] / peak) + ")";
        ctx.fillRect((k % G.columns) * cw, Math.floor(k / G.columns) * ch, cw, ch);
      }
      this.overlayWeights = w;
      this.overlayPeak = peak;
      var label = this.levelData().labels[pos];
      this.imageStatus.textContent = "\u201C" + label + "\u201D: largest weight on a patch " + fmtWeight(peak) +
        (G.own ? " (layer " + this.layerOf() + "'s " + G.rows + "\u00D7" + G.columns + " grid)" : "") +
        (im.first ? "; on the special tokens " + fmtWeight(special) + " in all" : "");
      if (pos >= im.first) {
        var q = pos - im.first, row = Math.floor(Math.floor(q / im.columns) / G.sy);
        var col = Math.floor((q % im.columns) / G.sx);
        this.root.dataset.patch = row + "," + col;
        ctx.strokeStyle = "rgba(255,255,255,0.95)";
        ctx.lineWidth = 2;
        ctx.strokeRect(col * cw + 1, row * ch + 1, cw - 2, ch - 2);
      }
    } else {
      this.imageStatus.textContent = "\u00A0";
    }
    ctx.strokeStyle = "rgba(255,255,255,0.35)";  // the heat grid
    ctx.lineWidth = 1;
    ctx.beginPath();
    var right = Math.min(G.columns * cw, L.w), bottom = Math.min(G.rows * ch, L.h);
    for (var r = 1; r < G.rows; r++) { ctx.moveTo(0, r * ch); ctx.lineTo(right, r * ch); }
    for (var c = 1; c < G.columns; c++) { ctx.moveTo(c * cw, 0); ctx.lineTo(c * cw, bottom); }
    ctx.stroke();
  };
})();
