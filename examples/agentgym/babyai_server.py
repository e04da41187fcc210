"""BabyAI behind AgentGym's protocol, over PyPI's `minigrid` (which holds
BabyAI's levels). See README.md.

Data index k is level LEVELS[k % L] seeded with k // L (AgentGym's server
maps its indices so, over its 40 levels; --levels picks others). The agent
sees its egocentric view as text: each visible object named by colour and
kind, numbered by distance ("red ball 1"), with its steps in front and to
the side, the wall or box it faces, what it carries; then the actions
possible now, in AgentGym's vocabulary: turn left, turn right, move
forward, go to <object> <n>, pick up <object> <n>, drop, go through <door>
<n>, toggle and go through <door> <n>, toggle, check available actions. A
high-level action runs as minigrid's primitive actions along a shortest
path.

Its expert (`POST /expert`, for demonstrations): where the goal is to go
to or pick up an object and one that fits is in view, that one action;
else the next move of minigrid's BabyAI bot (`minigrid.utils.baby_ai_bot`),
in the same vocabulary. The bot is made at the first `expert` call of an
episode and then told of every primitive action taken.

Reward: 1.0 on the step that reaches the level's goal (done, a success),
0 otherwise (the Affine guide's BabyAI reward; minigrid's own reward,
shrinking with the steps taken, decides only whether the goal is met). An
episode also ends, a failure, when minigrid's step limit is met or after
--max_steps actions.
"""

import collections
import sys
import warnings

warnings.filterwarnings("ignore")  # gymnasium warns of every re-registered level

import gymnasium as gym  # noqa: E402
import minigrid  # noqa: E402,F401  (registers the BabyAI levels)
from minigrid.envs.babyai.core.verifier import GoToInstr, PickupInstr  # noqa: E402
from minigrid.utils.baby_ai_bot import BabyAIBot  # noqa: E402

import protocol  # noqa: E402

# AgentGym's level list, in its order (the data index's meaning); minigrid
# 3 retired GoToObjS6-v0 for v1.
LEVELS = [
    "BabyAI-GoToRedBallGrey-v0", "BabyAI-GoToRedBall-v0", "BabyAI-GoToRedBallNoDists-v0",
    "BabyAI-GoToObjS6-v1", "BabyAI-GoToLocalS8N7-v0", "BabyAI-GoToObjMazeS7-v0",
    "BabyAI-GoToImpUnlock-v0", "BabyAI-GoToSeqS5R2-v0", "BabyAI-GoToRedBlueBall-v0",
    "BabyAI-GoToDoor-v0", "BabyAI-GoToObjDoor-v0", "BabyAI-Open-v0", "BabyAI-OpenRedDoor-v0",
    "BabyAI-OpenDoorLoc-v0", "BabyAI-OpenRedBlueDoorsDebug-v0", "BabyAI-OpenDoorsOrderN4Debug-v0",
    "BabyAI-Pickup-v0", "BabyAI-UnblockPickup-v0", "BabyAI-PickupLoc-v0",
    "BabyAI-PickupDistDebug-v0", "BabyAI-PickupAbove-v0", "BabyAI-PutNextLocalS6N4-v0",
    "BabyAI-PutNextS7N4Carrying-v0", "BabyAI-Unlock-v0", "BabyAI-UnlockLocalDist-v0",
    "BabyAI-KeyInBox-v0", "BabyAI-UnlockPickupDist-v0", "BabyAI-BlockedUnlockPickup-v0",
    "BabyAI-UnlockToUnlock-v0", "BabyAI-ActionObjDoor-v0", "BabyAI-FindObjS7-v0",
    "BabyAI-KeyCorridorS6R3-v0", "BabyAI-OneRoomS20-v0", "BabyAI-MoveTwoAcrossS8N9-v0",
    "BabyAI-SynthS5R2-v0", "BabyAI-SynthLoc-v0", "BabyAI-SynthSeq-v0",
    "BabyAI-MiniBossLevel-v0", "BabyAI-BossLevel-v0", "BabyAI-BossLevelNoUnlock-v0",
]

LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE = 0, 1, 2, 3, 4, 5
DIRS = [(1, 0), (0, 1), (-1, 0), (0, -1)]  # minigrid's: right, down, left, up
DOOR_STATES = {(True, False): "open", (False, False): "closed", (False, True): "locked"}


def passable(cell):
    return cell is None or cell.can_overlap()


class BabyAI:
    levels = LEVELS

    def reset(self, data_idx):
        level = self.levels[data_idx % len(self.levels)]
        self.env = gym.make(level)
        self.env.reset(seed=data_idx // len(self.levels))
        self.u = self.env.unwrapped
        self.bot = None  # made at the first expert() call
        self.actions = self.possible()
        return f"Your goal: {self.u.mission}\n{self.describe()}{self.listing()}"

    # What the agent sees.
    def visible(self):
        """(name, (x, y), obj) of each visible object, nearest first."""
        _, mask = self.u.gen_obs_grid()
        ax, ay = self.u.agent_pos
        seen = []
        for x in range(self.u.grid.width):
            for y in range(self.u.grid.height):
                obj = self.u.grid.get(x, y)
                if obj is None or obj.type not in ("door", "key", "ball", "box", "goal"):
                    continue
                v = self.u.get_view_coords(x, y)
                if v is None or not self.u.in_view(x, y) or not mask[v[0], v[1]]:
                    continue
                if obj.type == "door":
                    name = f"{obj.color} {DOOR_STATES[(obj.is_open, obj.is_locked)]} door"
                else:
                    name = f"{obj.color} {obj.type}"
                seen.append((abs(x - ax) + abs(y - ay), name, (x, y), obj))
        seen.sort(key=lambda s: (s[0], s[2]))
        counts = collections.Counter()
        out = []
        for _, name, pos, obj in seen:
            counts[name] += 1
            out.append((f"{name} {counts[name]}", pos, obj))
        return out

    def describe(self):
        ax, ay = self.u.agent_pos
        fx, fy = DIRS[self.u.agent_dir]
        rx, ry = DIRS[(self.u.agent_dir + 1) % 4]
        parts = []
        for name, (x, y), _ in self.visible():
            front = (x - ax) * fx + (y - ay) * fy
            right = (x - ax) * rx + (y - ay) * ry
            if right == 0:
                where = f"right in front of you {front} steps away"
            else:
                side = "right" if right > 0 else "left"
                where = f"{front} steps in front of you and {abs(right)} steps to your {side}"
            parts.append(f"There is a {name} {where}.")
        text = ("In front of you, you see: " + " ".join(parts)) if parts else "You cannot see any objects."
        steps, (x, y) = 1, (ax + fx, ay + fy)
        while passable(self.u.grid.get(x, y)):
            steps, x, y = steps + 1, x + fx, y + fy
        blocker = self.u.grid.get(x, y)
        text += f" You are facing a {blocker.type} {steps} steps away."
        c = self.u.carrying
        text += f" You are carrying a {c.color} {c.type}." if c else " You are not carrying anything."
        return text

    def listing(self):
        return "\nAvailable actions: [" + ", ".join(f'"{a}"' for a in self.actions) + "]"

    # What the agent can do.
    def path_to_face(self, target):
        """Primitive actions that end facing `target`, or None."""
        start = (*self.u.agent_pos, self.u.agent_dir)
        back = {start: None}
        queue = collections.deque([start])
        while queue:
            x, y, d = state = queue.popleft()
            if (x + DIRS[d][0], y + DIRS[d][1]) == target:
                path = []
                while back[state] is not None:
                    state, a = back[state]
                    path.append(a)
                return path[::-1]
            nx, ny = x + DIRS[d][0], y + DIRS[d][1]
            moves = [(LEFT, (x, y, (d - 1) % 4)), (RIGHT, (x, y, (d + 1) % 4))]
            if passable(self.u.grid.get(nx, ny)):
                moves.append((FORWARD, (nx, ny, d)))
            for a, nxt in moves:
                if nxt not in back:
                    back[nxt] = (state, a)
                    queue.append(nxt)
        return None

    def possible(self):
        ax, ay = self.u.agent_pos
        fx, fy = DIRS[self.u.agent_dir]
        front = self.u.grid.get(ax + fx, ay + fy)
        acts = {"turn left": [LEFT], "turn right": [RIGHT]}
        if passable(front):
            acts["move forward"] = [FORWARD]
        for name, pos, obj in self.visible():
            path = self.path_to_face(pos)
            if path is None:
                continue
            acts[f"go to {name}"] = path
            if obj.type in ("key", "ball", "box") and self.u.carrying is None:
                acts[f"pick up {name}"] = path + [PICKUP]
            if obj.type == "door":
                if obj.is_open:
                    acts[f"go through {name}"] = path + [FORWARD, FORWARD]
                else:
                    acts[f"toggle and go through {name}"] = path + [TOGGLE, FORWARD, FORWARD]
        if front is not None and front.type == "door":
            acts["toggle"] = [TOGGLE]
        if self.u.carrying is not None and front is None:
            acts["drop"] = [DROP]
        acts["check available actions"] = []
        return acts

    def step(self, action):
        action = " ".join(action.lower().split()).replace("pickup ", "pick up ")
        if action == "check available actions":
            return "You can take the following actions: " + ", ".join(self.actions) + self.listing(), 0.0, False, False
        if action not in self.actions:
            return "The action is not recognized. Please check valid actions." + self.listing(), 0.0, False, False
        for a in self.actions[action]:
            _, reward, terminated, truncated, _ = self.env.step(a)
            if self.bot is not None and not (terminated or truncated):
                self.tell_bot(a)
            if terminated or truncated:
                if reward > 0:
                    return "The task is completed.", 1.0, True, True
                return "The episode ends: the level's step limit is met.", 0.0, True, False
        self.actions = self.possible()
        return self.describe() + self.listing(), 0.0, False, False

    # The expert.
    def tell_bot(self, taken=None):
        """The bot's next primitive action after `taken` (None: its own
        suggestion); a bot that fails is dropped (no expert after that)."""
        try:
            self.suggested = self.bot.replan(taken)
        except Exception:  # the bot asserts on states it does not plan for
            self.bot, self.suggested = False, None

    def expert(self):
        instrs = self.u.instrs
        if isinstance(instrs, (GoToInstr, PickupInstr)):
            verb = "go to" if isinstance(instrs, GoToInstr) else "pick up"
            for name, _, obj in self.visible():
                if obj in instrs.desc.obj_set and f"{verb} {name}" in self.actions:
                    return f"{verb} {name}", f"I can see the {name.rsplit(' ', 1)[0]} my goal names, so I {verb} it."
        if self.bot is None:
            self.bot = BabyAIBot(self.u)
            self.tell_bot()
        if not self.bot or self.suggested is None:
            return None
        acts = self.u.actions
        action = {acts.left: "turn left", acts.right: "turn right", acts.forward: "move forward",
                  acts.toggle: "toggle", acts.drop: "drop"}.get(self.suggested)
        if self.suggested == acts.pickup:
            ax, ay = self.u.agent_pos
            fx, fy = DIRS[self.u.agent_dir]
            action = next((f"pick up {name}" for name, pos, _ in self.visible() if pos == (ax + fx, ay + fy)), None)
        if action not in self.actions:
            return None
        return action, f"I do not see how to reach my goal from here yet, so I {action}."


if __name__ == "__main__":
    if "--levels" in sys.argv:
        i = sys.argv.index("--levels")
        BabyAI.levels = sys.argv[i + 1].split(",")
        del sys.argv[i : i + 2]
    for level in BabyAI.levels:
        gym.spec(level)  # an unknown level fails here, by name
    sys.exit(protocol.serve("babyai", len(BabyAI.levels) * 1000, BabyAI, description=__doc__))
