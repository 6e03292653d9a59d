"""The interactive attention viewer (``headlab view``, and the report's viewer section).

    encoding.py   row-relative byte patterns, deflated; thumbnails; JSON safe inside <script>
    data.py       view_data: capture a model on texts → ViewerData (patterns, labels, head statistics)
    page.py       the standalone page and the report fragment
    serve.py      a local HTTP server bound to 127.0.0.1 that serves one file or one folder
    static/       the browser side (package data): five script parts joined into viewer.js, viewer.css
"""

from headlab.report.viewer.data import MAX_ENTRIES, HeadInfo, Level, ViewerData, ViewerItem, view_data
from headlab.report.viewer.page import asset_text, viewer_document, viewer_fragment, write_assets

__all__ = [
    "MAX_ENTRIES", "HeadInfo", "Level", "ViewerData", "ViewerItem", "asset_text", "view_data", "viewer_document",
    "viewer_fragment", "write_assets",
]
