/* headlab attention viewer, part 6 of 6: mount a viewer on every element that names a payload. */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var Viewer = HV.Viewer;

  window.headlabViewers = window.headlabViewers || [];

  function boot() {
    var roots = document.querySelectorAll("[data-headlab-viewer]");
    for (var i = 0; i < roots.length; i++) {
      var root = roots[i];
      if (root.dataset.mounted) continue;
      root.dataset.mounted = "1";
      var source = document.getElementById(root.dataset.headlabViewer);
      try {
        window.headlabViewers.push(new Viewer(root, JSON.parse(source.textContent)));
      } catch (err) {
        root.textContent = "The viewer could not start: " + err;
        root.dataset.ready = "error";
        throw err;
      }
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
