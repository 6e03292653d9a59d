/* headlab attention viewer, part 6 of 9: drawing on canvas (thumbnails, the open head's matrix: n query rows by m
 * key columns, each axis labelled by its own positions). */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var Viewer = HV.Viewer, cssVar = HV.cssVar, parseRgb = HV.parseRgb, fmtWeight = HV.fmtWeight, ORANGE = HV.ORANGE;
  var MAX_PIXELS = 720; // matrix canvas resolution cap: longer texts are pooled by the block maximum

  Viewer.prototype.ramp = function () {
    return [parseRgb(cssVar(this.root, "--hv-ramp-low", "#ffffff")), parseRgb(cssVar(this.root, "--hv-ramp-high", "#08306b"))];
  };

  Viewer.prototype.shade = function (t, ramp, out, o) {
    if (this.colour === "sqrt") t = Math.sqrt(t);
    out[o] = ramp[0][0] + (ramp[1][0] - ramp[0][0]) * t;
    out[o + 1] = ramp[0][1] + (ramp[1][1] - ramp[0][1]) * t;
    out[o + 2] = ramp[0][2] + (ramp[1][2] - ramp[0][2]) * t;
    out[o + 3] = 255;
  };

  Viewer.prototype.drawThumbs = function (codes) {
    var lv = this.levelData(), t = lv.thumbSize, ramp = this.ramp(), self = this;
    this.thumbButtons.forEach(function (b, idx) {
      if (!b) return;
      var c = b.querySelector("canvas");
      c.width = c.height = t;
      var ctx = c.getContext("2d"), img = ctx.createImageData(t, t), base = idx * t * t;
      var rowMode = self.colour === "row";
      for (var q = 0; q < t; q++) {
        var rmax = 0;
        if (rowMode) for (var k = 0; k < t; k++) rmax = Math.max(rmax, codes[base + q * t + k]);
        for (k = 0; k < t; k++) {
          var v = codes[base + q * t + k] / 255;
          if (rowMode) v = rmax > 0 ? codes[base + q * t + k] / rmax : 0;
          self.shade(v, ramp, img.data, 4 * (q * t + k));
        }
      }
      ctx.putImageData(img, 0, 0);
    });
  };

  Viewer.prototype.matrixLayout = function () {
    // as wide as the panel allows (at most 760 px); labels on both axes when a cell can hold them (square cells),
    // else the rows and the columns each stretched over the grid
    var n = this.current.n, m = this.current.m, most = Math.max(n, m), panel = this.canvas.parentElement;
    var room = Math.max(240, Math.min(760, (panel ? panel.clientWidth : 600) - 24));
    var labels = (room - 86) / most >= 10;
    var margin = labels ? 86 : 8;
    var cell = labels ? Math.min(26, Math.floor((room - margin) / most)) : 0;
    var width = labels ? cell * m : room - margin, height = labels ? cell * n : room - margin;
    return { n: n, m: m, labels: labels, width: width, height: height, margin: margin, sizeX: width + margin + 4,
      sizeY: height + margin + 4 };
  };

  Viewer.prototype.drawMatrix = function () {
    if (!this.current) return;
    var p = this.current, L = this.matrixLayout(), n = p.n, m = p.m, ramp = this.ramp();
    var rows = Math.min(n, MAX_PIXELS), cols = Math.min(m, MAX_PIXELS), dpr = window.devicePixelRatio || 1;
    if (!this.offscreen || this.offscreenKey !== this.renderId + "/" + this.colour) {
      var off = document.createElement("canvas");
      off.width = cols;
      off.height = rows;
      var octx = off.getContext("2d"), img = octx.createImageData(cols, rows);
      for (var r = 0; r < rows; r++) {
        var q0 = Math.floor(r * n / rows), q1 = Math.max(q0 + 1, Math.floor((r + 1) * n / rows));
        for (var c = 0; c < cols; c++) {
          var k0 = Math.floor(c * m / cols), k1 = Math.max(k0 + 1, Math.floor((c + 1) * m / cols)), best = 0;
          for (var q = q0; q < q1; q++) {
            for (var k = k0; k < k1; k++) {
              var v = this.colour === "row" ? p.codes[q * m + k] / 255 : (p.peak > 0 ? p.value(q, k) / p.peak : 0);
              if (v > best) best = v;
            }
          }
          this.shade(best, ramp, img.data, 4 * (r * cols + c));
        }
      }
      octx.putImageData(img, 0, 0);
      this.offscreen = off;
      this.offscreenKey = this.renderId + "/" + this.colour;
    }
    var cv = this.canvas;
    cv.width = Math.round(L.sizeX * dpr);
    cv.height = Math.round(L.sizeY * dpr);
    cv.style.width = L.sizeX + "px";
    cv.style.height = L.sizeY + "px";
    var ctx = cv.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, L.sizeX, L.sizeY);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.offscreen, L.margin, L.margin, L.width, L.height);
    var fg = cssVar(this.root, "--hv-fg", "#1f2328"), border = cssVar(this.root, "--hv-border", "#d1d9e0");
    ctx.strokeStyle = border;
    ctx.lineWidth = 1;
    ctx.strokeRect(L.margin - 0.5, L.margin - 0.5, L.width + 1, L.height + 1);
    var rowLabels = this.axisLabels(p.axes[0]), colLabels = this.axisLabels(p.axes[1]);
    var stepY = L.height / n, stepX = L.width / m, i;
    function short(label) { return label.length > 11 ? label.slice(0, 10) + "\u2026" : label; }
    if (L.labels) {
      ctx.fillStyle = fg;
      ctx.font = "11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      for (i = 0; i < n; i++) ctx.fillText(short(rowLabels[i]), L.margin - 4, L.margin + (i + 0.5) * stepY);
      for (i = 0; i < m; i++) {
        ctx.save();
        ctx.translate(L.margin + (i + 0.5) * stepX, L.margin - 4);
        ctx.rotate(-Math.PI / 3);
        ctx.textAlign = "left";
        ctx.fillText(short(colLabels[i]), 0, 0);
        ctx.restore();
      }
    }
    if (this.focus !== null) {
      // the focused position's row (what it attends to) and column (what attends to it), on the axes it lies on
      ctx.strokeStyle = fg;
      ctx.lineWidth = Math.min(stepX, stepY) >= 3 ? 1.5 : 1;
      ctx.setLineDash(Math.min(stepX, stepY) >= 3 ? [] : [4, 3]);
      if (p.axes[0] === this.focusAxis && this.focus < n) {
        ctx.strokeRect(L.margin, L.margin + this.focus * stepY, L.width, Math.max(stepY, 1));
      }
      if (p.axes[1] === this.focusAxis && this.focus < m) {
        ctx.strokeRect(L.margin + this.focus * stepX, L.margin, Math.max(stepX, 1), L.height);
      }
      ctx.setLineDash([]);
    }
    if (this.hoverCell) {
      ctx.strokeStyle = "rgba(" + ORANGE.join(",") + ",0.95)";
      ctx.lineWidth = 2;
      ctx.strokeRect(L.margin + this.hoverCell[1] * stepX, L.margin + this.hoverCell[0] * stepY, Math.max(stepX, 2),
        Math.max(stepY, 2));
    }
  };

  Viewer.prototype.matrixHover = function (ev) {
    if (!this.current) return;
    var p = this.current, L = this.matrixLayout(), rect = this.canvas.getBoundingClientRect();
    var x = ev.clientX - rect.left - L.margin, y = ev.clientY - rect.top - L.margin, n = p.n, m = p.m;
    if (x < 0 || y < 0 || x >= L.width || y >= L.height) { this.hoverCell = null; this.matrixStatus.textContent = "\u00A0"; this.drawMatrix(); return; }
    var q = Math.min(n - 1, Math.floor(y * n / L.height)), k = Math.min(m - 1, Math.floor(x * m / L.width));
    var rowLabels = this.axisLabels(p.axes[0]), colLabels = this.axisLabels(p.axes[1]);
    this.hoverCell = [q, k];
    this.matrixStatus.textContent = "\u201C" + rowLabels[q] + "\u201D (" + q + ") \u2192 \u201C" + colLabels[k] + "\u201D (" + k + "): " +
      fmtWeight(p.value(q, k));
    this.drawMatrix();
    this.hoverCell = null;
  };
})();
