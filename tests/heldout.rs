//! The held-out short set: every program runs in the sandbox to its
//! recorded output of one to three lines, every time; eval makes its items
//! as the environment would (original or transformed prompt) and scores a
//! model on it through the binary.

mod common;

use std::collections::BTreeSet;

use common::{exec, stderr, trace_train};
use trace_train::dataset::builtin;
use trace_train::eval::heldout::{self, Options, PromptKind};
use trace_train::prompt;
use trace_train::reward::python_strip;
use trace_train::sandbox::{Request, Status};

#[test]
fn every_heldout_program_reproduces_its_short_output_in_the_sandbox() {
    let rows = builtin::heldout_short();
    assert!(rows.len() >= 100, "{}", rows.len());
    for r in &rows {
        let recorded = python_strip(r.output.as_deref().unwrap()).to_owned();
        // Twice: the output must not depend on the run.
        for _ in 0..2 {
            let out = exec().run(&Request::new(
                r.program.as_bytes().to_vec(),
                r.inputs.as_bytes().to_vec(),
            ));
            assert_eq!(out.status, Status::Ok, "{}: {:?}", r.name, out.detail);
            assert!(
                out.stderr.is_empty(),
                "{}: {}",
                r.name,
                String::from_utf8_lossy(&out.stderr)
            );
            let got = python_strip(std::str::from_utf8(&out.stdout).unwrap());
            assert_eq!(got, recorded, "{}", r.name);
        }
        let lines = recorded.lines().count();
        assert!((1..=3).contains(&lines), "{}: {lines} lines", r.name);
    }
}

#[test]
fn heldout_items_carry_the_environments_prompts() {
    let rows = builtin::heldout_short();
    let (orig, dropped) = heldout::short_items(exec(), &Options::default()).unwrap();
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(orig.len(), rows.len());
    for (item, row) in orig.iter().zip(&rows) {
        assert_eq!(item.id, format!("short:{}", row.name));
        assert_eq!(
            item.prompt,
            prompt::original_prompt(&row.program, &row.inputs)
        );
        assert_eq!(item.expected, python_strip(row.output.as_deref().unwrap()));
        let d = item.difficulty;
        assert!(d.loop_depth.is_some() && d.lines.is_some() && d.injections.is_none());
        assert!((1..=3).contains(&d.output_lines.unwrap()));
    }
    // The first programs only: the first items of all, no more.
    let (first, _) = heldout::short_items(
        exec(),
        &Options {
            programs: Some(5),
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(first, orig[..5]);
    let (tr, dropped) = heldout::short_items(
        exec(),
        &Options {
            prompt: PromptKind::Transformed,
            variants: 2,
            ..Options::default()
        },
    )
    .unwrap();
    // A variant may fail (a print names a variable before it is bound);
    // those are counted, and most variants run.
    let failed: u64 = dropped.values().sum();
    assert_eq!(
        tr.len() as u64 + failed,
        2 * rows.len() as u64,
        "{dropped:?}"
    );
    assert!(tr.len() > rows.len(), "{} of {}", tr.len(), 2 * rows.len());
    let n = rows.len() as u64;
    let ids: BTreeSet<&str> = tr.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids.len(), tr.len(), "ids are unique");
    let mut with_dbg = 0;
    for item in &tr {
        // short:NAME:SEED with the environment's seeds r + v*N.
        let (name, seed) = item.id["short:".len()..].rsplit_once(':').unwrap();
        let row = rows.iter().find(|r| r.name == name).unwrap();
        let seed: u64 = seed.parse().unwrap();
        assert!(seed == row.index || seed == row.index + n, "{}", item.id);
        assert!(
            item.prompt
                .starts_with("Predict the exact and complete standard output")
        );
        assert!(item.prompt.contains("starting with '__DBG_'"));
        assert!(item.prompt.contains(&format!("```\n{}\n```", row.inputs)));
        assert!(item.difficulty.injections.is_some());
        if item.expected.contains("__DBG_") {
            with_dbg += 1;
        }
    }
    assert!(with_dbg * 2 > tr.len(), "{with_dbg} of {}", tr.len());
}

#[test]
fn eval_scores_a_model_on_the_heldout_set() {
    let dir = tempfile::tempdir().unwrap();
    let o = trace_train(dir.path(), &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = trace_train(
        dir.path(),
        &[
            "eval",
            "--model",
            "base",
            "--heldout",
            "short",
            "--limit",
            "5",
            "--max_new_tokens",
            "4",
            "--output",
            "r.json",
            "--device",
            "cpu",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
    assert_eq!(r["n"], 5);
    assert_eq!(r["predictions"][0]["id"], "short:001_sum_two_ints");
    let total: u64 = r["by"]["output_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["n"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 5);
    // A bad set name or prompt kind is named.
    let o = trace_train(
        dir.path(),
        &[
            "eval",
            "--model",
            "base",
            "--heldout",
            "long",
            "--device",
            "cpu",
        ],
    );
    assert!(
        !o.status.success() && stderr(&o).contains("`long`"),
        "{}",
        stderr(&o)
    );
    let o = trace_train(
        dir.path(),
        &[
            "eval",
            "--model",
            "base",
            "--heldout",
            "short",
            "--prompt",
            "fancy",
            "--device",
            "cpu",
        ],
    );
    assert!(
        !o.status.success() && stderr(&o).contains("fancy"),
        "{}",
        stderr(&o)
    );
}
