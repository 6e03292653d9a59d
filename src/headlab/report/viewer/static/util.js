/* headlab attention viewer, part 1 of 9: small helpers shared by the other parts (window.HeadlabViewer).
 * The parts are concatenated in the order util.js, ui.js, panel.js, circuit.js, tokens.js, canvas.js, image.js,
 * audio.js, mount.js (headlab.report.viewer.page.SCRIPT_PARTS).
 */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};

  HV.BLUE = [37, 99, 235];  // "the hovered token attends to it"
  HV.ORANGE = [234, 88, 12];  // "it attends to the hovered token"

  var SHORT_ROLES = { previous_token: "prev", next_token: "next", punctuation: "punct", sink: "sink", special: "spec", broad: "broad",
    self: "self", induction_head: "induct", duplicate_token_head: "dup" };

  function shortRoles(roles) {
    if (!roles.length) return "\u00A0";
    var first = SHORT_ROLES[roles[0]] || roles[0];
    return roles.length > 1 ? first + "+" : first;
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function bytesOf(b64) {
    var bin = atob(b64);
    var out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function inflate(b64) {
    var stream = new Blob([bytesOf(b64)]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buf) { return new Uint8Array(buf); });
  }

  function fmt(x, kind) {
    if (x === undefined || x === null) return "\u2013";
    if (kind === "share") return (100 * x).toFixed(1) + "%";
    if (kind === "seconds") return x.toFixed(3);
    return x.toFixed(2);
  }

  function fmtWeight(x) {
    return x >= 0.01 ? x.toFixed(2) : x.toPrecision(2);
  }

  function cssVar(node, name, fallback) {
    var v = getComputedStyle(node).getPropertyValue(name).trim();
    return v || fallback;
  }

  function parseRgb(text) {
    var m = /^#([0-9a-f]{6})$/i.exec(text);
    if (m) {
      var n = parseInt(m[1], 16);
      return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
    }
    var parts = text.match(/\d+/g);
    return parts && parts.length >= 3 ? [+parts[0], +parts[1], +parts[2]] : [255, 255, 255];
  }

  HV.shortRoles = shortRoles;
  HV.el = el;
  HV.bytesOf = bytesOf;
  HV.inflate = inflate;
  HV.fmt = fmt;
  HV.fmtWeight = fmtWeight;
  HV.cssVar = cssVar;
  HV.parseRgb = parseRgb;
})();
