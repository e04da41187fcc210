"""A local stand-in for the Hugging Face Hub's upload API that records what
it is sent: enough for `trace-train push --endpoint http://127.0.0.1:PORT`
to create a repository, upload its large files through LFS and commit.
Each request is one line of LOG: method, path, body bytes.

    python3 scripts/fake_hub.py PORT LOG
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG = int(sys.argv[1]), sys.argv[2]
BASE = f"http://127.0.0.1:{PORT}"


class Hub(BaseHTTPRequestHandler):
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        with open(LOG, "a") as f:
            f.write(f"{self.command} {self.path} {len(body)}\n")
        p = self.path
        if p == "/api/repos/create":
            out = {"url": f"{BASE}/repo"}
        elif "/preupload/" in p:
            files = json.loads(body)["files"]
            out = {"files": [{"path": f["path"], "shouldIgnore": False,
                              "uploadMode": "lfs" if f["path"].endswith(".safetensors") else "regular"}
                             for f in files]}
        elif p.endswith(".git/info/lfs/objects/batch"):
            objects = json.loads(body)["objects"]
            out = {"transfer": "basic", "objects": [
                {"oid": o["oid"], "size": o["size"],
                 "actions": {"upload": {"href": f"{BASE}/storage/{o['oid']}", "header": {}}}}
                for o in objects]}
        elif "/commit/" in p:
            out = {"commitUrl": f"{BASE}/repo/commit/abc", "commitOid": "abc"}
        else:
            out = {}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = answer

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Hub).serve_forever()
