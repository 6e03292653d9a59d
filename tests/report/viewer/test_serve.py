"""The local server: 127.0.0.1 only, one file or one folder, nothing outside it, no listings."""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from headlab.report.viewer.serve import HOST, LocalServer, local_server


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "report"
    (root / "assets" / "empty").mkdir(parents=True)
    (root / "index.html").write_text("<p>index</p>")
    (root / "assets" / "viewer.js").write_text("let x = 1;")
    (root / ".secret").write_text("dotfile")
    (tmp_path / "outside.txt").write_text("outside")
    os.symlink(tmp_path / "outside.txt", root / "assets" / "link.txt")
    return root


def _running(server: LocalServer) -> Iterator[LocalServer]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _get(server: LocalServer, path: str, method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    connection.putrequest(method, path, skip_host=False, skip_accept_encoding=True)  # the path is sent as it is
    connection.endheaders()
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, body, dict(response.getheaders())


@pytest.fixture
def folder_server(site: Path) -> Iterator[LocalServer]:
    yield from _running(local_server(site))


def test_binds_to_127_0_0_1_and_serves_the_folder(folder_server: LocalServer) -> None:
    assert folder_server.server_address[0] == HOST == "127.0.0.1"
    assert folder_server.url.startswith("http://127.0.0.1:") and folder_server.url.endswith("/index.html")
    status, body, headers = _get(folder_server, "/")
    assert status == 200 and body == b"<p>index</p>" and headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert _get(folder_server, "/assets/viewer.js?v=1#x")[:2] == (200, b"let x = 1;")
    status, body, _ = _get(folder_server, "/assets/viewer.js", method="HEAD")
    assert status == 200 and body == b""


@pytest.mark.parametrize("path", [
    "/../outside.txt", "/assets/../../outside.txt", "/%2e%2e/outside.txt", "/assets/%2e%2e/%2e%2e/outside.txt",
    "/..%2foutside.txt", "/assets/..\\..\\outside.txt", "//etc/passwd", "/.secret", "/assets/link.txt",
    "/assets/", "/assets/empty", "/nothing.html", "/index.html%00.js",
])
def test_nothing_outside_the_folder_no_dotfiles_no_listings(folder_server: LocalServer, path: str) -> None:
    status, body, _ = _get(folder_server, path)
    assert status == 404, (path, body[:80])
    assert b"outside" not in body and b"dotfile" not in body


def test_a_file_is_served_alone(site: Path) -> None:
    for server in _running(local_server(site / "assets" / "viewer.js")):
        assert server.url.endswith("/viewer.js")
        assert _get(server, "/")[:2] == (200, b"let x = 1;")
        assert _get(server, "/viewer.js")[0] == 200
        assert _get(server, "/index.html")[0] == 404  # its neighbours are not served
        assert _get(server, "/assets/viewer.js")[0] == 404


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing to serve"):
        local_server(tmp_path / "missing")
    with pytest.raises(ValueError, match="port=70000"):
        local_server(tmp_path, port=70000)
