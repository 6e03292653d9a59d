"""The interactive attention viewer (``headlab view``, and the report's viewer section).

    encoding.py   row-relative byte patterns, deflated; thumbnails; JSON safe inside <script>
    payload.py    ViewerData: what the page carries (patterns, labels, head statistics; an image's picture and grid)
    data.py       view_data: capture a model on texts → ViewerData (an image model: images.py; an audio one: audio.py;
                  (source, target) pairs: pairs.py)
    levels.py     what the text viewers build alike: an item's Level at one level of detail, each head's HeadInfo
    pairs.py      pair_view_data: capture a text encoder-decoder on pairs → ViewerData, source and target side by side
    images.py     image_view_data: capture a vision transformer on images → ViewerData with each image's picture
    audio.py      audio_view_data: capture an audio encoder-decoder on recordings → ViewerData with each one's frames
    circuit.py    circuit_view: edge scores → each head's strongest incoming and outgoing edges (the circuit panel)
    cached.py     cache_view_data: the patterns a run_with_cache cache kept → ViewerData, nothing run
    page.py       the standalone page and the report fragment
    inline.py     show: the viewer inline in a notebook (style and script inlined, ids per output)
    serve.py      a local HTTP server bound to 127.0.0.1 that serves one file or one folder
    static/       the browser side (package data): nine script parts joined into viewer.js, viewer.css
"""

from headlab.report.viewer.audio import audio_view_data
from headlab.report.viewer.cached import cache_view_data
from headlab.report.viewer.circuit import CircuitView, circuit_view
from headlab.report.viewer.data import view_data
from headlab.report.viewer.images import image_view_data
from headlab.report.viewer.inline import InlineViewer, show
from headlab.report.viewer.page import asset_text, viewer_document, viewer_fragment, write_assets
from headlab.report.viewer.pairs import pair_view_data
from headlab.report.viewer.payload import (
    MAX_ENTRIES,
    FrameStrip,
    HeadInfo,
    ImagePanel,
    Level,
    ViewerData,
    ViewerItem,
)

__all__ = [
    "MAX_ENTRIES", "CircuitView", "FrameStrip", "HeadInfo", "ImagePanel", "InlineViewer", "Level", "ViewerData",
    "ViewerItem", "asset_text", "audio_view_data", "cache_view_data", "circuit_view", "image_view_data",
    "pair_view_data", "show",
    "view_data", "viewer_document", "viewer_fragment", "write_assets",
]
