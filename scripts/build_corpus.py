#!/usr/bin/env python3
"""Builds the corpus (`--dataset corpus`): stdin programs made from public,
permissively licensed sources, as rl-python rows.

Run by the project's maintainers, never by `trace-train` itself:

    python3 scripts/build_corpus.py \
        --algorithms PATH/TO/TheAlgorithms-Python \
        --mbpp PATH/TO/mbpp.jsonl \
        --keon PATH/TO/keon-algorithms \
        --exercism PATH/TO/exercism-python \
        --humaneval target/fixtures/HumanEval.jsonl.gz \
        --trace_train target/release/trace-train \
        --out datasets/corpus

Sources (pinned in SOURCES below; datasets/corpus/LICENSES.md says more):
- TheAlgorithms/Python (MIT): every top-level function whose docstring has
  doctest calls on literal arguments becomes a program: the function and
  what it needs from its module (docstrings dropped, so the expected
  answers are not in the program), then a driver that reads the calls'
  arguments from stdin and prints each result. Modules whose
  `if __name__ == "__main__":` block prints without reading stdin become
  programs as they are (docstrings and doctest calls dropped, no stdin).
  Classes' doctests, and functions' whose calls are not literal, become
  scripts: the definitions they need, then the examples in order, each
  shown value printed (no stdin).
- MBPP (CC BY 4.0): each task's code, then a driver that reads the
  arguments of its test asserts' calls from stdin and prints the results.
- keon/algorithms and exercism/python's example solutions (MIT): each
  function called by the unit tests on literal arguments, what it needs
  from its module, and a driver for those calls.

Every candidate runs twice with /usr/bin/python3 (two hash seeds, a time
and memory limit) and is kept only when it exits 0 with nothing on stderr,
prints something, prints the same both times and takes under --max_seconds
of CPU time (10 s of wall time at most);
then once more in the project's sandbox through `trace-train generate`,
which must reproduce the recorded output. Programs are deduplicated by
their normalised source (ast.unparse, docstrings dropped) against each
other and against the built-in corpus, the held-out short set, the DED
built-in set and HumanEval, whose functions are also compared one by one.

Writes OUT/PART.jsonl.gz for each source (rows: id, source,
license, program, inputs, output; gzip with a fixed mtime, rows sorted by
id) and OUT/build_report.json (counts kept and dropped, by reason).
"""

from __future__ import annotations

import argparse
import ast
import collections
import concurrent.futures
import doctest
import gzip
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

PYTHON = "/usr/bin/python3"

SOURCES = {
    "algorithms": {
        "name": "TheAlgorithms/Python",
        "license": "MIT",
        "commit": "f5988cc09713315817df6a7e327e258013a94440",
    },
    "mbpp": {
        "name": "MBPP (google-research/google-research, mbpp/mbpp.jsonl)",
        "license": "CC-BY-4.0",
        "commit": "30adf0ec5f35f9609c2f1d896005e184195d9146",
        "sha256": "ccf64ceae9c5403bf50a044cb6d505bfd2a2963ee58338ba268fd65beab92a9f",
    },
    "keon": {
        "name": "keon/algorithms",
        "license": "MIT",
        "commit": "a1bf1f39f95b59ed0bb348d6148c7e097e10481e",
    },
    "exercism": {
        "name": "exercism/python",
        "license": "MIT",
        "commit": "9eb657d4507d91efef99f484e7f2a1f4074911b5",
    },
}

# Folders of TheAlgorithms/Python left out whole: network, files, images.
SKIP_DIRS = {
    "web_programming",
    "file_transfer",
    "scripts",
    "docs",
    "digital_image_processing",
    "computer_vision",
    "audio_filters",
    "neural_network",
    "machine_learning",
    "quantum",
    "graphics",
    "fractals",
}

# Standard modules a corpus program may not import: processes, files,
# network, clocks, randomness, interactive or platform-dependent output.
DENIED_MODULES = {
    "os", "subprocess", "socket", "urllib", "http", "threading",
    "multiprocessing", "asyncio", "time", "datetime", "random", "secrets",
    "uuid", "tempfile", "shutil", "pathlib", "glob", "pickle", "shelve",
    "sqlite3", "tkinter", "turtle", "webbrowser", "ssl", "email", "smtplib",
    "ftplib", "platform", "getpass", "signal", "ctypes", "concurrent",
    "timeit", "unittest", "doctest", "pdb", "cProfile", "profile",
    "tracemalloc", "gc", "inspect", "importlib", "zipfile", "tarfile",
    "gzip", "bz2", "lzma", "csv", "io", "logging", "warnings", "locale",
    "calendar", "zoneinfo", "hashlib", "hmac", "mmap", "select", "selectors",
    "pty", "tty", "termios", "curses", "readline", "code", "codeop",
    "sched",
}

# Builtins a corpus program may not call.
DENIED_NAMES = {
    "open", "exec", "eval", "compile", "__import__", "breakpoint",
    "globals", "vars", "id", "hash", "memoryview", "help",
}


# ---------------------------------------------------------------- helpers


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """Drops the docstring of the module and of every class and function."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                body = body[1:]
                if not body and not isinstance(node, ast.Module):
                    body = [ast.Pass()]
                node.body = body
    return tree


def normalize(source: str) -> str | None:
    """ast.unparse of the source without docstrings (None: does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return ast.unparse(strip_docstrings(tree))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def function_digests(source: str) -> set[str]:
    """The normalised text of each function defined anywhere in a program."""
    try:
        tree = strip_docstrings(ast.parse(source))
    except (SyntaxError, ValueError):
        return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(digest(ast.unparse(node)))
    return out


def top_module(name: str) -> str:
    return name.split(".")[0]


def imported_modules(tree: ast.AST) -> set[str]:
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(top_module(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                mods.add(".")
            elif node.module:
                mods.add(top_module(node.module))
    return mods


def import_problem(tree: ast.AST) -> str | None:
    for mod in sorted(imported_modules(tree)):
        if mod == "__future__":
            continue
        if mod == "." or mod not in sys.stdlib_module_names:
            return "non_stdlib_import"
        if mod in DENIED_MODULES:
            return "denied_import"
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in DENIED_NAMES:
            return "denied_builtin"
    return None


def lit(value) -> str:
    """repr, with the items of sets written in sorted order, so that the
    text does not depend on the hash seed of the process writing it."""
    if isinstance(value, (set, frozenset)):
        items = sorted((lit(v) for v in value))
        if not items:
            return "set()" if isinstance(value, set) else "frozenset()"
        body = "{" + ", ".join(items) + "}"
        return body if isinstance(value, set) else f"frozenset({body})"
    if isinstance(value, list):
        return "[" + ", ".join(lit(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(lit(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in value.items()) + "}"
    return repr(value)


def literal_ok(value) -> bool:
    """A value whose text (`lit`) reads back equal through ast.literal_eval."""
    try:
        back = ast.literal_eval(lit(value))
        return back == value and lit(back) == lit(value)
    except Exception:
        return False


# ---------------------------------------------------------------- drivers

BUILTIN_NAMES = set(dir(__builtins__)) | {"ast", "sys", "lines", "t", "i", "_"}


def arg_kind(values: list) -> str:
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if all(isinstance(v, float) for v in values):
        return "float"
    if all(
        isinstance(v, str)
        and v == v.strip()
        and v.isprintable()
        for v in values
    ):
        return "str"
    if all(isinstance(v, list) for v in values):
        items = [x for v in values for x in v]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            return "ints"
        if all(isinstance(x, float) for x in items) and items:
            return "floats"
        if all(isinstance(x, str) and x and x.isprintable() and len(x.split()) == 1 and x == x.strip() for x in items) and items:
            return "words"
    return "literal"


def line_of(kind: str, value) -> str:
    if kind in ("int", "bool"):
        return str(value)
    if kind == "float":
        return repr(value)
    if kind == "str":
        return value
    if kind == "ints":
        return " ".join(str(x) for x in value)
    if kind == "floats":
        return " ".join(repr(x) for x in value)
    if kind == "words":
        return " ".join(value)
    return lit(value)


def read_expr(kind: str, src: str) -> str:
    return {
        "int": f"int({src})",
        "float": f"float({src})",
        "bool": f'{src} == "True"',
        "str": src,
        "ints": f"list(map(int, {src}.split()))",
        "floats": f"list(map(float, {src}.split()))",
        "words": f"{src}.split()",
        "literal": f"ast.literal_eval({src})",
    }[kind]


def make_driver(func: str, params: list[str], calls: list[tuple], shape: str, taken: set[str]):
    """The driver text and the stdin for calls of `func` with these
    positional arguments, or None when the calls do not fit one shape."""
    arity = {len(c) for c in calls}
    if len(arity) != 1:
        return None
    (n,) = arity
    if n == 0:
        return None
    kinds = [arg_kind([c[i] for c in calls]) for i in range(n)]
    names = []
    for i in range(n):
        p = params[i] if i < len(params) else ""
        if not p.isidentifier() or p in BUILTIN_NAMES or p in taken or p in names or p == func:
            p = "abcdefghjk"[i] if i < 10 else f"x{i}"
            if p in taken or p in names or p in params or p == func:
                p = f"arg{i}"
        names.append(p)
    if shape == "single":
        calls = calls[:1]
    src = "next(lines)" if shape == "lines" else "input()"
    body = []
    if all(k == "int" for k in kinds) and n > 1:
        body.append(f"{', '.join(names)} = map(int, {src}.split())")
        case_lines = [[" ".join(str(v) for v in c)] for c in calls]
    else:
        for name, kind in zip(names, kinds):
            body.append(f"{name} = {read_expr(kind, src)}")
        case_lines = [[line_of(k, v) for k, v in zip(kinds, c)] for c in calls]
    call = f"{func}({', '.join(names)})"
    head = []
    if "literal" in kinds:
        head.append("import ast")
    if shape == "lines":
        head.append("import sys")
        head.append("lines = iter(sys.stdin.read().splitlines())")
        loop = "for _ in range(int(next(lines))):"
        body.append(f"print({call})")
    elif shape == "loop":
        head.append("t = int(input())")
        loop = "for _ in range(t):"
        body.append(f"print({call})")
    elif shape == "cases":
        head.append("t = int(input())")
        loop = "for i in range(1, t + 1):"
        body.append(f"print(f'Case #{{i}}:', {call})")
    else:
        loop = None
        body.append(f"print({call})")
    if loop:
        text = "\n".join(head + [loop] + ["    " + b for b in body])
        stdin_lines = [str(len(calls))] + [l for c in case_lines for l in c]
    else:
        text = "\n".join(head + body)
        stdin_lines = [l for c in case_lines for l in c]
    if any("\n" in l or "\r" in l for l in stdin_lines):
        return None
    return text + "\n", "\n".join(stdin_lines) + "\n"


def shape_for(key: str) -> str:
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100
    if h < 35:
        return "loop"
    if h < 55:
        return "lines"
    if h < 85:
        return "single"
    return "cases"


def literal_call(node: ast.AST, funcs: set[str]):
    """(name, args) of a call `name(literal, ...)` to one of `funcs`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    if node.func.id not in funcs or node.keywords:
        return None
    args = []
    for a in node.args:
        if isinstance(a, ast.Starred):
            return None
        try:
            v = ast.literal_eval(a)
        except Exception:
            return None
        if not literal_ok(v):
            return None
        args.append(v)
    return node.func.id, tuple(args)


def positional_params(fn: ast.FunctionDef):
    a = fn.args
    if a.vararg or a.kwarg or a.kwonlyargs and any(d is None for d in a.kw_defaults):
        return None
    params = [p.arg for p in a.posonlyargs + a.args]
    required = len(params) - len(a.defaults)
    return params, required


def assigned_names(node: ast.AST) -> set[str]:
    names = set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(node.name)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for a in node.names:
            names.add((a.asname or a.name).split(".")[0])
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    names.add(n.id)
    return names


def used_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def closure(module: ast.Module, root: ast.stmt) -> list[ast.stmt] | None:
    """The top-level statements `root` needs (definitions, assignments,
    imports), in module order; None when a needed name is only bound by a
    statement of another kind."""
    defs = {}
    for stmt in module.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)):
            for name in assigned_names(stmt):
                defs.setdefault(name, []).append(stmt)
    keep = {id(root)} if root in module.body else set()
    todo = [root]
    while todo:
        stmt = todo.pop()
        for name in used_names(stmt):
            for d in defs.get(name, []):
                if id(d) not in keep:
                    keep.add(id(d))
                    todo.append(d)
    out = [
        s
        for s in module.body
        if id(s) in keep
        or (isinstance(s, ast.ImportFrom) and s.module == "__future__")
    ]
    return out


# ------------------------------------------------------------ candidates


class Drops(collections.Counter):
    """Counts by reason: `SOURCE_REASON` for a dropped candidate,
    `total_...` for what was seen."""


def algorithms_candidates(root: Path, drops: Drops):
    parser = doctest.DocTestParser()
    files = sorted(p for p in root.rglob("*.py") if p.is_file())
    for path in files:
        rel = path.relative_to(root).as_posix()
        top = rel.split("/")[0]
        if top in SKIP_DIRS or "/" not in rel or path.name.startswith("test_") or path.name == "__init__.py":
            drops["algorithms_file_skipped_folder"] += 1
            continue
        try:
            text = path.read_text(encoding="utf-8")
            module = ast.parse(text)
        except (SyntaxError, ValueError, UnicodeDecodeError):
            drops["algorithms_file_does_not_parse"] += 1
            continue
        for fn in module.body:
            if isinstance(fn, ast.ClassDef):
                session = session_program(module, fn, rel, parser, drops)
                if session:
                    yield session
                continue
            if not isinstance(fn, ast.FunctionDef):
                continue
            doc = ast.get_docstring(fn)
            if not doc or ">>>" not in doc:
                continue
            drops["total_algorithms_functions_with_doctests"] += 1
            sig = positional_params(fn)
            if sig is None:
                drops["algorithms_signature_not_positional"] += 1
                continue
            params, required = sig
            calls = []
            try:
                examples = parser.get_examples(doc)
            except ValueError:
                drops["algorithms_doctest_unreadable"] += 1
                continue
            for ex in examples:
                if ex.want.startswith("Traceback") or ex.exc_msg:
                    continue
                try:
                    expr = ast.parse(ex.source.strip(), mode="eval").body
                except SyntaxError:
                    continue
                found = literal_call(expr, {fn.name})
                if found and required <= len(found[1]) <= len(params):
                    if found[1] not in calls:
                        calls.append(found[1])
            if not calls:
                drops["algorithms_no_literal_doctest_call"] += 1
                session = session_program(module, fn, rel, parser, drops)
                if session:
                    yield session
                continue
            arities = collections.Counter(len(c) for c in calls)
            n = arities.most_common(1)[0][0]
            calls = [c for c in calls if len(c) == n][:8]
            needed = closure(module, fn)
            sub = ast.Module(body=[_copy(s) for s in needed], type_ignores=[])
            strip_docstrings(sub)
            problem = import_problem(sub)
            if problem:
                drops[f"algorithms_{problem}"] += 1
                continue
            if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "input" for n in ast.walk(sub)):
                drops["algorithms_reads_input_itself"] += 1
                continue
            body = ast.unparse(sub)
            taken = set()
            for s in sub.body:
                taken |= assigned_names(s)
            key = f"algorithms/{rel}:{fn.name}"
            made = make_driver(fn.name, params, calls, shape_for(key), taken)
            if made is None:
                drops["algorithms_arguments_not_one_shape"] += 1
                continue
            driver, stdin = made
            yield {
                "id": key,
                "source": "algorithms",
                "body": body,
                "program": body + "\n\n\n" + driver,
                "inputs": stdin,
            }
        main = main_program(module, rel, drops)
        if main:
            yield main


def session_program(module: ast.Module, node, rel: str, parser, drops: Drops):
    """A function's or class's doctest examples replayed as a script after
    the definitions they need: statements as written, an expression the
    doctest shows a value for printed, examples that raise left out. No
    stdin."""
    docs = [ast.get_docstring(node) or ""]
    if isinstance(node, ast.ClassDef):
        docs += [
            ast.get_docstring(m) or ""
            for m in node.body
            if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
    statements = []
    for doc in docs:
        if ">>>" not in doc:
            continue
        try:
            examples = parser.get_examples(doc)
        except ValueError:
            continue
        for ex in examples:
            if ex.want.startswith("Traceback") or ex.exc_msg:
                continue
            try:
                tree = ast.parse(ex.source)
            except SyntaxError:
                continue
            if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr) and ex.want.strip():
                value = tree.body[0].value
                if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print"):
                    tree.body[0] = ast.Expr(ast.Call(ast.Name("print", ast.Load()), [value], []))
            statements.extend(tree.body)
    if not statements:
        return None
    drops["total_algorithms_doctest_sessions"] += 1
    if not any(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name) and s.value.func.id == "print" for s in statements):
        drops["algorithms_session_prints_nothing"] += 1
        return None
    if len(statements) > 40:
        drops["algorithms_session_too_long"] += 1
        return None
    script = ast.Module(body=statements, type_ignores=[])
    ast.fix_missing_locations(script)
    needed = closure(module, ast.Module(body=[node] + statements, type_ignores=[]))
    sub = ast.Module(body=[_copy(s) for s in needed], type_ignores=[])
    strip_docstrings(sub)
    whole = ast.Module(body=sub.body + script.body, type_ignores=[])
    problem = import_problem(whole)
    if problem:
        drops[f"algorithms_session_{problem}"] += 1
        return None
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "input" for n in ast.walk(whole)):
        drops["algorithms_session_reads_input"] += 1
        return None
    body = ast.unparse(sub)
    return {
        "id": f"algorithms/{rel}:{node.name}:doctest",
        "source": "algorithms",
        "body": body + "\n" + ast.unparse(script),
        "program": body + "\n\n\n" + ast.unparse(script) + "\n",
        "inputs": "",
    }


def _copy(node):
    """A fresh copy of a statement (its docstrings may then be dropped)."""
    return ast.parse(ast.unparse(node)).body[0]


def is_main_guard(stmt) -> bool:
    if not isinstance(stmt, ast.If):
        return False
    t = stmt.test
    return (
        isinstance(t, ast.Compare)
        and isinstance(t.left, ast.Name)
        and t.left.id == "__name__"
        and len(t.comparators) == 1
        and isinstance(t.comparators[0], ast.Constant)
        and t.comparators[0].value == "__main__"
    )


def main_program(module: ast.Module, rel: str, drops: Drops):
    """The module run as a script, when its main block prints without
    reading stdin: docstrings, doctest calls and doctest imports dropped."""
    guards = [s for s in module.body if is_main_guard(s)]
    if not guards:
        return None
    tree = ast.parse(ast.unparse(module))
    strip_docstrings(tree)

    class DropDoctest(ast.NodeTransformer):
        def visit_Expr(self, node):
            f = node.value.func if isinstance(node.value, ast.Call) else None
            while isinstance(f, ast.Attribute):
                f = f.value
            if isinstance(f, ast.Name) and f.id in ("doctest", "testmod"):
                return None
            return node

        def visit_Import(self, node):
            node.names = [a for a in node.names if a.name != "doctest"]
            return node if node.names else None

        def visit_ImportFrom(self, node):
            return None if node.module == "doctest" else node

    tree = DropDoctest().visit(tree)
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(node, field, None), list) and not getattr(node, field) and field == "body":
                setattr(node, field, [ast.Pass()])
    ast.fix_missing_locations(tree)
    guard = [s for s in tree.body if is_main_guard(s)]
    if not guard:
        return None
    if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print" for g in guard for n in ast.walk(g)):
        drops["algorithms_main_prints_nothing"] += 1
        return None
    drops["total_algorithms_main_blocks_that_print"] += 1
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "input" for n in ast.walk(tree)):
        drops["algorithms_main_reads_input"] += 1
        return None
    problem = import_problem(tree)
    if problem:
        drops[f"algorithms_main_{problem}"] += 1
        return None
    program = ast.unparse(tree) + "\n"
    return {
        "id": f"algorithms/{rel}:__main__",
        "source": "algorithms",
        "body": program,
        "program": program,
        "inputs": "",
    }


def raising_calls(tree: ast.AST) -> set[int]:
    """ids of the calls inside `with self.assertRaises(...)` or
    `pytest.raises` blocks: they are meant to raise."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any(
            isinstance(item.context_expr, ast.Call)
            and isinstance(item.context_expr.func, ast.Attribute)
            and item.context_expr.func.attr in ("assertRaises", "assertRaisesRegex", "raises")
            for item in node.items
        ):
            out.update(id(n) for n in ast.walk(node) if isinstance(n, ast.Call))
    return out


def test_file_candidates(source: str, key_of, modules: dict[str, ast.Module], tests: list[ast.Module], drops: Drops):
    """Programs from a solution module and unit tests that call its
    functions on literal arguments (calls meant to raise left out): each
    function with such calls, what it needs from its module, and a driver.
    `modules` maps a function name to the module defining it."""
    calls = collections.defaultdict(list)
    for tree in tests:
        raising = raising_calls(tree)
        for node in ast.walk(tree):
            if id(node) in raising:
                continue
            found = literal_call(node, set(modules))
            if found and found[1] not in calls[found[0]]:
                calls[found[0]].append(found[1])
    for name in sorted(calls):
        module = modules[name]
        fn = next(s for s in module.body if isinstance(s, ast.FunctionDef) and s.name == name)
        drops[f"total_{source}_functions_called_by_tests"] += 1
        sig = positional_params(fn)
        if sig is None:
            drops[f"{source}_signature_not_positional"] += 1
            continue
        params, required = sig
        cs = [c for c in calls[name] if required <= len(c) <= len(params)]
        if not cs:
            drops[f"{source}_no_literal_test_call"] += 1
            continue
        n = collections.Counter(len(c) for c in cs).most_common(1)[0][0]
        cs = [c for c in cs if len(c) == n][:8]
        sub = ast.Module(body=[_copy(s) for s in closure(module, fn)], type_ignores=[])
        strip_docstrings(sub)
        problem = import_problem(sub)
        if problem:
            drops[f"{source}_{problem}"] += 1
            continue
        if any(isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and x.func.id == "input" for x in ast.walk(sub)):
            drops[f"{source}_reads_input_itself"] += 1
            continue
        body = ast.unparse(sub)
        taken = set()
        for st in sub.body:
            taken |= assigned_names(st)
        key = key_of(name)
        made = make_driver(name, params, cs, shape_for(key), taken)
        if made is None:
            drops[f"{source}_arguments_not_one_shape"] += 1
            continue
        driver, stdin = made
        yield {"id": key, "source": source, "body": body, "program": body + "\n\n\n" + driver, "inputs": stdin}


def parse_file(path: Path):
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return None


def keon_candidates(root: Path, drops: Drops):
    """keon/algorithms: functions under algorithms/ called by tests/."""
    defined = collections.defaultdict(list)
    for path in sorted((root / "algorithms").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = parse_file(path)
        if tree is None:
            drops["keon_file_does_not_parse"] += 1
            continue
        for st in tree.body:
            if isinstance(st, ast.FunctionDef):
                defined[st.name].append((path.relative_to(root).as_posix(), tree))
    modules, where = {}, {}
    for name, places in defined.items():
        if len(places) == 1:
            where[name], modules[name] = places[0]
        else:
            drops["keon_function_name_defined_twice"] += 1
    tests = [t for t in (parse_file(p) for p in sorted((root / "tests").glob("test_*.py"))) if t]
    yield from test_file_candidates("keon", lambda n: f"keon/{where[n]}:{n}", modules, tests, drops)


def exercism_candidates(root: Path, drops: Drops):
    """exercism/python: each practice exercise's example solution, its
    functions called by the exercise's tests."""
    for ex in sorted((root / "exercises/practice").iterdir()):
        solution = parse_file(ex / ".meta/example.py")
        tests = [t for t in (parse_file(p) for p in sorted(ex.glob("*_test.py"))) if t]
        drops["total_exercism_exercises"] += 1
        if solution is None or not tests:
            drops["exercism_no_solution_or_tests"] += 1
            continue
        modules = {st.name: solution for st in solution.body if isinstance(st, ast.FunctionDef)}
        slug = ex.name
        yield from test_file_candidates("exercism", lambda n, slug=slug: f"exercism/{slug}:{n}", modules, tests, drops)


def mbpp_candidates(path: Path, drops: Drops):
    raw = path.read_bytes()
    got = hashlib.sha256(raw).hexdigest()
    if got != SOURCES["mbpp"]["sha256"]:
        sys.exit(f"{path}: sha256 {got}, expected {SOURCES['mbpp']['sha256']} (the pinned mbpp.jsonl)")
    for line in raw.decode("utf-8").splitlines():
        if not line.strip():
            continue
        task = json.loads(line)
        drops["total_mbpp_tasks"] += 1
        code = task["code"].replace("\r\n", "\n").replace("\r", "\n").rstrip() + "\n"
        setup = (task.get("test_setup_code") or "").replace("\r\n", "\n").strip()
        try:
            module = ast.parse(code)
        except SyntaxError:
            drops["mbpp_does_not_parse"] += 1
            continue
        funcs = {s.name: s for s in module.body if isinstance(s, ast.FunctionDef)}
        calls = []
        name = None
        for test in task["test_list"] + task.get("challenge_test_list", []):
            try:
                tree = ast.parse(test)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                found = literal_call(node, set(funcs))
                if found:
                    if name is None:
                        name = found[0]
                    if found[0] == name and found[1] not in calls:
                        calls.append(found[1])
                    break
        if not calls:
            drops["mbpp_no_literal_test_call"] += 1
            continue
        sig = positional_params(funcs[name])
        if sig is None:
            drops["mbpp_signature_not_positional"] += 1
            continue
        params, required = sig
        calls = [c for c in calls if required <= len(c) <= len(params)]
        if not calls:
            drops["mbpp_no_literal_test_call"] += 1
            continue
        n = collections.Counter(len(c) for c in calls).most_common(1)[0][0]
        calls = [c for c in calls if len(c) == n]
        problem = import_problem(module)
        if problem:
            drops[f"mbpp_{problem}"] += 1
            continue
        body = code + ("\n" + setup + "\n" if setup else "")
        taken = set()
        for s in module.body:
            taken |= assigned_names(s)
        key = f"mbpp/{task['task_id']}"
        made = make_driver(name, params, calls, shape_for(key), taken)
        if made is None:
            drops["mbpp_arguments_not_one_shape"] += 1
            continue
        driver, stdin = made
        yield {
            "id": key,
            "source": "mbpp",
            "body": body,
            "program": body + "\n\n" + driver,
            "inputs": stdin,
        }


# ------------------------------------------------------------ references


def reference_programs(repo: Path, humaneval: Path | None):
    """(name, program) of every program no corpus row may duplicate."""
    for folder in ("datasets/builtin/programs", "datasets/heldout_short/programs"):
        for p in sorted((repo / folder).glob("*.py")):
            yield f"{folder}/{p.name}", p.read_text(encoding="utf-8")
    ded = repo / "datasets/ded_builtin/tasks.jsonl"
    if ded.exists():
        for i, line in enumerate(ded.read_text(encoding="utf-8").splitlines()):
            if line.strip():
                row = json.loads(line)
                if row.get("program"):
                    yield f"ded_builtin line {i + 1}", row["program"]
    if humaneval:
        with gzip.open(humaneval, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    t = json.loads(line)
                    yield t["task_id"], t["prompt"] + t["canonical_solution"]


# ------------------------------------------------------------------ runs


def limit_child():
    resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()


def run_once(program: str, stdin: str, hash_seed: int, timeout: float):
    with tempfile.TemporaryDirectory(prefix="corpus-") as d:
        Path(d, "main.py").write_text(program, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": str(hash_seed), "HOME": d, "LANG": "C.UTF-8"}
        # CPU seconds of this worker process's children: one child at a
        # time per process, so the difference is this program's, whatever
        # else the machine is doing.
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            p = subprocess.run(
                [PYTHON, "main.py"],
                input=stdin.encode("utf-8"),
                capture_output=True,
                cwd=d,
                env=env,
                timeout=timeout,
                preexec_fn=limit_child,
            )
        except subprocess.TimeoutExpired:
            return "timeout", None, timeout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        elapsed = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if p.returncode != 0:
            return "error_exit", None, elapsed
        if p.stderr:
            return "stderr", None, elapsed
        return "ok", p.stdout, elapsed


def check(cand, max_seconds: float, max_output: int):
    """Why the candidate is dropped, or None and its output."""
    outs = []
    for seed in (1, 2):
        status, out, elapsed = run_once(cand["program"], cand["inputs"], seed, max(10.0, max_seconds * 3))
        if status != "ok":
            return status, None
        if elapsed > max_seconds:
            return "slow", None
        try:
            text = out.decode("utf-8")
        except UnicodeDecodeError:
            return "not_utf8", None
        outs.append(text)
    if outs[0] != outs[1]:
        return "not_deterministic", None
    if not outs[0].strip():
        return "prints_nothing", None
    if len(outs[0]) > max_output:
        return "output_too_long", None
    if "0x7f" in outs[0] or " object at 0x" in outs[0]:
        return "prints_addresses", None
    return None, outs[0]


def sandbox_pass(rows, trace_train: Path, work: Path):
    """Row ids that `trace-train generate` ran and reproduced in the sandbox."""
    data = work / "candidates.jsonl"
    with data.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"program": r["program"], "inputs": r["inputs"], "output": r["output"]}) + "\n")
    cfg = work / "generate.json"
    cfg.write_text(json.dumps({"test_ratio": 0.0, "variants": 1}))
    out = work / "generated"
    cmd = [
        str(trace_train), "generate", "--dataset", str(data), "--output_dir", str(out),
        "--config", str(cfg), "--variants", "1",
    ]
    print("sandbox pass:", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    kept = set()
    for name in ("stage1_original_train.jsonl", "stage1_original_test.jsonl"):
        p = out / name
        if p.exists():
            for line in p.open(encoding="utf-8"):
                kept.add(json.loads(line)["metadata"]["row_index"])
    stats = json.loads((out / "stage1_stats.json").read_text())
    return {rows[i]["id"] for i in kept}, stats


# ------------------------------------------------------------------ main


def main():
    if os.environ.get("PYTHONHASHSEED") != "0":
        # One hash seed for the whole build, so that nothing it writes
        # depends on the order of a set.
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algorithms", type=Path, required=True, help="a checkout of TheAlgorithms/Python")
    ap.add_argument("--mbpp", type=Path, required=True, help="MBPP's mbpp.jsonl")
    ap.add_argument("--keon", type=Path, required=True, help="a checkout of keon/algorithms")
    ap.add_argument("--exercism", type=Path, required=True, help="a checkout of exercism/python")
    ap.add_argument("--humaneval", type=Path, help="HumanEval.jsonl.gz, to leave its programs out")
    ap.add_argument("--trace_train", type=Path, help="the trace-train binary for the sandbox pass")
    ap.add_argument("--out", type=Path, default=Path("datasets/corpus"))
    ap.add_argument("--max_seconds", type=float, default=1.0)
    ap.add_argument("--max_output_chars", type=int, default=5000)
    ap.add_argument("--max_source_chars", type=int, default=10000)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    drops = Drops()

    refs_program = {}
    refs_function = {}
    for name, prog in reference_programs(repo, args.humaneval):
        n = normalize(prog)
        if n is not None:
            refs_program.setdefault(digest(n), name)
        for d in function_digests(prog):
            refs_function.setdefault(d, name)

    cands = (
        list(algorithms_candidates(args.algorithms, drops))
        + list(mbpp_candidates(args.mbpp, drops))
        + list(keon_candidates(args.keon, drops))
        + list(exercism_candidates(args.exercism, drops))
    )
    print(f"{len(cands)} candidates", file=sys.stderr, flush=True)

    seen = {}
    unique = []
    for c in sorted(cands, key=lambda c: c["id"]):
        if len(c["program"]) > args.max_source_chars:
            drops[f"{c['source']}_source_too_long"] += 1
            continue
        n = normalize(c["program"])
        if n is None:
            drops[f"{c['source']}_does_not_parse"] += 1
            continue
        if digest(n) in refs_program:
            drops[f"{c['source']}_duplicates_reference_program"] += 1
            continue
        if function_digests(c["body"]) & set(refs_function):
            drops[f"{c['source']}_duplicates_reference_function"] += 1
            continue
        key = digest(normalize(c["body"]) or c["body"])
        if key in seen:
            drops[f"{c['source']}_duplicates_corpus_program"] += 1
            continue
        seen[key] = c["id"]
        unique.append(c)
    print(f"{len(unique)} after dedup; running each twice", file=sys.stderr, flush=True)

    kept = []
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        results = pool.map(check, unique, [args.max_seconds] * len(unique), [args.max_output_chars] * len(unique), chunksize=8)
        for i, (c, (why, out)) in enumerate(zip(unique, results)):
            if why:
                drops[f"{c['source']}_{why}"] += 1
            else:
                c["output"] = out
                kept.append(c)
            if (i + 1) % 500 == 0:
                print(f"  {i + 1}/{len(unique)} run, {len(kept)} kept", file=sys.stderr, flush=True)

    sandbox_stats = None
    if args.trace_train:
        with tempfile.TemporaryDirectory(prefix="corpus-sandbox-") as d:
            ok, sandbox_stats = sandbox_pass(kept, args.trace_train, Path(d))
        for c in kept:
            if c["id"] not in ok:
                drops[f"{c['source']}_sandbox_failed_or_differs"] += 1
        kept = [c for c in kept if c["id"] in ok]

    args.out.mkdir(parents=True, exist_ok=True)
    # MIT asks that its notice travel with copies: the upstream licence file
    # goes beside the rows made from that source.
    (args.out / "algorithms.LICENSE.md").write_bytes((args.algorithms / "LICENSE.md").read_bytes())
    (args.out / "keon.LICENSE").write_bytes((args.keon / "LICENSE").read_bytes())
    (args.out / "exercism.LICENSE").write_bytes((args.exercism / "LICENSE").read_bytes())
    counts = {}
    for source, meta in SOURCES.items():
        rows = sorted((c for c in kept if c["source"] == source), key=lambda c: c["id"])
        counts[source] = len(rows)
        path = args.out / f"{source}.jsonl.gz"
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
            for r in rows:
                row = {
                    "id": r["id"],
                    "source": source,
                    "license": meta["license"],
                    "program": r["program"],
                    "inputs": r["inputs"],
                    "output": r["output"],
                }
                gz.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
        print(f"{path}: {len(rows)} rows", file=sys.stderr)
    report = {
        "sources": SOURCES,
        "python": subprocess.run([PYTHON, "--version"], capture_output=True, text=True).stdout.strip(),
        "kept": counts,
        "candidates": len(cands),
        "seen": {k: v for k, v in sorted(drops.items()) if k.startswith("total_")},
        "dropped": {k: v for k, v in sorted(drops.items()) if not k.startswith("total_")},
        "sandbox_dropped_rows": None if sandbox_stats is None else sandbox_stats.get("counts", {}).get("dropped"),
        "files": {
            f"{s}.jsonl.gz": hashlib.sha256((args.out / f"{s}.jsonl.gz").read_bytes()).hexdigest() for s in SOURCES
        },
    }
    (args.out / "build_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["kept"]), file=sys.stderr)


if __name__ == "__main__":
    main()
