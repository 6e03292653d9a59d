"""The viewer's HTML: the payload cannot break out of its element; the standalone page pins its script."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from pathlib import Path

import pytest

from headlab.report.viewer import asset_text, view_data, viewer_document, viewer_fragment, write_assets
from tests.support.tiny import tiny

EVIL = 'the cat </script><script>alert(1)</script> <!-- <img src=x onerror=alert(2)> sat'


@pytest.fixture(scope="module")
def data():
    return view_data(tiny("bert"), [EVIL, "the dog"])


def test_fragment_payload_cannot_close_its_element_and_parses_back(data) -> None:
    fragment = viewer_fragment(data, element_id="v1")
    assert fragment.count("<script") == 1 and fragment.count("</script>") == 1  # only its own tags
    payload = re.search(r'<script type="application/json" id="v1-data">(.*)</script>', fragment).group(1)
    assert "<" not in payload and "-->" not in payload
    parsed = json.loads(payload)
    assert parsed == json.loads(json.dumps(data.to_dict()))
    assert parsed["items"][0]["text"] == EVIL
    assert 'data-headlab-viewer="v1-data"' in fragment


@pytest.mark.parametrize("bad", ["", "1x", 'a"b', "a b", "<x>"])
def test_fragment_ids_are_checked(data, bad: str) -> None:
    with pytest.raises(ValueError, match="element_id"):
        viewer_fragment(data, element_id=bad)


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_document_is_offline_and_its_policy_allows_only_its_own_script_and_style(data) -> None:
    page = viewer_document(data)
    script = re.findall(r"<script>(.*?)</script>", page, re.DOTALL)
    assert script == [asset_text("viewer.js")]
    policy = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1))
    assert f"script-src {_sha(script[0])};" in policy and "default-src 'none'" in policy
    for style in re.findall(r"<style>(.*?)</style>", page, re.DOTALL):
        assert _sha(style) in policy
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing from the network
    assert "<title>headlab view: tiny random bert</title>" in page


def test_assets_are_written_as_packaged(tmp_path: Path) -> None:
    written = write_assets(tmp_path / "assets")
    assert sorted(written) == ["viewer.css", "viewer.js"]
    for name, path in written.items():
        assert path.read_text(encoding="utf-8") == asset_text(name)
    with pytest.raises(ValueError, match="unknown viewer asset"):
        asset_text("../pyproject.toml")
