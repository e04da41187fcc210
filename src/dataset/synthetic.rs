//! Synthetic programs (`synthetic:N` or `synthetic:N:SEED`): small stdin
//! programs made from a seed, as many as asked for, each one different.
//!
//! The built-in corpus and HumanEval hold a few hundred programs; a small
//! model trained on them for several epochs (or visited again and again by
//! RL) can learn those programs' outputs instead of how to execute Python,
//! which shows as training reward that rises while held-out exact match
//! does not. These programs give it fresh ones: integer arithmetic with
//! `//` and `%`, branches, `for` and `while` loops, small functions, list
//! and string operations, read from one or two input lines and printed on
//! one to a few lines. Nothing here is copied from a held-out set; the held
//! out short set stays written by hand.
//!
//! Program `i` of seed `s` depends on `(s, i)` alone, so a row can be made
//! again anywhere (the environment's task id names it). The output is not
//! recorded: `generate` and the environment run each program (twice, and
//! the runs must agree), and a program that fails is passed over and
//! counted, as for every source. No library does this (Python fuzzers such
//! as hypothesmith aim at the parser, not at short readable programs whose
//! trace a model can learn), so it is written here.

use crate::rng::{SplitMix64, mix};

use super::{Rows, SourceRow};

/// The `dataset` prefix.
pub const PREFIX: &str = "synthetic:";

/// How many programs, from which seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub count: u64,
    pub seed: u64,
}

impl Spec {
    /// Reads `N` or `N:SEED` (what follows `synthetic:`).
    pub fn parse(text: &str) -> anyhow::Result<Spec> {
        let hint = "hint: write `synthetic:N` (N programs from seed 0) or `synthetic:N:SEED`, as in `synthetic:5000:1`";
        let mut parts = text.split(':');
        let count = parts.next().unwrap_or_default();
        let count: u64 = count.parse().map_err(|_| {
            anyhow::anyhow!("`synthetic:{text}`: the count `{count}` is not a whole number\n{hint}")
        })?;
        anyhow::ensure!(
            count > 0,
            "`synthetic:{text}`: the count must be at least 1\n{hint}"
        );
        let seed = match parts.next() {
            None => 0,
            Some(s) => s.parse().map_err(|_| {
                anyhow::anyhow!("`synthetic:{text}`: the seed `{s}` is not a whole number\n{hint}")
            })?,
        };
        anyhow::ensure!(
            parts.next().is_none(),
            "`synthetic:{text}` has too many parts\n{hint}"
        );
        Ok(Spec { count, seed })
    }

    pub fn describe(&self) -> String {
        format!("{PREFIX}{}:{}", self.count, self.seed)
    }

    /// The rows, made one at a time.
    pub fn rows(&self) -> Rows {
        let seed = self.seed;
        Box::new((0..self.count).map(move |i| Ok(program(seed, i))))
    }
}

/// Program `index` of `seed`, with its stdin.
pub fn program(seed: u64, index: u64) -> SourceRow {
    let mut g = Maker::new(mix(seed ^ mix(index.wrapping_add(0x5eed))));
    g.make();
    SourceRow {
        index,
        name: format!("synthetic {seed}:{index}"),
        program: g.lines.join("\n") + "\n",
        inputs: g.stdin.join("\n") + "\n",
        output: None,
    }
}

const INT_NAMES: &[&str] = &[
    "a", "b", "c", "d", "k", "m", "p", "q", "r", "t", "u", "v", "w", "x", "y", "z", "total",
    "count", "acc", "best", "low", "high", "steps", "score", "value", "delta",
];
const LIST_NAMES: &[&str] = &["xs", "ys", "nums", "vals", "items", "parts"];
const STR_NAMES: &[&str] = &["s", "word", "name", "text", "code", "tag"];
const WORDS: &[&str] = &[
    "apple",
    "banana",
    "level",
    "python",
    "radar",
    "stone",
    "tiger",
    "queue",
    "hello",
    "moon",
    "cab",
    "data",
    "loop",
    "kayak",
    "zebra",
    "ox",
    "noon",
    "river",
    "abc",
    "mississippi",
];
const FUNC_NAMES: &[&str] = &["f", "g", "step", "twist", "fold", "calc"];

/// Builds one program line by line, keeping the names it defined (only
/// top-level assignments define names, so every later use is defined).
struct Maker {
    rng: SplitMix64,
    lines: Vec<String>,
    stdin: Vec<String>,
    ints: Vec<String>,
    lists: Vec<String>,
    strs: Vec<String>,
    funcs: Vec<String>,
    /// Names assigned or updated, most recent last (what the prints show).
    recent: Vec<String>,
}

impl Maker {
    fn new(seed: u64) -> Self {
        Maker {
            rng: SplitMix64::new(seed),
            lines: Vec::new(),
            stdin: Vec::new(),
            ints: Vec::new(),
            lists: Vec::new(),
            strs: Vec::new(),
            funcs: Vec::new(),
            recent: Vec::new(),
        }
    }

    fn make(&mut self) {
        if self.rng.chance(0.3) {
            self.function();
        }
        let reads = self.rng.range(1, 2);
        for _ in 0..reads {
            self.read();
        }
        if self.ints.is_empty() {
            let v = self.fresh(INT_NAMES);
            let e = self.int_atom();
            self.push(0, format!("{v} = {e}"));
            self.ints.push(v);
        }
        if let Some(f) = self.funcs.first().cloned() {
            let v = self.fresh(INT_NAMES);
            let a = self.int_atom();
            self.push(0, format!("{v} = {f}({a})"));
            self.define_int(v);
        }
        let statements = self.rng.range(2, 5);
        for _ in 0..statements {
            self.statement();
        }
        let prints = self.rng.range(1, 3);
        let mut shown = Vec::new();
        for _ in 0..prints {
            self.print(&mut shown);
        }
    }

    fn push(&mut self, indent: usize, line: String) {
        self.lines.push(format!("{}{line}", "    ".repeat(indent)));
        // The name a line assigns or updates, if any.
        let line = line.trim_start();
        let name: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let rest = line[name.len()..].trim_start();
        let assigns = rest.starts_with('=') && !rest.starts_with("==")
            || ["+=", "-=", "*=", "//=", ".append", ".sort"]
                .iter()
                .any(|op| rest.starts_with(op));
        if !name.is_empty() && assigns && name != "i" && name != "j" {
            self.recent.retain(|n| *n != name);
            self.recent.push(name);
        }
    }

    fn define_int(&mut self, name: String) {
        if !self.ints.contains(&name) {
            self.ints.push(name);
        }
    }

    /// A name of `pool` not used yet (numbered when the pool runs out).
    fn fresh(&mut self, pool: &[&str]) -> String {
        let used = |n: &str, m: &Maker| {
            m.ints.iter().any(|x| x == n)
                || m.lists.iter().any(|x| x == n)
                || m.strs.iter().any(|x| x == n)
                || m.funcs.iter().any(|x| x == n)
        };
        for _ in 0..8 {
            let n = *self.rng.pick(pool);
            if !used(n, self) {
                return n.to_owned();
            }
        }
        let base = *self.rng.pick(pool);
        (2..)
            .map(|k| format!("{base}{k}"))
            .find(|n| !used(n, self))
            .unwrap_or_default()
    }

    fn read(&mut self) {
        match self.rng.below(4) {
            0 => {
                let v = self.fresh(INT_NAMES);
                self.stdin.push(self.rng.range(0, 20).to_string());
                self.push(0, format!("{v} = int(input())"));
                self.ints.push(v);
            }
            1 => {
                let a = self.fresh(INT_NAMES);
                self.ints.push(a.clone());
                let b = self.fresh(INT_NAMES);
                self.ints.push(b.clone());
                let (x, y) = (self.rng.range(-9, 30), self.rng.range(1, 30));
                self.stdin.push(format!("{x} {y}"));
                self.push(0, format!("{a}, {b} = map(int, input().split())"));
            }
            2 => {
                let v = self.fresh(LIST_NAMES);
                let n = self.rng.range(3, 6);
                let vals: Vec<String> =
                    (0..n).map(|_| self.rng.range(-5, 20).to_string()).collect();
                self.stdin.push(vals.join(" "));
                self.push(0, format!("{v} = list(map(int, input().split()))"));
                self.lists.push(v);
            }
            _ => {
                let v = self.fresh(STR_NAMES);
                let w = *self.rng.pick(WORDS);
                self.stdin.push(w.to_owned());
                self.push(0, format!("{v} = input().strip()"));
                self.strs.push(v);
            }
        }
    }

    fn function(&mut self) {
        let f = self.fresh(FUNC_NAMES);
        let (c, d) = (self.rng.range(2, 5), self.rng.range(1, 9));
        self.push(0, format!("def {f}(n):"));
        match self.rng.below(3) {
            0 => self.push(1, format!("return n * {c} + {d}")),
            1 => {
                self.push(1, format!("if n % {c} == 0:"));
                self.push(2, format!("return n // {c}"));
                self.push(1, format!("return n + {d}"))
            }
            _ => {
                self.push(1, "total = 0".into());
                self.push(1, format!("for i in range(abs(n) % {} + 1):", c + 3));
                self.push(2, format!("total += i * {c}"));
                self.push(1, "return total".into());
            }
        }
        self.push(0, String::new());
        self.funcs.push(f);
        // The function's own names are local: nothing to print later.
        self.recent.clear();
    }

    fn int_var(&mut self) -> String {
        self.rng.pick(&self.ints).clone()
    }

    /// A defined integer, a small constant, or a number read off a list
    /// or a string.
    fn int_atom(&mut self) -> String {
        let k = self.rng.below(10);
        if k < 5 && !self.ints.is_empty() {
            return self.int_var();
        }
        if k == 5 && !self.lists.is_empty() {
            let l = self.rng.pick(&self.lists).clone();
            return match self.rng.below(4) {
                0 => format!("len({l})"),
                1 => format!("sum({l})"),
                2 => format!("max({l}, default=0)"),
                _ => format!("min({l}, default=0)"),
            };
        }
        if k == 6 && !self.strs.is_empty() {
            let s = self.rng.pick(&self.strs).clone();
            let ch = (b'a' + self.rng.below(26) as u8) as char;
            return if self.rng.chance(0.5) {
                format!("len({s})")
            } else {
                format!("{s}.count('{ch}')")
            };
        }
        self.rng.range(1, 9).to_string()
    }

    /// An atom other than `a` (when one can be found).
    fn other_atom(&mut self, a: &str) -> String {
        let mut b = self.int_atom();
        for _ in 0..4 {
            if b != a {
                break;
            }
            b = self.int_atom();
        }
        b
    }

    fn int_expr(&mut self) -> String {
        let a = self.int_atom();
        match self.rng.below(9) {
            0 | 1 => format!("{a} + {}", self.other_atom(&a)),
            2 => format!("{a} - {}", self.other_atom(&a)),
            3 => format!("{a} * {}", self.rng.range(2, 4)),
            4 => format!("{a} // {}", self.rng.range(2, 5)),
            5 => format!("{a} % {}", self.rng.range(2, 7)),
            6 => format!("max({a}, {})", self.other_atom(&a)),
            7 if !self.funcs.is_empty() => {
                let f = self.rng.pick(&self.funcs).clone();
                format!("{f}({a})")
            }
            _ => format!("abs({a} - {})", self.other_atom(&a)),
        }
    }

    fn condition(&mut self) -> String {
        let a = self.int_var();
        match self.rng.below(3) {
            0 => format!("{a} % 2 == 0"),
            1 => format!("{a} > {}", self.other_atom(&a)),
            _ => format!("{a} < {}", self.rng.range(0, 12)),
        }
    }

    /// An update of a defined integer inside a block (no new names there).
    fn update(&mut self, indent: usize, loop_var: Option<&str>) {
        let v = self.int_var();
        let rhs = match (loop_var, self.rng.below(3)) {
            (Some(i), 0) => i.to_owned(),
            (Some(i), 1) => format!("{i} * {}", self.rng.range(2, 3)),
            _ => self.int_atom(),
        };
        let op = *self.rng.pick(&["+=", "+=", "-="]);
        self.push(indent, format!("{v} {op} {rhs}"));
    }

    fn statement(&mut self) {
        let k = self.rng.below(10);
        match k {
            0..=2 => {
                let v = self.fresh(INT_NAMES);
                let e = self.int_expr();
                self.push(0, format!("{v} = {e}"));
                self.ints.push(v);
            }
            3 => {
                let c = self.condition();
                self.push(0, format!("if {c}:"));
                self.update(1, None);
                if self.rng.chance(0.6) {
                    self.push(0, "else:".into());
                    self.update(1, None);
                }
            }
            4 | 5 => {
                let n = self.rng.range(2, 6);
                let range = if self.rng.chance(0.5) {
                    format!("range({n})")
                } else {
                    format!("range(1, {})", n + 1)
                };
                let i = if self.rng.chance(0.7) { "i" } else { "j" };
                self.push(0, format!("for {i} in {range}:"));
                if self.rng.chance(0.4) {
                    self.push(1, format!("if {i} % 2 == 0:"));
                    self.update(2, Some(i));
                    if self.rng.chance(0.5) {
                        self.push(1, "else:".into());
                        self.update(2, Some(i));
                    }
                } else {
                    self.update(1, Some(i));
                }
                if !self.lists.is_empty() && self.rng.chance(0.3) {
                    let l = self.rng.pick(&self.lists).clone();
                    self.push(1, format!("{l}.append({i})"));
                }
                if self.rng.chance(0.2) {
                    let v = self.int_var();
                    self.push(1, format!("print({i}, {v})"));
                }
            }
            6 => {
                let v = self.fresh(INT_NAMES);
                let (limit, div, add) = (
                    self.rng.range(0, 3),
                    self.rng.range(2, 3),
                    self.rng.range(5, 60),
                );
                let start = self.int_var();
                self.push(0, format!("{v} = abs({start}) + {add}"));
                self.push(0, "steps = 0".into());
                self.push(0, format!("while {v} > {limit}:"));
                self.push(1, format!("{v} //= {div}"));
                self.push(1, "steps += 1".into());
                self.define_int(v);
                self.define_int("steps".into());
            }
            7 if !self.lists.is_empty() => {
                let l = self.rng.pick(&self.lists).clone();
                match self.rng.below(4) {
                    0 => {
                        let e = self.int_atom();
                        self.push(0, format!("{l}.append({e})"));
                    }
                    1 => self.push(0, format!("{l}.sort()")),
                    2 => {
                        let c = self.rng.range(2, 3);
                        self.push(0, format!("{l} = [x * {c} for x in {l}]"));
                    }
                    _ => self.push(0, format!("{l} = [x for x in {l} if x % 2 == 1]")),
                }
            }
            8 if !self.strs.is_empty() => {
                let s = self.rng.pick(&self.strs).clone();
                match self.rng.below(4) {
                    0 => self.push(0, format!("{s} = {s}[::-1]")),
                    1 => self.push(0, format!("{s} = {s}.upper()")),
                    2 => {
                        let v = self.int_var();
                        self.push(0, format!("{s} = {s} + str({v})"));
                    }
                    _ => {
                        let (a, b) = (
                            (b'a' + self.rng.below(26) as u8) as char,
                            (b'a' + self.rng.below(26) as u8) as char,
                        );
                        self.push(0, format!("{s} = {s}.replace('{a}', '{b}')"));
                    }
                }
            }
            _ => {
                let v = self.int_var();
                let op = *self.rng.pick(&["+=", "-=", "*="]);
                let c = self.rng.range(2, 5);
                self.push(0, format!("{v} {op} {c}"));
            }
        }
    }

    /// A print of something not shown yet, mostly of what changed last.
    fn print(&mut self, shown: &mut Vec<String>) {
        let fresh: Vec<String> = self
            .recent
            .iter()
            .rev()
            .filter(|n| !shown.contains(n))
            .cloned()
            .collect();
        let Some(first) = fresh.first().cloned() else {
            return;
        };
        // The latest change half the time, else any name not shown yet.
        let a = if self.rng.chance(0.5) {
            first
        } else {
            self.rng.pick(&fresh).clone()
        };
        shown.push(a.clone());
        let is_int = self.ints.contains(&a);
        let line = match self.rng.below(4) {
            0 if is_int => format!("print(f\"{a} = {{{a}}}\")"),
            1 if fresh.len() >= 2 => {
                let b = fresh.iter().find(|n| **n != a).cloned().unwrap_or_default();
                shown.push(b.clone());
                format!("print({a}, {b})")
            }
            _ => format!("print({a})"),
        };
        self.push(0, line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_name_the_part() {
        assert_eq!(
            Spec::parse("500").unwrap(),
            Spec {
                count: 500,
                seed: 0
            }
        );
        assert_eq!(Spec::parse("7:3").unwrap(), Spec { count: 7, seed: 3 });
        for (bad, part) in [
            ("x", "count `x`"),
            ("0", "at least 1"),
            ("5:y", "seed `y`"),
            ("5:1:2", "too many"),
        ] {
            let e = Spec::parse(bad).unwrap_err().to_string();
            assert!(e.contains(part) && e.contains("hint:"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_program_depends_on_its_seed_and_index_alone() {
        let a: Vec<_> = Spec::parse("40:9")
            .unwrap()
            .rows()
            .map(Result::unwrap)
            .collect();
        assert_eq!(a[17], program(9, 17));
        assert_eq!(a[17].index, 17);
        let distinct: std::collections::HashSet<_> = a.iter().map(|r| &r.program).collect();
        assert_eq!(distinct.len(), 40, "every program differs");
        assert_ne!(program(9, 17).program, program(10, 17).program);
        for row in &a {
            assert!(row.output.is_none());
            let reads = row.program.matches("input()").count();
            assert_eq!(reads, row.inputs.lines().count(), "{}", row.program);
        }
    }
}
