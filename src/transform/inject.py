# trace-train: the Trace environment's debug-print injection.
#
# Runs as a program inside the sandbox (it parses untrusted source). Reads one
# JSON object on stdin:
#   {"source": str, "seeds": [int, ...], "max_injections": 6}
# and prints one JSON object:
#   {"ok": true, "features": {...}, "variants": [{"seed", "code", "injections"}]}
# or {"ok": false, "error": "..."} when the source does not parse.
#
# The rules are the environment's, and so is the order in which the seeded
# generator is consulted, so a seed gives the environment's exact program:
# - the source is stripped of a surrounding markdown fence, parsed, and
#   re-emitted by ast.unparse;
# - bodies of the module, of `for` (body and else), of `if`/`else` and of
#   function definitions are walked statement by statement; every statement
#   first adds the names it binds (assignment, augmented assignment, `for`
#   targets, tuple unpacking included) to the current scope, then is visited
#   (nested bodies are handled first), then, while fewer than the maximum
#   prints were made, an assignment or augmented assignment is followed by a
#   print with probability 0.6 and an `if` statement with probability 0.4;
# - a function definition opens a scope holding its positional parameters;
# - other statements (while, with, try, class, ...) get no prints of their
#   own, but the `for`/`if`/function bodies nested inside them are walked;
# - a print shows the tag __DBG_<n>__ then 1..min(3, live) distinct live
#   names drawn at random, each as repr() for int/float/str/bool/None and as
#   the type's name otherwise.
import ast
import json
import random
import sys

SCALARS = ("int", "float", "str", "bool")


def strip_fence(source):
    text = source.strip()
    if text.startswith("```"):
        nl = text.find("\n")
        if nl != -1:
            text = text[nl:].strip()
        if text.endswith("```"):
            text = text[:-3].strip()
    return text


def shown(name):
    """repr(name) if isinstance(name, (int, float, str, bool, type(None))) else type(name).__name__"""
    kinds = [ast.Name(id=k, ctx=ast.Load()) for k in SCALARS]
    kinds.append(ast.Call(func=ast.Name(id="type", ctx=ast.Load()), args=[ast.Constant(None)], keywords=[]))
    test = ast.Call(
        func=ast.Name(id="isinstance", ctx=ast.Load()),
        args=[ast.Name(id=name, ctx=ast.Load()), ast.Tuple(elts=kinds, ctx=ast.Load())],
        keywords=[],
    )
    as_repr = ast.Call(func=ast.Name(id="repr", ctx=ast.Load()), args=[ast.Name(id=name, ctx=ast.Load())], keywords=[])
    as_type = ast.Attribute(
        value=ast.Call(func=ast.Name(id="type", ctx=ast.Load()), args=[ast.Name(id=name, ctx=ast.Load())], keywords=[]),
        attr="__name__",
        ctx=ast.Load(),
    )
    return ast.IfExp(test=test, body=as_repr, orelse=as_type)


def bound_names(target):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from bound_names(elt)


class Injector(ast.NodeTransformer):
    def __init__(self, seed, limit):
        self.rng = random.Random(seed)
        self.limit = limit
        self.made = 0
        self.scopes = [[]]

    def live(self):
        seen = []
        for scope in self.scopes:
            for name in scope:
                if name not in seen:
                    seen.append(name)
        return seen

    def bind(self, name):
        if name not in self.scopes[-1]:
            self.scopes[-1].append(name)

    def note_bindings(self, stmt):
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, (ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = [stmt.target]
        else:
            return
        for t in targets:
            for name in bound_names(t):
                self.bind(name)

    def debug_print(self):
        names = self.live()
        if not names:
            return None
        k = self.rng.randint(1, min(3, len(names)))
        chosen = self.rng.sample(names, k)
        args = [ast.Constant("__DBG_%d__" % self.made)] + [shown(n) for n in chosen]
        return ast.Expr(value=ast.Call(func=ast.Name(id="print", ctx=ast.Load()), args=args, keywords=[]))

    def walk_body(self, body):
        out = []
        for stmt in body:
            self.note_bindings(stmt)
            out.append(self.visit(stmt))
            if self.made >= self.limit:
                continue
            if isinstance(stmt, (ast.Assign, ast.AugAssign)):
                chance = 0.6
            elif isinstance(stmt, ast.If):
                chance = 0.4
            else:
                continue
            if self.rng.random() < chance:
                p = self.debug_print()
                if p is not None:
                    out.append(p)
                    self.made += 1
        return out

    def visit_Module(self, node):
        node.body = self.walk_body(node.body)
        return node

    def visit_For(self, node):
        node.body = self.walk_body(node.body)
        node.orelse = self.walk_body(node.orelse)
        return node

    def visit_If(self, node):
        node.body = self.walk_body(node.body)
        node.orelse = self.walk_body(node.orelse)
        return node

    def visit_FunctionDef(self, node):
        self.scopes.append([])
        for a in node.args.args:
            self.bind(a.arg)
        node.body = self.walk_body(node.body)
        self.scopes.pop()
        return node

    # Assignments hold no bodies to walk.
    def visit_Assign(self, node):
        return node

    def visit_AugAssign(self, node):
        return node


def loop_depth(node, depth=0):
    best = depth
    for child in ast.iter_child_nodes(node):
        d = depth + 1 if isinstance(child, (ast.For, ast.AsyncFor, ast.While)) else depth
        best = max(best, loop_depth(child, d))
    return best


def features(tree, text):
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    recursive = 0
    for f in funcs:
        if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == f.name for c in ast.walk(f)):
            recursive += 1
    return {
        "lines": len(text.splitlines()),
        "loop_depth": loop_depth(tree),
        "functions": len(funcs),
        "recursive_functions": recursive,
        "classes": sum(isinstance(n, ast.ClassDef) for n in ast.walk(tree)),
        "branches": sum(isinstance(n, ast.If) for n in ast.walk(tree)),
        "try_blocks": sum(isinstance(n, ast.Try) for n in ast.walk(tree)),
        "comprehensions": sum(isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) for n in ast.walk(tree)),
    }


def main():
    req = json.loads(sys.stdin.buffer.read())
    text = strip_fence(req["source"])
    limit = req.get("max_injections", 6)
    try:
        tree = ast.parse(text)
        normalized = ast.unparse(tree)
        feats = features(tree, normalized)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        print(json.dumps({"ok": False, "error": "%s: %s" % (type(e).__name__, e)}))
        return
    variants = []
    for seed in req["seeds"]:
        tree = ast.parse(text)
        inj = Injector(seed, limit)
        tree = inj.visit(tree)
        ast.fix_missing_locations(tree)
        variants.append({"seed": seed, "code": ast.unparse(tree), "injections": inj.made})
    print(json.dumps({"ok": True, "normalized": normalized, "features": feats, "variants": variants}))


main()
