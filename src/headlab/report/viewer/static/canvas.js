/* headlab attention viewer, part 6 of 8: drawing on canvas (thumbnails, the open head's matrix). */
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
    // as wide as the panel allows (at most 760 px); token labels on both axes when a cell can hold them
    var n = this.current.n, panel = this.canvas.parentElement;
    var room = Math.max(240, Math.min(760, (panel ? panel.clientWidth : 600) - 24));
    var labels = (room - 86) / n >= 10;
    var margin = labels ? 86 : 8;
    var cell = labels ? Math.min(26, Math.floor((room - margin) / n)) : 0;
    var grid = labels ? cell * n : room - margin;
    return { n: n, labels: labels, grid: grid, margin: margin, size: grid + margin + 4 };
  };

  Viewer.prototype.drawMatrix = function () {
    if (!this.current) return;
    var p = this.current, L = this.matrixLayout(), n = p.n, ramp = this.ramp();
    var res = Math.min(n, MAX_PIXELS), dpr = window.devicePixelRatio || 1;
    if (!this.offscreen || this.offscreenKey !== this.renderId + "/" + this.colour) {
      var off = document.createElement("canvas");
      off.width = off.height = res;
      var octx = off.getContext("2d"), img = octx.createImageData(res, res);
      for (var r = 0; r < res; r++) {
        var q0 = Math.floor(r * n / res), q1 = Math.max(q0 + 1, Math.floor((r + 1) * n / res));
        for (var c = 0; c < res; c++) {
          var k0 = Math.floor(c * n / res), k1 = Math.max(k0 + 1, Math.floor((c + 1) * n / res)), best = 0;
          for (var q = q0; q < q1; q++) {
            for (var k = k0; k < k1; k++) {
              var v = this.colour === "row" ? p.codes[q * n + k] / 255 : (p.peak > 0 ? p.value(q, k) / p.peak : 0);
              if (v > best) best = v;
            }
          }
          this.shade(best, ramp, img.data, 4 * (r * res + c));
        }
      }
      octx.putImageData(img, 0, 0);
      this.offscreen = off;
      this.offscreenKey = this.renderId + "/" + this.colour;
    }
    var cv = this.canvas;
    cv.width = Math.round(L.size * dpr);
    cv.height = Math.round(L.size * dpr);
    cv.style.width = cv.style.height = L.size + "px";
    var ctx = cv.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, L.size, L.size);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.offscreen, L.margin, L.margin, L.grid, L.grid);
    var fg = cssVar(this.root, "--hv-fg", "#1f2328"), border = cssVar(this.root, "--hv-border", "#d1d9e0");
    ctx.strokeStyle = border;
    ctx.lineWidth = 1;
    ctx.strokeRect(L.margin - 0.5, L.margin - 0.5, L.grid + 1, L.grid + 1);
    var lv = this.levelData(), step = L.grid / n;
    if (L.labels) {
      ctx.fillStyle = fg;
      ctx.font = "11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      for (var i = 0; i < n; i++) {
        var s = lv.labels[i].length > 11 ? lv.labels[i].slice(0, 10) + "\u2026" : lv.labels[i];
        ctx.fillText(s, L.margin - 4, L.margin + (i + 0.5) * step);
        ctx.save();
        ctx.translate(L.margin + (i + 0.5) * step, L.margin - 4);
        ctx.rotate(-Math.PI / 3);
        ctx.textAlign = "left";
        ctx.fillText(s, 0, 0);
        ctx.restore();
      }
    }
    if (this.focus !== null && this.focus < n) {
      // the focused token's row (what it attends to) and column (what attends to it)
      var at = L.margin + this.focus * step, w = Math.max(step, 1);
      ctx.strokeStyle = fg;
      ctx.lineWidth = step >= 3 ? 1.5 : 1;
      ctx.setLineDash(step >= 3 ? [] : [4, 3]);
      ctx.strokeRect(L.margin, at, L.grid, w);
      ctx.strokeRect(at, L.margin, w, L.grid);
      ctx.setLineDash([]);
    }
    if (this.hoverCell) {
      ctx.strokeStyle = "rgba(" + ORANGE.join(",") + ",0.95)";
      ctx.lineWidth = 2;
      ctx.strokeRect(L.margin + this.hoverCell[1] * step, L.margin + this.hoverCell[0] * step, Math.max(step, 2), Math.max(step, 2));
    }
  };

  Viewer.prototype.matrixHover = function (ev) {
    if (!this.current) return;
    var L = this.matrixLayout(), rect = this.canvas.getBoundingClientRect();
    var x = ev.clientX - rect.left - L.margin, y = ev.clientY - rect.top - L.margin, n = this.current.n;
    if (x < 0 || y < 0 || x >= L.grid || y >= L.grid) { this.hoverCell = null; this.matrixStatus.textContent = "\u00A0"; this.drawMatrix(); return; }
    var q = Math.min(n - 1, Math.floor(y * n / L.grid)), k = Math.min(n - 1, Math.floor(x * n / L.grid));
    var lv = this.levelData();
    this.hoverCell = [q, k];
    this.matrixStatus.textContent = "\u201C" + lv.labels[q] + "\u201D (" + q + ") \u2192 \u201C" + lv.labels[k] + "\u201D (" + k + "): " +
      fmtWeight(this.current.value(q, k));
    this.drawMatrix();
    this.hoverCell = null;
  };
})();
