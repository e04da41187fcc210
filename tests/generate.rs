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
    let read = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.path().join("out").join(name))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
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
    for r in train.iter().chain(&test) {
        let m = &r["messages"];
        assert_eq!(m[0]["role"], "user");
        assert_eq!(m[1]["role"], "assistant");
        assert_eq!(m[1]["content"], r["expected_output"]);
        let prompt = m[0]["content"].as_str().unwrap();
        assert!(prompt.contains(r["program"].as_str().unwrap()));
        assert!(prompt.contains("__DBG_"));
        assert!(r["expected_output"].as_str().unwrap().contains("__DBG_"));
        assert!(r["metadata"]["seed"].is_u64() && r["metadata"]["features"]["lines"].is_u64());
    }
    // Env seed scheme: variant v of row r has seed r + v*N (N = 160 rows).
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
