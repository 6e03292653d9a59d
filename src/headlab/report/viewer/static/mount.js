/* headlab attention viewer, part 9 of 9: mount a viewer on every element that names a payload.
 *
 * The script runs once on a page (headlab view, the report) or once per notebook output that shows a viewer
 * (headlab.show): a notebook front end inserts the output's markup, then runs its scripts, so each run mounts
 * the roots not mounted yet, in the document and in the tree (a shadow root, say) that holds the running script.
 * The payload is found by its id beside the root; ids are unique per output.
 */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var Viewer = HV.Viewer;

  // viewers of outputs a notebook has since removed are dropped, so that re-running a cell leaks nothing
  window.headlabViewers = (window.headlabViewers || []).filter(function (v) { return v.root.isConnected; });

  function mountIn(scope) {
    var roots = scope.querySelectorAll("[data-headlab-viewer]");
    for (var i = 0; i < roots.length; i++) {
      var root = roots[i];
      if (root.dataset.mounted) continue;
      var source = (scope.getElementById ? scope : document).getElementById(root.dataset.headlabViewer);
      if (!source) continue;  // its payload is not in the page yet: a later run mounts it
      root.dataset.mounted = "1";
      try {
        window.headlabViewers.push(new Viewer(root, JSON.parse(source.textContent)));
      } catch (err) {
        root.textContent = "The viewer could not start: " + err;
        root.dataset.ready = "error";
        throw err;
      }
    }
  }

  function boot(script) {
    mountIn(document);
    var tree = script && script.getRootNode ? script.getRootNode() : null;
    if (tree && tree !== document && tree.querySelectorAll) mountIn(tree);
  }

  HV.boot = boot;
  var script = document.currentScript;
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", function () { boot(script); });
  else boot(script);
})();
