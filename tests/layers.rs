//! The library's layers, read from its own imports: a module takes only
//! from its own layer or the ones below, and a recipe never from another
//! recipe. The crates under `crates/` (base, model, sandbox) are kept below
//! by Cargo itself, which refuses a dependency cycle; this test keeps the
//! order among the modules of the `trace-train` crate, which sit above
//! them.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

/// Each top-level module of `src/` and its layer, from the ground up.
const LAYERS: &[(&str, u8)] = &[
    // Ground: leaves every part may use (`crates/base`, re-exported).
    ("atomic", 0),
    ("rng", 0),
    ("stop", 0),
    ("progress", 0),
    ("gpu", 0),
    ("hex", 0),
    ("prompt", 0),
    ("reward", 0),
    // Parts that know nothing of models (`sandbox` is `crates/sandbox`).
    ("sandbox", 1),
    ("transform", 1),
    ("runlog", 1),
    ("dist", 1),
    ("data", 1),
    // The model (`crates/model`), and what sits on it.
    ("model", 2),
    ("train", 3),
    ("config", 3),
    ("dataset", 3),
    // Environments: tasks and their scores.
    ("env", 4),
    // Parts that drive environments or models: eval, RL, preferences.
    ("eval", 5),
    ("rl", 5),
    ("pref", 5),
    // What every recipe builds its run from.
    ("kit", 6),
    ("recipes", 7),
    // Stages and tools above the recipes.
    ("generate", 8),
    ("serve", 8),
    ("bench", 8),
];

/// The code of a file without comments and without its test modules.
fn code(text: &str) -> String {
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") || t.starts_with("#[cfg(all(test") {
            break;
        }
        if !t.starts_with("//") {
            out.push(line);
        }
    }
    out.join("\n")
}

/// Every top-level module a file's code names through `crate::`.
fn imports(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::b, c};`: each entry's first name.
            let end = group.find('}').unwrap_or(group.len());
            for entry in group[..end].split(',') {
                let name: String = entry
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    names.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.push(name);
        }
    }
    names
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_import_runs_back_up_and_recipes_never_use_each_other() {
    let src = common::repo().join("src");
    let layer: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if ["main", "cli", "lib"].contains(&top.as_str()) {
            continue; // the binary's own, and the crate root
        }
        let Some(&own) = layer.get(top.as_str()) else {
            panic!("`src/{top}` has no layer: add it to LAYERS");
        };
        let c = code(&std::fs::read_to_string(path).unwrap());
        for name in imports(&c) {
            if name == top || name.is_empty() {
                continue;
            }
            match layer.get(name.as_str()) {
                Some(&l) if l <= own => {}
                Some(&l) => wrong.push(format!(
                    "`{}` (layer {own}) imports `crate::{name}` (layer {l})",
                    rel.display()
                )),
                None => panic!(
                    "`{}` imports `crate::{name}`, which has no layer",
                    rel.display()
                ),
            }
        }
        if top == "recipes" {
            let recipe = rel
                .components()
                .nth(1)
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let recipe = recipe.trim_end_matches(".rs");
            for other in ["sft", "ppo", "dpo"].iter().filter(|r| **r != recipe) {
                if c.contains(&format!("recipes::{other}")) {
                    wrong.push(format!("`{}` uses the {other} recipe", rel.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that run back up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_an_import_that_runs_back_up() {
    let c = code("use crate::recipes::sft;\nuse crate::{eval, model::X};\n// crate::cli\n");
    assert_eq!(imports(&c), ["recipes", "eval", "model"]);
    let cut = code("use crate::data;\n#[cfg(test)]\nmod tests { use crate::recipes; }\n");
    assert_eq!(imports(&cut), ["data"]);
}
