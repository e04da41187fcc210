"""AgentGym's environment-server protocol on the standard library alone.

A game is a class with `reset(data_idx) -> observation` and
`step(action) -> (observation, reward, done, success)`, and optionally
`expert() -> (action, thought) or None` (a scripted expert's next action,
for demonstrations); `serve` puts one game object a session behind these
routes (JSON in, JSON out):

    GET  /                  {"name", "tasks"}: what the server is
    POST /create            {"id"}: a new session
    POST /reset             {"id", "data_idx"} -> {"observation", "reward", "score", "done"}
    POST /step              {"id", "action"} -> {"observation", "reward", "score", "done", "success"}
    GET  /observation?id=N  {"observation"}
    POST /expert            {"id"} -> {"action", "thought"}: the expert's next
                            action (null where the game has no expert or it
                            knows none); not AgentGym's, which lack the route
    POST /close             {"id"} -> true
    GET  /stats             sessions open now, the most open at once, created, closed

A session's failure is answered as AgentGym's servers answer it: status
200 with {"error": "..."}. `score` is the running total of the rewards.
An episode ends at the game's own end or after --max_steps steps.
"""

import argparse
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class Sessions:
    """The open sessions and the counts /stats reports."""

    def __init__(self, make_game, max_steps):
        self.make_game = make_game
        self.max_steps = max_steps
        self.lock = threading.Lock()
        self.games = {}
        self.next_id = 0
        self.max_open = 0
        self.created = 0
        self.closed = 0

    def create(self):
        with self.lock:
            sid = self.next_id
            self.next_id += 1
            self.games[sid] = {"game": None, "steps": 0, "score": 0.0, "done": False, "obs": ""}
            self.created += 1
            self.max_open = max(self.max_open, len(self.games))
        return {"id": sid}

    def get(self, sid):
        with self.lock:
            if sid not in self.games:
                raise KeyError(f"no session {sid}")
            return self.games[sid]

    def reset(self, sid, data_idx):
        s = self.get(sid)
        s["game"] = self.make_game()
        s["obs"] = s["game"].reset(int(data_idx))
        s.update(steps=0, score=0.0, done=False)
        return {"observation": s["obs"], "reward": 0.0, "score": 0.0, "done": False}

    def step(self, sid, action):
        s = self.get(sid)
        if s["game"] is None:
            raise ValueError(f"session {sid} was never reset")
        if s["done"]:
            raise ValueError(f"session {sid} is done")
        obs, reward, done, success = s["game"].step(action)
        s["steps"] += 1
        s["score"] += reward
        if not done and s["steps"] >= self.max_steps:
            done, success = True, False
            obs += f"\nThe episode ends: {self.max_steps} steps are taken."
        s.update(done=done, obs=obs)
        return {
            "observation": obs,
            "reward": reward,
            "score": s["score"],
            "done": done,
            "success": bool(success),
        }

    def expert(self, sid):
        s = self.get(sid)
        if s["game"] is None:
            raise ValueError(f"session {sid} was never reset")
        expert = getattr(s["game"], "expert", None)
        shown = None if s["done"] or expert is None else expert()
        if shown is None:
            return {"action": None, "thought": ""}
        action, thought = shown
        return {"action": action, "thought": thought}

    def close(self, sid):
        with self.lock:
            if self.games.pop(sid, None) is None:
                return False
            self.closed += 1
            return True

    def stats(self):
        with self.lock:
            return {
                "open": len(self.games),
                "max_open": self.max_open,
                "created": self.created,
                "closed": self.closed,
            }


def serve(name, tasks, make_game, fault=None, argv=None, description=None, hello=None):
    """Serves `make_game`'s sessions on --host/--port (port 0: any free one;
    the first line printed is `listening on PORT`). `fault(route, body)`,
    when given, may answer a request itself (test servers only). `hello`,
    when given, is a dict whose keys are added to the answer of GET /."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max_steps", type=int, default=50)
    args, _ = parser.parse_known_args(argv)
    sessions = Sessions(make_game, args.max_steps)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            # Headers and body go out in separate writes: without this, Nagle's
            # algorithm holds the body for the client's delayed ACK (40 ms).
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *a):
            pass

        def answer(self, value, status=200):
            data = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            url = urlparse(self.path)
            if url.path in ("", "/"):
                return self.answer({"name": name, "tasks": tasks, **(hello or {})})
            if url.path == "/stats":
                return self.answer(sessions.stats())
            if url.path == "/observation":
                try:
                    sid = int(parse_qs(url.query)["id"][0])
                    return self.answer({"observation": sessions.get(sid)["obs"]})
                except Exception as e:  # the protocol's error answer
                    return self.answer({"error": str(e)})
            self.answer({"error": f"no route {url.path}"}, 404)

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError as e:
                return self.answer({"error": f"the body is not JSON: {e}"}, 400)
            route = urlparse(self.path).path
            if fault is not None and fault(self, route, body):
                return
            try:
                if route == "/create":
                    out = sessions.create()
                elif route == "/reset":
                    out = sessions.reset(int(body["id"]), body.get("data_idx", 0))
                elif route == "/step":
                    out = sessions.step(int(body["id"]), str(body["action"]))
                elif route == "/expert":
                    out = sessions.expert(int(body["id"]))
                elif route == "/close":
                    out = sessions.close(int(body["id"]))
                else:
                    return self.answer({"error": f"no route {route}"}, 404)
            except Exception as e:  # the protocol's error answer
                out = {"error": f"{type(e).__name__}: {e}"}
            self.answer(out)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit("protocol.py is imported by the servers beside it")
