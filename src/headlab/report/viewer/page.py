"""The viewer as HTML: a standalone page (``headlab view``) or a fragment inside the report.

Both carry the payload of ``ViewerData.to_dict()`` in a ``<script type="application/json">``
element (``encoding.script_json``: no ``</script>`` or ``<!--`` can occur in it) and mount
``static/viewer.js`` on it. The standalone page inlines the script and style and pins them with a
Content-Security-Policy of their hashes, so nothing else could run even if markup slipped in;
the report links them from its assets folder.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources
from pathlib import Path

from headlab.report.html import Html, escape
from headlab.report.viewer.encoding import script_json
from headlab.report.viewer.payload import ViewerData

__all__ = ["ASSETS", "SCRIPT_PARTS", "asset_text", "viewer_document", "viewer_fragment", "write_assets"]

# static/, joined in this order
SCRIPT_PARTS = ("util.js", "ui.js", "panel.js", "circuit.js", "tokens.js", "canvas.js", "image.js", "audio.js",
                "mount.js")
ASSETS = ("viewer.js", "viewer.css")
_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def asset_text(name: str) -> str:
    """The text of a viewer asset: ``viewer.css``, or ``viewer.js``, the script parts joined in order.

    Raises:
        ValueError: ``name`` is not one of ``ASSETS``.
    """
    if name not in ASSETS:
        raise ValueError(f"unknown viewer asset {name!r}; expected one of {ASSETS}")
    static = resources.files("headlab.report.viewer").joinpath("static")
    parts = SCRIPT_PARTS if name == "viewer.js" else (name,)
    return "\n".join(static.joinpath(part).read_text(encoding="utf-8") for part in parts)


def write_assets(folder: Path) -> dict[str, Path]:
    """Write the viewer's script and style into ``folder`` (created if missing).

    Returns:
        ``{asset name: written path}``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in ASSETS:
        path = folder / name
        path.write_text(asset_text(name), encoding="utf-8")
        written[name] = path
    return written


def viewer_fragment(data: ViewerData, *, element_id: str, fallback: str | None = None) -> Html:
    """The viewer's mount point and payload, for a page that loads ``viewer.js`` and ``viewer.css``.

    Args:
        data: what to show.
        element_id: a page-unique id (letters, digits, ``-``, ``_``; starting with a letter).
        fallback: text the mount point shows until the script replaces it (a notebook that runs no
            script shows it); None: a ``<noscript>`` line for a browser without JavaScript.

    Returns:
        The fragment: a ``<div>`` the script fills and the ``<script type="application/json">`` payload.

    Raises:
        ValueError: a bad ``element_id``.
    """
    if not _ID.fullmatch(element_id):
        raise ValueError(f"element_id must match {_ID.pattern}, got {element_id!r}")
    payload = f"{element_id}-data"
    placeholder = "<noscript>The attention viewer needs JavaScript.</noscript>"
    if fallback is not None:
        placeholder = escape(fallback)
    return Html(
        f'<div class="hv-root" id="{escape(element_id)}" data-headlab-viewer="{escape(payload)}">{placeholder}</div>'
        f'<script type="application/json" id="{escape(payload)}">{script_json(data.to_dict())}</script>'
    )


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def viewer_document(data: ViewerData, *, title: str | None = None) -> str:
    """A complete, self-contained HTML page showing ``data`` (works offline from ``file://``).

    Args:
        data: what to show.
        title: the page title; default names the model.

    Returns:
        The document as a string.
    """
    script, style = asset_text("viewer.js"), asset_text("viewer.css")
    page_style = ("body{margin:0;background:#fff;font:15px/1.5 system-ui,sans-serif;color:#1f2328}"
                  "@media (prefers-color-scheme: dark){body{background:#0d1117;color:#e6edf3}}"
                  "main{max-width:110rem;margin:0 auto;padding:1rem 1.25rem 2rem}"
                  "header h1{font-size:1.35rem;margin:0 0 .15rem}"
                  "header p{margin:0 0 .8rem;color:#59636e;font-size:.9rem}"
                  "footer{margin-top:1rem;color:#59636e;font-size:.8rem}")
    policy = (f"default-src 'none'; script-src {_sha256(script)}; style-src {_sha256(style)} {_sha256(page_style)}; "
              "img-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'")  # data: for the icon
    title = title if title is not None else f"headlab view: {data.name}"
    subtitle = f"{len(data.heads)} heads of {data.name} on {data.contents}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{escape(policy)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request: a served page logs no 404
        f"<title>{escape(title)}</title><style>{page_style}</style><style>{style}</style></head><body><main>"
        f"<header><h1>{escape(title)}</h1><p>{escape(subtitle)}</p></header>"
        f"{viewer_fragment(data, element_id='viewer')}"
        "<footer>Weights are stored to within 1/510 of each row's largest weight. "
        "Statistics and roles: docs/analysis.md. Made by headlab view.</footer>"
        f"</main><script>{script}</script></body></html>\n"
    )
