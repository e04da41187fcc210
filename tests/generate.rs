//! `generate` end to end through the real binary: determinism, the output
//! layout, memory on fat rows, and bad input.

mod common;

use std::io::Write;
use std::path::Path;

use common::{stderr, trace_train};

fn generate(dir: &Path, out: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["generate", "--output_dir", out, "--num_workers", "2"];
    args.extend_from_slice(extra);
    trace_train(dir, &args)
}

fn stats_without_timings(path: &Path) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("timings");
    v
}

#[test]
fn generate_twice_gives_identical_files() {
    let dir = tempfile::tempdir().unwrap();
    for out in ["a", "b"] {
        let o = generate(dir.path(), out, &["--max_samples", "40"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    for name in [
        "stage1_original_train.jsonl",
        "stage1_original_test.jsonl",
        "stage2_transformed_train.jsonl",
        "stage2_transformed_test.jsonl",
    ] {
        let a = std::fs::read(dir.path().join("a").join(name)).unwrap();
        let b = std::fs::read(dir.path().join("b").join(name)).unwrap();
        assert_eq!(a, b, "{name} differs between two runs");
    }
    assert!(
        std::fs::metadata(dir.path().join("a/stage2_transformed_train.jsonl"))
            .unwrap()
            .len()
            > 10_000
    );
    for name in ["stage1_stats.json", "stage2_stats.json"] {
        assert_eq!(
            stats_without_timings(&dir.path().join("a").join(name)),
            stats_without_timings(&dir.path().join("b").join(name)),
            "{name} differs beyond its timings"
        );
    }
}

#[test]
fn records_are_complete_and_split_by_program() {
    let dir = tempfile::tempdir().unwrap();
    let o = generate(
        dir.path(),
        "out",
        &["--max_samples", "60", "--variants", "2"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let read = |name: &str| lines_of(&dir.path().join("out").join(name));
    let (train, test) = (
        read("stage2_transformed_train.jsonl"),
        read("stage2_transformed_test.jsonl"),
    );
    assert!(!train.is_empty());
    let ids = |v: &[serde_json::Value]| -> std::collections::BTreeSet<String> {
        v.iter()
            .map(|r| r["metadata"]["program_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        ids(&train).is_disjoint(&ids(&test)),
        "a program is in both splits"
    );
    // Each program's original output, by program id.
    let original: std::collections::BTreeMap<String, String> = read("stage1_original_train.jsonl")
        .into_iter()
        .chain(read("stage1_original_test.jsonl"))
        .map(|r| {
            (
                r["metadata"]["program_id"].as_str().unwrap().to_owned(),
                r["expected_output"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for r in train.iter().chain(&test) {
        let m = &r["messages"];
        assert_eq!(m[0]["role"], "user");
        assert_eq!(m[1]["role"], "assistant");
        assert_eq!(m[1]["content"], r["expected_output"]);
        let prompt = m[0]["content"].as_str().unwrap();
        assert!(prompt.contains(r["program"].as_str().unwrap()));
        assert!(prompt.contains("__DBG_"));
        // Without a `__DBG_` line the injected prints never ran: the answer
        // is the original program's output.
        let expected = r["expected_output"].as_str().unwrap();
        if !expected.contains("__DBG_") {
            let pid = r["metadata"]["program_id"].as_str().unwrap();
            assert_eq!(
                Some(expected),
                original.get(pid).map(String::as_str),
                "{pid}"
            );
        }
        assert!(r["metadata"]["seed"].is_u64() && r["metadata"]["features"]["lines"].is_u64());
    }
    // Env seed scheme: variant v of row r has seed r + v*N (N = the corpus size).
    let first = &train[0]["metadata"];
    let (row, variant, seed) = (
        first["row_index"].as_u64().unwrap(),
        first["variant"].as_u64().unwrap(),
        first["seed"].as_u64().unwrap(),
    );
    let n: u64 = serde_json::from_slice::<serde_json::Value>(
        &std::fs::read(dir.path().join("out/stage2_stats.json")).unwrap(),
    )
    .unwrap()["rows_in_source"]
        .as_u64()
        .unwrap();
    assert_eq!(seed, row + variant * n);
}

/// Transformed variants whose injected prints never ran are kept by
/// default (the environment asks them; they are Stage 2's only one-line
/// answers), and `filters.require_dbg` drops exactly those.
#[test]
fn variants_without_debug_output_are_kept_unless_required() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("strict.json"),
        r#"{"filters": {"require_dbg": true}}"#,
    )
    .unwrap();
    let answers = |out: &str, extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--variants", "1"];
        args.extend_from_slice(extra);
        let o = generate(dir.path(), out, &args);
        assert!(o.status.success(), "{}", stderr(&o));
        ["train", "test"]
            .iter()
            .flat_map(|s| {
                lines_of(
                    &dir.path()
                        .join(out)
                        .join(format!("stage2_transformed_{s}.jsonl")),
                )
            })
            .map(|r| r["expected_output"].as_str().unwrap().to_owned())
            .collect()
    };
    let kept = answers("default", &[]);
    let strict = answers("strict", &["--config", "strict.json"]);
    let silent: Vec<&String> = kept.iter().filter(|e| !e.contains("__DBG_")).collect();
    assert!(
        !silent.is_empty(),
        "no variant without a `__DBG_` line was kept"
    );
    assert!(
        silent.iter().any(|e| e.lines().count() == 1),
        "no one-line answer among them"
    );
    assert!(strict.iter().all(|e| e.contains("__DBG_")));
    assert_eq!(strict.len(), kept.len() - silent.len());
}

/// Rows like the real dataset's: three used fields and large unused ones.
fn write_rows(path: &Path, rows: usize, padding: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let pad = "x".repeat(padding);
    for i in 0..rows {
        let program = format!(
            "n = int(input())\nt = 0\nfor i in range(n):\n    t += i * {i}\n    print(i, t)\n"
        );
        let row = serde_json::json!({
            "program": program,
            "inputs": "3\n",
            "output": format!("0 0\n1 {i}\n2 {}\n", 3 * i),
            "prompt": pad,
            "verification_info": {"test_cases": [pad]},
        });
        writeln!(f, "{row}").unwrap();
    }
}

#[test]
fn memory_stays_flat_on_fat_rows() {
    let dir = tempfile::tempdir().unwrap();
    write_rows(&dir.path().join("thin.jsonl"), 200, 0);
    write_rows(&dir.path().join("fat.jsonl"), 200, 512 * 1024); // 1 MiB of unused text a row
    let mut rss = Vec::new();
    for name in ["thin", "fat"] {
        let o = generate(
            dir.path(),
            name,
            &["--dataset", &format!("{name}.jsonl"), "--variants", "1"],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let s: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(name).join("stage1_stats.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(s["rows_read"], 200);
        assert_eq!(
            s["counts"]["records_train"].as_u64().unwrap()
                + s["counts"]["records_test"].as_u64().unwrap(),
            200
        );
        rss.push(s["timings"]["peak_rss_kb"].as_u64().unwrap());
    }
    assert!(
        rss[1] <= 2 * rss[0],
        "peak RSS thin {} kB, fat {} kB",
        rss[0],
        rss[1]
    );
}

#[test]
fn malformed_line_names_file_and_line_or_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"program\":\"print(1)\\nprint(2)\\nprint(3)\",\"inputs\":\"\",\"output\":\"1\\n2\\n3\"}\n{not json\n",
    )
    .unwrap();
    let o = generate(dir.path(), "out", &["--dataset", "bad.jsonl"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("bad.jsonl") && e.contains("line 2") && e.contains("--skip_bad"),
        "{e}"
    );
    assert!(
        !dir.path().join("out/stage1_original_train.jsonl").exists(),
        "half-written output"
    );

    let o = generate(dir.path(), "out", &["--dataset", "bad.jsonl", "--skip_bad"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/stage1_stats.json")).unwrap())
            .unwrap();
    assert_eq!(s["malformed_lines"], 1);
    assert_eq!(s["rows_read"], 1);
}

#[test]
fn missing_field_and_non_utf8_are_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("nofield.jsonl"),
        "{\"program\":\"print(1)\"}\n",
    )
    .unwrap();
    let e = stderr(&generate(
        dir.path(),
        "out",
        &["--dataset", "nofield.jsonl"],
    ));
    assert!(
        e.contains("line 1") && e.contains("missing field `inputs`"),
        "{e}"
    );
    std::fs::write(
        dir.path().join("latin1.jsonl"),
        b"{\"program\":\"print('caf\xe9')\",\"inputs\":\"\"}\n",
    )
    .unwrap();
    let e = stderr(&generate(dir.path(), "out", &["--dataset", "latin1.jsonl"]));
    assert!(
        e.contains("latin1.jsonl") && e.contains("not valid UTF-8"),
        "{e}"
    );
}

#[test]
fn unparsable_and_mismatching_programs_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        serde_json::json!({"program": "def f(:\n    pass", "inputs": "", "output": ""}),
        serde_json::json!({"program": "print(1)\nprint(2)\nprint(3)", "inputs": "", "output": "1\n2\n4"}),
        serde_json::json!({"program": "x = 1\nprint(x)\nprint(x+1)\nprint(x+2)", "inputs": "", "output": "1\n2\n3\n"}),
    ];
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(dir.path().join("d.jsonl"), text).unwrap();
    let o = generate(dir.path(), "out", &["--dataset", "d.jsonl"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/stage1_stats.json")).unwrap())
            .unwrap();
    assert_eq!(s["counts"]["dropped"]["does_not_parse"], 1, "{s}");
    assert_eq!(s["counts"]["dropped"]["output_mismatch"], 1, "{s}");
    assert_eq!(s["output_mismatch_rows"][0], "line 2");
    assert_eq!(
        s["counts"]["records_train"].as_u64().unwrap()
            + s["counts"]["records_test"].as_u64().unwrap(),
        1
    );
}

#[test]
fn a_row_whose_own_program_fails_is_run_once_and_its_variants_never() {
    let dir = tempfile::tempdir().unwrap();
    let good = "n = int(input())\nfor i in range(n):\n    print(i * i)\n";
    let rows = [
        serde_json::json!({"program": good, "inputs": "3\n", "output": "0\n1\n4"}),
        serde_json::json!({"program": "raise SystemExit(1)", "inputs": "", "output": ""}),
        serde_json::json!({"program": "import os\nos.kill(os.getpid(), 9)", "inputs": "", "output": ""}),
        serde_json::json!({"program": "x = bytearray(1 << 40)\nprint(len(x))", "inputs": "", "output": ""}),
        serde_json::json!({"program": "while True:\n    pass", "inputs": "", "output": ""}),
        serde_json::json!({"program": "def f(:\n    pass", "inputs": "", "output": ""}),
        serde_json::json!({"program": good, "inputs": "2\n", "output": "0\n1"}),
    ];
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(dir.path().join("d.jsonl"), text).unwrap();
    std::fs::write(
        dir.path().join("g.json"),
        r#"{"variants": 3, "test_ratio": 0.0, "limits": {"cpu_seconds": 1, "wall_ms": 5000}}"#,
    )
    .unwrap();
    let o = generate(
        dir.path(),
        "out",
        &["--dataset", "d.jsonl", "--config", "g.json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "rows whose own program fails (none of their variants ran): line 2: original_error_exit; line 3: original_signal"
        ),
        "{}",
        stderr(&o)
    );
    let s = read_stats(dir.path(), "out", 2);
    // A good row: the transform, its original, three variants. A row whose
    // original fails: the transform and the original only. One that does
    // not parse: the transform only.
    assert_eq!(s["timings"]["sandbox_runs"], 2 * 5 + 4 * 2 + 1, "{s}");
    let dropped = &s["counts"]["dropped"];
    // The busy loop meets its CPU limit, or on a loaded machine its wall
    // limit first.
    let timeout = if dropped["original_cpu_timeout"] == 1 {
        "original_cpu_timeout"
    } else {
        "original_wall_timeout"
    };
    for reason in [
        "original_error_exit",
        "original_signal",
        "original_memory_limit",
        timeout,
        "does_not_parse",
    ] {
        assert_eq!(dropped[reason], 1, "{reason}: {s}");
    }
    assert_eq!(
        s["failed_rows"],
        serde_json::json!([
            "line 2: original_error_exit",
            "line 3: original_signal",
            "line 4: original_memory_limit",
            format!("line 5: {timeout}"),
            "line 6: does_not_parse",
        ])
    );
    assert_eq!(s["counts"]["records_train"], 6, "{s}");
}

#[test]
fn unwritable_output_folder_fails_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("afile"), "").unwrap();
    let t = std::time::Instant::now();
    let o = generate(dir.path(), "afile/out", &[]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("afile/out") && e.contains("hint:"), "{e}");
    assert!(t.elapsed().as_secs() < 5, "it ran before failing");
}

#[test]
fn previous_outputs_survive_a_failed_run() {
    let dir = tempfile::tempdir().unwrap();
    let o = generate(dir.path(), "out", &["--max_samples", "10"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = std::fs::read(dir.path().join("out/stage2_transformed_train.jsonl")).unwrap();
    std::fs::write(dir.path().join("bad.jsonl"), "{\"program\":1}\n").unwrap();
    let o = generate(dir.path(), "out", &["--dataset", "bad.jsonl"]);
    assert!(!o.status.success());
    assert_eq!(
        std::fs::read(dir.path().join("out/stage2_transformed_train.jsonl")).unwrap(),
        before
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

/// Rows printing `lines` lines each: (count, lines) groups, all distinct.
fn write_line_rows(path: &Path, groups: &[(usize, usize)]) {
    let mut text = String::new();
    let mut k = 1;
    for &(count, lines) in groups {
        for _ in 0..count {
            let program =
                format!("n = int(input())\nfor i in range(n):\n    v = i * {k}\n    print(v)\n");
            let output: String = (0..lines).map(|i| format!("{}\n", i * k)).collect();
            let row = serde_json::json!({"program": program, "inputs": format!("{lines}\n"), "output": output});
            text.push_str(&format!("{row}\n"));
            k += 1;
        }
    }
    std::fs::write(path, text).unwrap();
}

fn bucket_counts(stats: &serde_json::Value, split: &str, feature: &str) -> Vec<(String, u64)> {
    stats["counts"]["buckets"][split][feature]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["bucket"].as_str().unwrap().to_owned(),
                b["n"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn read_stats(dir: &Path, out: &str, stage: u8) -> serde_json::Value {
    serde_json::from_slice(
        &std::fs::read(dir.join(out).join(format!("stage{stage}_stats.json"))).unwrap(),
    )
    .unwrap()
}

fn lines_of(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn stats_count_each_split_by_line_and_difficulty_bucket_and_originals_keep_one_liners() {
    let dir = tempfile::tempdir().unwrap();
    write_line_rows(
        &dir.path().join("d.jsonl"),
        &[(20, 1), (10, 2), (6, 5), (4, 12)],
    );
    let o = generate(
        dir.path(),
        "out",
        &["--dataset", "d.jsonl", "--variants", "2"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("by output lines: 1 "), "{}", stderr(&o));
    for stage in [1u8, 2] {
        let s = read_stats(dir.path(), "out", stage);
        for split in ["train", "test"] {
            let records = s["counts"][format!("records_{split}")].as_u64().unwrap();
            let file = match (stage, split) {
                (1, "train") => "stage1_original_train.jsonl",
                (1, _) => "stage1_original_test.jsonl",
                (_, "train") => "stage2_transformed_train.jsonl",
                _ => "stage2_transformed_test.jsonl",
            };
            let recs = lines_of(&dir.path().join("out").join(file));
            assert_eq!(recs.len() as u64, records, "stage {stage} {split}");
            for feature in ["output_lines", "loop_depth", "lines", "injections"] {
                let total: u64 = bucket_counts(&s, split, feature).iter().map(|b| b.1).sum();
                assert_eq!(total, records, "stage {stage} {split} {feature}");
            }
            // The output-line buckets are those of the records written.
            let mut want = std::collections::BTreeMap::<String, u64>::new();
            for r in &recs {
                let n = r["expected_output"].as_str().unwrap().lines().count() as u32;
                let (_, label) = trace_train::data::buckets::bucket(
                    Some(n),
                    trace_train::data::buckets::OUTPUT_LINES.edges,
                );
                *want.entry(label).or_default() += 1;
            }
            let got: std::collections::BTreeMap<String, u64> =
                bucket_counts(&s, split, "output_lines")
                    .into_iter()
                    .collect();
            assert_eq!(got, want, "stage {stage} {split}");
        }
    }
    // Every original program is kept, one-line outputs included.
    let s1 = read_stats(dir.path(), "out", 1);
    let ones: u64 = ["train", "test"]
        .iter()
        .flat_map(|split| bucket_counts(&s1, split, "output_lines"))
        .filter(|b| b.0 == "1")
        .map(|b| b.1)
        .sum();
    assert_eq!(ones, 20);
    assert!(
        s1["counts"]["dropped"].get("too_few_lines").is_none(),
        "{s1}"
    );
}

#[test]
fn balance_lines_caps_full_buckets_the_same_way_every_run() {
    let dir = tempfile::tempdir().unwrap();
    write_line_rows(
        &dir.path().join("d.jsonl"),
        &[(20, 1), (10, 2), (6, 5), (4, 12)],
    );
    std::fs::write(
        dir.path().join("g.json"),
        r#"{"test_ratio": 0.0, "variants": 1}"#,
    )
    .unwrap();
    let run = |out: &str, extra: &[&str]| {
        let mut args = vec!["--dataset", "d.jsonl", "--config", "g.json"];
        args.extend_from_slice(extra);
        let o = generate(dir.path(), out, &args);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    run("plain", &[]);
    run("a", &["--balance_lines"]);
    run("b", &["--balance_lines"]);
    run("r1", &["--balance_lines", "--balance_ratio", "1"]);
    let s = read_stats(dir.path(), "a", 1);
    // Smallest bucket 11+ (4 programs); ratio 2 caps the others at 8.
    assert_eq!(s["counts"]["balance"]["cap"], 8, "{s}");
    assert_eq!(
        bucket_counts(&s, "train", "output_lines"),
        [
            ("1".into(), 8),
            ("2-3".into(), 8),
            ("4-10".into(), 6),
            ("11+".into(), 4)
        ]
    );
    assert_eq!(s["counts"]["balance"]["dropped"], 14);
    assert_eq!(s["counts"]["records_train"], 26);
    let kept = lines_of(&dir.path().join("a/stage1_original_train.jsonl"));
    assert_eq!(kept.len(), 26);
    // Same seed, same records; the kept ones in their input order.
    for name in [
        "stage1_original_train.jsonl",
        "stage2_transformed_train.jsonl",
    ] {
        assert_eq!(
            std::fs::read(dir.path().join("a").join(name)).unwrap(),
            std::fs::read(dir.path().join("b").join(name)).unwrap(),
            "{name}"
        );
    }
    let rows: Vec<u64> = kept
        .iter()
        .map(|r| r["metadata"]["row_index"].as_u64().unwrap())
        .collect();
    assert!(rows.windows(2).all(|w| w[0] < w[1]), "{rows:?}");
    // Ratio 1: every bucket the size of the smallest.
    let s = read_stats(dir.path(), "r1", 1);
    assert!(
        bucket_counts(&s, "train", "output_lines")
            .iter()
            .all(|b| b.1 == 4),
        "{s}"
    );
    // Jointly by output lines and loop depth (every program here has one
    // loop): the same caps, the joint buckets named.
    run(
        "joint",
        &["--balance_lines", "--balance_by", "output_lines,loop_depth"],
    );
    let s = read_stats(dir.path(), "joint", 1);
    let after: Vec<(String, u64)> = s["counts"]["balance"]["after"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["bucket"].as_str().unwrap().to_owned(),
                b["n"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        after,
        [
            ("output_lines=1,loop_depth=1".into(), 8),
            ("output_lines=2-3,loop_depth=1".into(), 8),
            ("output_lines=4-10,loop_depth=1".into(), 6),
            ("output_lines=11+,loop_depth=1".into(), 4)
        ]
    );
    assert_eq!(
        std::fs::read(dir.path().join("joint/stage1_original_train.jsonl")).unwrap(),
        std::fs::read(dir.path().join("a/stage1_original_train.jsonl")).unwrap(),
    );
    let o = generate(
        dir.path(),
        "bad",
        &[
            "--dataset",
            "d.jsonl",
            "--balance_lines",
            "--balance_by",
            "colour",
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("balance_by: `colour`"),
        "{}",
        stderr(&o)
    );
    // Without the option nothing is dropped and the stats say nothing of it.
    let s = read_stats(dir.path(), "plain", 1);
    assert_eq!(s["counts"]["records_train"], 40);
    assert!(s["counts"].get("balance").is_none());
}

#[test]
fn synthetic_programs_run_and_give_short_answers() {
    // `synthetic:N:SEED` makes N programs that all run: none is dropped for
    // an error, their answers are short (one to ten lines), and the same
    // spec gives the same rows.
    let dir = tempfile::tempdir().unwrap();
    for out in ["a", "b"] {
        let o = generate(dir.path(), out, &["--dataset", "synthetic:60:3"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let a = std::fs::read_to_string(dir.path().join("a/stage1_original_train.jsonl")).unwrap();
    let b = std::fs::read_to_string(dir.path().join("b/stage1_original_train.jsonl")).unwrap();
    assert_eq!(a, b);
    let stats = stats_without_timings(&dir.path().join("a/stage1_stats.json"));
    assert_eq!(stats["dataset"], "synthetic:60:3");
    assert_eq!(stats["rows_read"], 60);
    let test = std::fs::read_to_string(dir.path().join("a/stage1_original_test.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = a
        .lines()
        .chain(test.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 60, "every program ran and was kept");
    let mut programs = std::collections::HashSet::new();
    for r in &rows {
        let lines = r["expected_output"].as_str().unwrap().lines().count();
        assert!((1..=10).contains(&lines), "{lines} lines: {r}");
        programs.insert(r["program"].as_str().unwrap().to_owned());
    }
    assert_eq!(programs.len(), 60, "every program differs");
    let bad = generate(dir.path(), "c", &["--dataset", "synthetic:lots"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("`lots` is not a whole number"),
        "{}",
        stderr(&bad)
    );
}

/// The corpus built from public sources (`datasets/corpus/`, built by
/// `scripts/build_corpus.py`, not committed) as a `--dataset` source: a few
/// rows of each part and of the whole, run in the sandbox, reproduce their
/// recorded outputs. Said SKIPPED when the corpus is not built.
#[test]
fn corpus_rows_go_through_generate() {
    let corpus = trace_train::dataset::corpus::dir();
    let built = trace_train::dataset::corpus::PARTS
        .iter()
        .all(|p| corpus.join(format!("{p}.jsonl.gz")).is_file());
    if !built {
        eprintln!(
            "SKIPPED: the corpus is not built in {} (python3 scripts/build_corpus.py)",
            corpus.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (out, dataset) in [
        ("mbpp", "corpus:mbpp"),
        ("algorithms", "corpus:algorithms"),
        ("exercism", "corpus:exercism"),
        ("both", "corpus+builtin"),
    ] {
        let o = generate(
            dir.path(),
            out,
            &[
                "--dataset",
                dataset,
                "--max_samples",
                "4",
                "--variants",
                "1",
            ],
        );
        assert!(o.status.success(), "{dataset}: {}", stderr(&o));
        let s = read_stats(dir.path(), out, 1);
        assert_eq!(s["dataset"], dataset, "{s}");
        assert_eq!(s["rows_read"], 4, "{s}");
        assert_eq!(
            s["counts"]["records_train"].as_u64().unwrap()
                + s["counts"]["records_test"].as_u64().unwrap(),
            4,
            "{dataset}: every row reproduces its output: {s}"
        );
    }
}
