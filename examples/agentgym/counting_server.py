"""A counting game behind AgentGym's protocol, for the protocol's tests
(standard library only; see README.md).

Task k: count from 0 to exactly 3 + k % 4 with the actions `add 1` and
`add 2`. A step that stays below the target earns 0.1, reaching it 1.0
(done, a success), passing it 0 (done, a failure); any other action earns
0 and changes nothing. Its expert (`POST /expert`) adds 2 while that stays
at or below the target, else 1; on data indices 4000-4999 it always adds
2 (an expert that fails where the target is odd).

Faults on request, for the client's tests:
- step actions: `hang` (no answer for --hang seconds), `garbage` (a 200
  whose body is not JSON), `drop` (the connection closed, no answer),
  `crash` (status 500), `wait` (0.2 s, then `add 1`);
- reset data indices: 1000-1999 answer 500 to the first two resets of each
  index, then work; 2000-2999 hang; 3000-3999 answer a different first
  observation every time (a server that cannot replay).
"""

import collections
import sys
import threading
import time

import protocol


class Counting:
    def reset(self, data_idx):
        self.clumsy = 4000 <= data_idx < 5000
        self.target = 3 + data_idx % 4
        self.count = 0
        self.extra = ""
        if 3000 <= data_idx < 4000:
            self.extra = f" (reset at {time.time_ns()})"
        return self.observation()

    def observation(self):
        return f"Count to exactly {self.target}. You are at {self.count}.{self.extra} Actions: add 1, add 2."

    def step(self, action):
        if action == "wait":
            time.sleep(0.2)
            action = "add 1"
        if action not in ("add 1", "add 2"):
            return f"Unknown action `{action}`: say add 1 or add 2. You are at {self.count}.", 0.0, False, False
        self.count += int(action[-1])
        if self.count == self.target:
            return f"You reached {self.target}.", 1.0, True, True
        if self.count > self.target:
            return f"You passed {self.target}.", 0.0, True, False
        return self.observation(), 0.1, False, False

    def expert(self):
        left = self.target - self.count
        add = 2 if left >= 2 or self.clumsy else 1
        return f"add {add}", f"{left} to go, so I add {add}."


HANG = 30.0
resets = collections.Counter()
lock = threading.Lock()


def fault(handler, route, body):
    """Answers the faults of the module header; False for a normal request."""
    what = None
    if route == "/step":
        what = body.get("action")
    elif route == "/reset":
        k = int(body.get("data_idx", 0))
        if 1000 <= k < 2000:
            with lock:
                resets[k] += 1
                if resets[k] <= 2:
                    what = "crash"
        elif 2000 <= k < 3000:
            what = "hang"
    if what == "hang":
        time.sleep(HANG)
        handler.close_connection = True
        return True
    if what == "garbage":
        data = b"<html>not json</html>"
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        return True
    if what == "drop":
        handler.close_connection = True
        handler.connection.shutdown(2)
        return True
    if what == "crash":
        handler.answer({"detail": "internal error"}, 500)
        return True
    return False


if __name__ == "__main__":
    if "--hang" in sys.argv:
        HANG = float(sys.argv[sys.argv.index("--hang") + 1])
        del sys.argv[sys.argv.index("--hang") : sys.argv.index("--hang") + 2]
    sys.exit(protocol.serve("counting", 100, Counting, fault=fault, description=__doc__))
