"""A Hugging Face hub on 127.0.0.1 serving model directories, for `--download-only` (HF_ENDPOINT=its url).

It answers what huggingface_hub asks of a model repo (checked against the installed version and the calls
bert_squad makes: `model_info`, `snapshot_download` with allow_patterns, and its fallback):
  GET  /api/models/{repo}[/revision/{rev}]           repo info: sha, siblings
  GET  /api/models/{repo}/tree/{rev}[/{path}]        the file listing (path, size, oid), one page
  HEAD /{repo}/resolve/{rev}/{file}                  X-Repo-Commit, ETag, Content-Length
  GET  /{repo}/resolve/{rev}/{file}                  the bytes
Anything else is a 404 with the hub's X-Error-Code, so a new request the library makes shows up as a
failed download (and in `requests`), not as a silent success.
"""

import contextlib
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class Repo:
    """A model directory as a hub repo at one commit (its sha from the files' contents)."""

    def __init__(self, repo_id, folder):
        self.id = repo_id
        self.files = {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}
        self.sha = hashlib.sha1(b"".join(hashlib.sha1(data).digest() for data in self.files.values())).hexdigest()

    def info(self):
        return {
            "_id": self.sha[:24],
            "id": self.id,
            "modelId": self.id,
            "sha": self.sha,
            "private": False,
            "gated": False,
            "disabled": False,
            "tags": [],
            "siblings": [{"rfilename": n} for n in self.files],
        }

    def tree(self):
        return [
            {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
            for name, data in self.files.items()
        ]


def _handler(repos, requests):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # the test reads `requests`, not stderr
            pass

        def _send(self, status, body=b"", headers=(), content_type="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in headers:
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _route(self):
            path = unquote(urlsplit(self.path).path)
            requests.append(f"{self.command} {path}")
            for repo in repos.values():
                api, resolve = f"/api/models/{repo.id}", f"/{repo.id}/resolve/"
                if path == api or path.startswith(f"{api}/revision/"):
                    return self._send(200, json.dumps(repo.info()).encode())
                if path.startswith(f"{api}/tree/"):
                    return self._send(200, json.dumps(repo.tree()).encode())
                if path.startswith(resolve):
                    _, _, name = path[len(resolve) :].partition("/")
                    if name in repo.files:
                        data = repo.files[name]
                        return self._send(
                            200,
                            data,
                            [("X-Repo-Commit", repo.sha), ("ETag", f'"{hashlib.sha256(data).hexdigest()}"')],
                            content_type="application/octet-stream",
                        )
            self._send(404, b'{"error": "Repository not found"}', [("X-Error-Code", "RepoNotFound")])

        do_GET = do_HEAD = _route

    return Handler


@contextlib.contextmanager
def hub(models):
    """Serve {repo_id: model directory} until the `with` ends; yields (url, the requests seen)."""
    repos = {repo_id: Repo(repo_id, folder) for repo_id, folder in models.items()}
    requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(repos, requests))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
