"""A small HTTP server for a viewer page or a report folder, reachable from this machine only.

It binds to 127.0.0.1 (never a public interface) and answers GET and HEAD for one file, or for
the regular files inside one folder: no directory listings, no dotfiles, no path that leaves the
folder (``..``, encoded or not, absolute paths, symlinks pointing out), nothing but 404 otherwise.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["HOST", "LocalServer", "local_server", "serve"]

HOST = "127.0.0.1"


class LocalServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` on 127.0.0.1 that serves one file or one folder.

    Attributes:
        root: the folder served (for a file, its folder; only the file itself is reachable).
        single: the one file served, or None when the whole folder is.
    """

    daemon_threads = True

    def __init__(self, root: Path, single: Path | None, port: int) -> None:
        self.root, self.single = root, single
        super().__init__((HOST, port), _Handler)

    @property
    def url(self) -> str:
        """The address to open: the file, or the folder's ``index.html``."""
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, (bytes, bytearray)) else host  # socketserver allows bytes
        name = self.single.name if self.single is not None else "index.html"
        return f"http://{host}:{port}/{name}"

    def resolve(self, request_path: str) -> Path | None:
        """The file a request path names, or None when it names nothing servable.

        Args:
            request_path: the path of the request line (query and fragment are ignored).

        Returns:
            A regular file inside the served folder (or the single file), else None.
        """
        path = unquote(urlsplit(request_path).path)
        if "\\" in path or "\x00" in path or not path.startswith("/"):
            return None
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") or p.startswith(".") for p in parts):
            return None
        if self.single is not None:
            return self.single if parts in ([], [self.single.name]) else None
        target = self.root.joinpath(*parts) if parts else self.root
        if target.is_dir():
            target = target / "index.html"
        try:
            resolved = target.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        if not resolved.is_file() or not resolved.is_relative_to(self.root):
            return None
        return resolved


class _Handler(BaseHTTPRequestHandler):
    server: LocalServer
    server_version = "headlab"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        path = self.server.resolve(self.path)
        if path is None:
            self.send_error(HTTPStatus.NOT_FOUND, "not found")
            return
        data = path.read_bytes()
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind in ("application/javascript", "application/json"):
            kind += "; charset=utf-8"
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass  # the command prints the address; per-request lines would bury it


def local_server(path: Path, *, port: int = 0) -> LocalServer:
    """A server for ``path`` (a file or a folder) on 127.0.0.1, bound but not yet serving.

    Call ``serve_forever()`` (and ``shutdown()`` from another thread, or Ctrl-C) to run it.

    Args:
        path: an HTML file (only it is served) or a folder (its files are served, ``/`` gives
            ``index.html``).
        port: the TCP port; 0 picks a free one.

    Returns:
        The bound server; ``.url`` is the address to open.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: a port outside 0…65535.
        OSError: the port is taken.
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"port={port}; expected 0 (any free port) to 65535")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: nothing to serve there")
    resolved = path.resolve()
    if resolved.is_dir():
        return LocalServer(resolved, None, port)
    return LocalServer(resolved.parent, resolved, port)



def serve(path: Path, *, port: int = 0, announce: Callable[[str], None] = print) -> None:
    """Serve ``path`` on 127.0.0.1 until Ctrl-C (see ``local_server``).

    Args:
        path: a file or a folder.
        port: the TCP port; 0 picks a free one.
        announce: called once with the address to open, when the server is listening.

    Raises:
        FileNotFoundError, ValueError, OSError: as ``local_server``.
    """
    server = local_server(path, port=port)
    announce(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
