//! The sibling environments end to end in the sandbox (needs root): ABD's
//! expected output and scoring with the original executor's rules (stderr
//! fails, exit codes are ignored, the `solve()` auto-run, fenced
//! programs), DED's tests as CPython parses them (JSON with NaN, Python
//! literals, `verification_info`, `function_call` with `to_str`, unknown
//! types), every ded-builtin reference solution passing, and the binary's
//! `task` and `compare` subcommands.

mod common;

use std::sync::Arc;

use serde_json::{Value, json};
use trace_train::env::affine::OUT_OF_RANGE;
use trace_train::env::affine::abd::AbdEnv;
use trace_train::env::affine::ded::DedEnv;
use trace_train::env::affine::rows::{self, TaskRow};
use trace_train::env::affine::sat::SatEnv;
use trace_train::env::{Environment, Score};
use trace_train::sandbox::{Executor, ExecutorConfig};

fn exec() -> Arc<Executor> {
    Arc::new(
        Executor::new(ExecutorConfig::new("/usr/bin/python3", 2, false))
            .expect("the sandbox needs root and /usr/bin/python3"),
    )
}

fn reward(s: Score) -> f64 {
    match s {
        Score::Reward(r) => r,
        Score::Masked(why) => panic!("masked: {why}"),
    }
}

fn abd_row(program: &str, inputs: &str, output: Option<&str>) -> TaskRow {
    TaskRow {
        program: Some(program.into()),
        inputs: Some(inputs.into()),
        output: output.map(str::to_owned),
        ..TaskRow::default()
    }
}

#[test]
fn abd_on_the_builtin_corpus() {
    let rows = rows::load("builtin", "x").unwrap();
    let env = AbdEnv::new(Arc::new(rows.clone()), exec()).unwrap();
    for id in [0u64, 5] {
        let t = env.task(id).unwrap();
        let row = &rows[id as usize];
        assert_eq!(Some(t.expected.as_str()), row.output.as_deref(), "row {id}");
        assert!(t.prompt.contains(row.program.as_deref().unwrap()));
        let right = format!(
            "Let me see.\n<INPUT>\n{}</INPUT>",
            row.inputs.as_deref().unwrap()
        );
        assert_eq!(reward(env.score(&t, &right)), 1.0, "row {id}");
        assert_eq!(reward(env.score(&t, "<INPUT>\nnot it\n</INPUT>")), 0.0);
        assert_eq!(reward(env.score(&t, "  \n")), 0.0);
        assert_eq!(
            reward(env.score(&t, row.inputs.as_deref().unwrap())),
            0.0,
            "no tags"
        );
    }
    assert_eq!(env.task(rows.len() as u64).unwrap_err(), OUT_OF_RANGE);
    assert_eq!(env.task_count(), Some(rows.len() as u64));
}

#[test]
fn abd_follows_the_executor() {
    let rows = vec![
        // stderr on the row's own input: the expected output falls back to the row's.
        abd_row(
            "import sys\nx = input()\nprint(x)\nif x == '1':\n    print('w', file=sys.stderr)\n",
            "1",
            Some("recorded\n"),
        ),
        // The exit status is ignored.
        abd_row(
            "import os, sys\nprint(input())\nsys.stdout.flush()\nos._exit(3)\n",
            "5",
            None,
        ),
        // A silent program defining solve() runs again calling it; a list prints as *res.
        abd_row("def solve():\n    return [int(input()), 2]\n", "1", None),
        // The executor strips fences from what it runs.
        abd_row("```python\nprint(input()[::-1])\n```", "abc", None),
    ];
    let env = AbdEnv::new(Arc::new(rows), exec()).unwrap();
    let tasks: Vec<_> = env
        .tasks(&[0, 1, 2, 3])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let expected: Vec<&str> = tasks.iter().map(|t| t.expected.as_str()).collect();
    assert_eq!(expected, ["recorded\n", "5\n", "1 2\n", "cba\n"]);
    let s =
        |i: usize, input: &str| reward(env.score(&tasks[i], &format!("<INPUT>{input}</INPUT>")));
    assert_eq!(s(0, "1"), 0.0, "any stderr fails");
    assert_eq!(s(0, "2"), 0.0);
    assert_eq!(s(1, "5"), 1.0);
    assert_eq!(s(2, "1"), 1.0);
    assert_eq!(s(2, "2"), 0.0);
    assert_eq!(s(3, "abc"), 1.0);
}

#[test]
fn ded_builtin_reference_solutions_pass() {
    let rows = rows::load("ded-builtin", "x").unwrap();
    let env = DedEnv::new(Arc::new(rows.clone()), exec()).unwrap();
    let ids: Vec<u64> = (0..rows.len() as u64).collect();
    for (t, row) in env.tasks(&ids).into_iter().zip(&rows) {
        let t = t.unwrap();
        let code = row.program.as_deref().unwrap();
        let fenced = format!("Here it is:\n```python\n{code}```\n");
        assert_eq!(reward(env.score(&t, &fenced)), 1.0, "{}: {code}", row.name);
        // Unfenced code is accepted too.
        assert_eq!(reward(env.score(&t, code)), 1.0, "{}", row.name);
        let noisy = format!("```python\nimport sys\nprint('debug', file=sys.stderr)\n{code}```");
        assert_eq!(
            reward(env.score(&t, &noisy)),
            0.0,
            "{}: stderr fails",
            row.name
        );
        let extra = format!("```python\n{code}print('extra')\n```");
        assert_eq!(reward(env.score(&t, &extra)), 0.0, "{}", row.name);
    }
    // solve() without a main guard is called by the auto-runner.
    let t = env.task(0).unwrap();
    let solve =
        "```python\ndef solve():\n    a, b = map(int, input().split())\n    return a + b\n```";
    assert_eq!(reward(env.score(&t, solve)), 1.0);
    // A ```Python fence is found by the any-tag step.
    let t = env.task(1).unwrap();
    assert_eq!(
        reward(env.score(&t, "```Python\nprint(input()[::-1])\n```")),
        1.0
    );
}

fn ded_row(field: &str, tests: Value) -> TaskRow {
    let mut r = TaskRow {
        prompt: Some("p".into()),
        ..TaskRow::default()
    };
    match field {
        "verification_info" => r.verification_info = Some(tests),
        _ => r.test_cases = Some(tests),
    }
    r
}

#[test]
fn ded_tests_are_read_as_cpython_reads_them() {
    let call = |output: Value| json!({"test_cases": [{"type": "function_call", "fn_name": "f", "input": [1, 2], "output": output}]});
    let rows = vec![
        // 0: function_call: expected is to_str(output[0]) = "3".
        ded_row("test_cases", call(json!([3]))),
        // 1: a bool output becomes json.dumps(True) = "true", which print never writes.
        ded_row("test_cases", call(json!([true]))),
        // 2: JSON with NaN (json.loads takes it; serde would not).
        ded_row(
            "test_cases",
            json!(
                "{\"test_cases\": [{\"type\": \"stdin_stdout\", \"input\": \"\", \"output\": NaN}]}"
            ),
        ),
        // 3: a Python literal (single quotes); a list input is joined by newlines.
        ded_row(
            "test_cases",
            json!("{'test_cases': [{'type': 'stdin_stdout', 'input': ['1', '2'], 'output': '3'}]}"),
        ),
        // 4: only unknown types: nothing counted, any reply passes.
        ded_row(
            "test_cases",
            json!({"test_cases": [{"type": "assert", "input": "", "output": "x"}]}),
        ),
        // 5: an empty verification_info falls back to test_cases; a list
        // output is joined by newlines.
        {
            let mut r = ded_row(
                "test_cases",
                json!({"test_cases": [{"type": "stdin_stdout", "input": "2", "output": ["1", "2"]}]}),
            );
            r.verification_info = Some(json!(""));
            r
        },
        // 6: unparsable, 7: no cases, 8: not a dict.
        ded_row("test_cases", json!("{not python")),
        ded_row("verification_info", json!({"test_cases": []})),
        ded_row("test_cases", json!("[1, 2]")),
        // 9: neither field: the original's `.get` on None raises, which scores 0.
        TaskRow {
            prompt: Some("p".into()),
            ..TaskRow::default()
        },
    ];
    let env = DedEnv::new(Arc::new(rows), exec()).unwrap();
    let ids: Vec<u64> = (0..10).collect();
    let tasks: Vec<_> = env.tasks(&ids).into_iter().map(Result::unwrap).collect();
    let s = |i: usize, reply: &str| reward(env.score(&tasks[i], reply));
    let add = "def f(a, b):\n    return a + b";
    assert_eq!(s(0, add), 1.0);
    assert_eq!(s(0, "def f(a, b):\n    return a - b"), 0.0);
    assert_eq!(s(1, "def f(a, b):\n    return True"), 0.0);
    assert_eq!(s(1, "def f(a, b):\n    return 'true'"), 1.0);
    assert_eq!(s(2, "print('NaN')"), 1.0);
    assert_eq!(
        s(3, "a = input()\nb = input()\nprint(int(a) + int(b))"),
        1.0
    );
    assert_eq!(s(4, "this is not even code"), 1.0);
    assert_eq!(s(4, "   "), 0.0, "an empty reply is never scored");
    assert_eq!(s(5, "for i in range(int(input())):\n    print(i + 1)"), 1.0);
    for i in 6..10 {
        assert_eq!(s(i, "print(1)"), 0.0, "row {i}");
    }
    let key = env.key(&tasks[7]);
    assert_eq!(key, json!({"fail": "no_test_cases"}));
}

const ABD_AGAIN: &str = "Try again: give the program's input between <INPUT> and </INPUT> tags.";
const DED_AGAIN: &str = "Try again: give the whole program in a single ```python block.";

/// The verdict alone: that the answer is wrong, and what the environment
/// wants instead.
fn verdict(again: &str) -> String {
    format!("Your answer is incorrect. {again}")
}

#[test]
fn abd_feedback_runs_the_reply_input_in_the_sandbox() {
    let rows = vec![abd_row(
        "a = int(input())\nprint(a * 2)\nprint(a)\n",
        "3",
        None,
    )];
    let env = AbdEnv::new(Arc::new(rows), exec()).unwrap();
    let t = env.task(0).unwrap();
    assert_eq!(t.expected, "6\n3\n");
    let fb = |reply: &str, kind: &str| env.feedback(&t, reply, kind).unwrap();
    let wrong = "I think it is\n<INPUT>\n2\n</INPUT>";
    assert_eq!(reward(env.score(&t, wrong)), 0.0);
    assert_eq!(
        fb(wrong, "first_diff"),
        format!(
            "Your answer is incorrect: on your input the program printed 2 lines (the expected output has 2 lines); line 1 is the first that differs, where it printed:\n4\n{ABD_AGAIN}"
        )
    );
    assert_eq!(
        fb(wrong, "line"),
        format!(
            "Your answer is incorrect: on your input the program printed 2 lines (the expected output has 2 lines); line 1 is the first that differs. The program printed:\n```\n4\n2\n```\n{ABD_AGAIN}"
        )
    );
    // The same reply, the same text.
    assert_eq!(fb(wrong, "line"), fb(wrong, "line"));
    // The program raises on the input: stderr.
    let raises = "<INPUT>x</INPUT>";
    assert_eq!(reward(env.score(&t, raises)), 0.0);
    assert_eq!(
        fb(raises, "first_diff"),
        format!(
            "Your answer is incorrect: on your input the program wrote to stderr, which fails the task; its last line:\nValueError: invalid literal for int() with base 10: 'x'\n{ABD_AGAIN}"
        )
    );
    let full = fb(raises, "line");
    assert!(
        full.starts_with("Your answer is incorrect: on your input the program wrote to stderr, which fails the task:\n```\nTraceback (most recent call last):\n")
            && full.ends_with(&format!("ValueError: invalid literal for int() with base 10: 'x'\n```\n{ABD_AGAIN}")),
        "{full}"
    );
    // No INPUT block: nothing ran.
    assert_eq!(
        fb("The input is 3.", "line"),
        format!(
            "Your answer is incorrect: no <INPUT> block was found in your reply, so the program was not run. {ABD_AGAIN}"
        )
    );
    for reply in [wrong, raises, "The input is 3."] {
        assert_eq!(fb(reply, "verdict"), verdict(ABD_AGAIN));
    }
}

#[test]
fn ded_feedback_runs_the_reply_on_the_cases_in_the_sandbox() {
    let cases = json!({"test_cases": [
        {"type": "stdin_stdout", "input": "1 2", "output": "3"},
        {"type": "stdin_stdout", "input": "5 5", "output": "10"},
        {"type": "stdin_stdout", "input": "2 2", "output": "4"},
    ]});
    let env = DedEnv::new(Arc::new(vec![ded_row("test_cases", cases)]), exec()).unwrap();
    let t = env.task(0).unwrap();
    let fb = |reply: &str, kind: &str| env.feedback(&t, reply, kind).unwrap();
    let wrong = "```python\na, b = map(int, input().split())\nprint(0 if a == 5 else a + b)\n```";
    assert_eq!(reward(env.score(&t, wrong)), 0.0);
    assert_eq!(
        fb(wrong, "first_diff"),
        format!(
            "Your answer is incorrect: your program fails test case 2 of 3: line 1 of its output is the first that differs (it printed 1 line, the expected output has 1 line). Line 1 should be:\n10\nYour program printed:\n0\n{DED_AGAIN}"
        )
    );
    assert_eq!(
        fb(wrong, "line"),
        format!(
            "Your answer is incorrect: your program fails test case 2 of 3: line 1 of its output is the first that differs (it printed 1 line, the expected output has 1 line).\nInput:\n```\n5 5\n```\nExpected output:\n```\n10\n```\nYour program printed:\n```\n0\n```\n{DED_AGAIN}"
        )
    );
    assert_eq!(fb(wrong, "line"), fb(wrong, "line"));
    // A program that raises.
    let raises = "```python\nprint(1 // 0)\n```";
    assert_eq!(reward(env.score(&t, raises)), 0.0);
    assert_eq!(
        fb(raises, "first_diff"),
        format!(
            "Your answer is incorrect: your program fails test case 1 of 3: it wrote to stderr; its last line:\nZeroDivisionError: integer division or modulo by zero\n{DED_AGAIN}"
        )
    );
    let full = fb(raises, "line");
    assert!(
        full.starts_with("Your answer is incorrect: your program fails test case 1 of 3: it wrote to stderr.\nInput:\n```\n1 2\n```\nExpected output:\n```\n3\n```\nYour program printed nothing.\nYour program wrote to stderr:\n```\nTraceback (most recent call last):\n")
            && full.ends_with(&format!("ZeroDivisionError: integer division or modulo by zero\n```\n{DED_AGAIN}")),
        "{full}"
    );
    // No code block: the whole reply ran, and the feedback says so.
    let prose = "Read the two numbers and print their sum.";
    assert_eq!(reward(env.score(&t, prose)), 0.0);
    let said = fb(prose, "first_diff");
    assert!(
        said.starts_with("Your answer is incorrect: your program fails test case 1 of 3: it wrote to stderr; its last line:\nSyntaxError: ")
            && said.ends_with(&format!("No code block was found in your reply, so all of it ran as the program. {DED_AGAIN}")),
        "{said}"
    );
    for reply in [wrong, raises, prose] {
        assert_eq!(fb(reply, "verdict"), verdict(DED_AGAIN));
    }
    // The right program passes, so feedback has nothing to point at.
    let right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```";
    assert_eq!(reward(env.score(&t, right)), 1.0);
    assert_eq!(fb(right, "line"), verdict(DED_AGAIN));
}

#[test]
fn sat_needs_no_data() {
    let t = SatEnv.task(42).unwrap();
    assert!(
        t.prompt
            .starts_with("Find a satisfying assignment for the following 10-SAT formula")
    );
    assert_eq!(reward(SatEnv.score(&t, &t.expected)), 1.0);
    assert_eq!(reward(SatEnv.score(&t, "UNSAT")), 0.0);
}

#[test]
fn task_and_compare_subcommands() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::trace_train(
        dir.path(),
        &["task", "--environment", "sat", "--task_id", "0"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let planted: String = v["key"]["planted"]
        .as_str()
        .unwrap()
        .split(", ")
        .map(|a| if a.ends_with("True") { 'T' } else { 'F' })
        .collect();
    assert_eq!(planted, "FFTFFFFFFTTFTTF");
    assert_eq!(
        v["key"]["clauses"][0],
        json!([-15, 9, -12, -10, -3, -5, 2, -14, -7, -6])
    );
    let out = common::trace_train(
        dir.path(),
        &["task", "--environment", "ded", "--task_id", "100"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("task_id_out_of_range (its ids are 0..10)")
    );

    // Two reports: A strong on sat, B strong on abd, C weaker than both.
    let report = |name: &str, sat: usize, abd: usize| {
        let preds = |right: usize| -> Vec<Value> {
            (0..200)
                .map(|i| json!({"task_id": i, "completion": "", "score": if i < right { 1.0 } else { 0.0 }, "stopped": true}))
                .collect()
        };
        let path = dir.path().join(format!("{name}.json"));
        let r = trace_train::eval::envs::EnvsReport::new(
            name,
            vec![
                (
                    "sat".into(),
                    serde_json::from_value(Value::Array(preds(sat))).unwrap(),
                ),
                (
                    "abd".into(),
                    serde_json::from_value(Value::Array(preds(abd))).unwrap(),
                ),
            ],
            None,
            0.8,
        )
        .unwrap();
        r.write(&path).unwrap();
        path.display().to_string()
    };
    let (a, b, c) = (
        report("a", 180, 40),
        report("b", 40, 180),
        report("c", 30, 30),
    );
    let out = common::trace_train(
        dir.path(),
        &[
            "compare", &a, &b, &c, "--output", "s.json", "--plot", "s.png",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("A > C, B > C"), "{text}");
    let s: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("s.json")).unwrap()).unwrap();
    for v in s["verdicts"].as_array().unwrap() {
        assert_eq!(v["frontier"], json!([0, 1]), "{v}");
    }
    let png = std::fs::read(dir.path().join("s.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 5000);
    let out = common::trace_train(dir.path(), &["compare", &a]);
    assert!(!out.status.success());
    // Each report kind's command names the other when given its kind.
    let out = common::trace_train(dir.path(), &["eval", "--compare", &a, &b]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("trace-train compare A.json B.json"),
        "{e}"
    );
    std::fs::write(dir.path().join("trace.json"), r#"{"predictions": []}"#).unwrap();
    let out = common::trace_train(dir.path(), &["compare", "trace.json", &a]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("trace-train eval --compare A.json B.json"),
        "{e}"
    );
    // Reports of different tasks are not compared.
    let with_split = |from: &str, split: &str| {
        let mut r = trace_train::eval::envs::EnvsReport::read(std::path::Path::new(from)).unwrap();
        r.split = Some(split.into());
        let path = dir.path().join(format!("{split}.json"));
        r.write(&path).unwrap();
        path.display().to_string()
    };
    let (d, e) = (with_split(&a, "train"), with_split(&b, "heldout"));
    let out = common::trace_train(dir.path(), &["compare", &d, &e]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("different tasks"));
}

#[test]
fn eval_on_several_environments_writes_per_environment_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::trace_train(dir.path(), &["model", "tiny", "tiny"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `eval --environment SPEC` of two tasks an environment, four new
    // tokens, with `extra` flags: its report.
    let eval = |spec: &str, out: &str, extra: &[&str]| -> Value {
        let mut args = vec![
            "eval",
            "--model",
            "tiny",
            "--environment",
            spec,
            "--tasks",
            "2",
            "--max_new_tokens",
            "4",
            "--device",
            "cpu",
            "--output",
            out,
        ];
        args.extend_from_slice(extra);
        let o = common::trace_train(dir.path(), &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&std::fs::read(dir.path().join(out)).unwrap()).unwrap()
    };
    let r = eval("sat+ded:3", "r.json", &[]);
    let envs = r["environments"].as_array().unwrap();
    assert_eq!(envs.len(), 2);
    // The held-out tasks by default: DED's ten built-in rows hold out one.
    assert_eq!(r["split"], "heldout");
    for ((e, name), n) in envs.iter().zip(["sat", "ded"]).zip([2, 1]) {
        assert_eq!(e["environment"], name);
        assert_eq!(e["n"], n);
        assert_eq!(e["predictions"].as_array().unwrap().len(), n);
        for key in [
            "accuracy",
            "mean_score",
            "std",
            "median",
            "success_rate",
            "interval",
        ] {
            assert!(!e[key].is_null(), "{name}: {key}");
        }
        // A random tiny model answers nothing right in four tokens.
        assert_eq!(e["accuracy"], 0.0);
    }
    // Each prediction names the environment's own id of its task, the one
    // `trace-train task --task_id` takes: held-out task i is id 10i + 9.
    let own: Vec<Vec<u64>> = envs
        .iter()
        .map(|e| {
            e["predictions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["own_id"].as_u64().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(own, [vec![9, 19], vec![9]]);
    assert_eq!(r["aggregate"]["weights"], json!([1.0, 3.0]));
    assert_eq!(r["aggregate"]["n"], 3);
    // Two answers a task: SAT's own feedback on each wrong first answer,
    // and the accuracy after each turn.
    let t = eval("sat", "t.json", &["--max_turns", "2", "--feedback", "line"]);
    assert_eq!(t["feedback"], "line");
    let sat = &t["environments"][0];
    assert_eq!(sat["by_turn"].as_array().unwrap().len(), 2);
    for p in sat["predictions"].as_array().unwrap() {
        let earlier = p["earlier"].as_array().unwrap();
        assert_eq!(
            earlier.len(),
            1,
            "a random model's first answer is wrong: {p}"
        );
        assert!(
            earlier[0]["feedback"].as_str().unwrap().contains("clause"),
            "{p}"
        );
    }
    // Unknown environment: a clear error before any model is loaded.
    let out = common::trace_train(
        dir.path(),
        &["eval", "--model", "tiny", "--environment", "sat+nope"],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown environment `nope`"));
}

#[test]
fn generate_writes_sibling_sft_data_and_ppo_draws_from_a_mixture() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::trace_train(
        dir.path(),
        &[
            "generate",
            "--environment",
            "sat+ded:2",
            "--tasks",
            "4",
            "--output_dir",
            "sib",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = |f: &str| {
        std::fs::read_to_string(dir.path().join("sib").join(f))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!((lines("sat_sft.jsonl"), lines("ded_sft.jsonl")), (4, 4));
    // 8 records in all, weights 1:2.
    let mix = std::fs::read_to_string(dir.path().join("sib/mixture_sft.jsonl")).unwrap();
    assert_eq!(mix.lines().count(), 8);
    assert_eq!(
        mix.lines()
            .filter(|l| l.contains("\"environment\":\"ded\""))
            .count(),
        5
    );
    let out = common::trace_train(
        dir.path(),
        &[
            "generate",
            "--environment",
            "trace+sat",
            "--output_dir",
            "sib",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("stage2_transformed_train.jsonl"));

    // One GRPO step on sat+ded with the tiny model.
    common::word_grpo(dir.path(), 2, 1, 4);
    let out = common::trace_train(
        dir.path(),
        &common::ppo_args("rl", &["--environment", "sat+ded"]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = std::fs::read_to_string(dir.path().join("rl/metrics.jsonl")).unwrap();
    assert!(
        metrics.lines().any(|l| l.contains("\"step\":1")),
        "{metrics}"
    );
    // Reward and accuracy a mixture environment, for those the step drew;
    // their completions add up to the step's.
    let step: Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    let parts: Vec<&str> = ["sat", "ded"]
        .into_iter()
        .filter(|e| step.get(format!("reward/environment={e}")).is_some())
        .collect();
    assert!(!parts.is_empty(), "{step}");
    for e in &parts {
        let r = step[format!("reward/environment={e}")].as_f64().unwrap();
        let a = step[format!("accuracy/environment={e}")].as_f64().unwrap();
        assert!(
            (0.0..=1.0).contains(&r) && (0.0..=1.0).contains(&a) && a <= r,
            "{step}"
        );
    }
    // DED's rows from a file: a missing one is named.
    let out = common::trace_train(
        dir.path(),
        &common::ppo_args(
            "rl2",
            &[
                "--environment",
                "sat+ded",
                "--ded_dataset",
                "no-such-rows.jsonl",
            ],
        ),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no-such-rows.jsonl"),
        "{err}"
    );
    // An environment none of whose prompts fits the prompt budget stops the
    // run, named, instead of leaving the mixture without it.
    let s3 = std::fs::read_to_string(dir.path().join("s3.json")).unwrap();
    let tight = s3.replacen("\"ppo\": {", "\"ppo\": {\"max_prompt_tokens\": 64, ", 1);
    assert_ne!(tight, s3);
    std::fs::write(dir.path().join("s3tight.json"), tight).unwrap();
    let mut args = common::ppo_args("rl3", &["--environment", "sat+ded"]);
    args[4] = "s3tight.json";
    let out = common::trace_train(dir.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("longer than ppo.max_prompt_tokens (64 tokens")
            && (err.contains("environment `sat`") || err.contains("environment `ded`")),
        "{err}"
    );
}

#[test]
fn humaneval_serves_ded_with_function_call_cases() {
    let spec = concat!(
        "humaneval:",
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/humaneval_sample.jsonl"
    );
    let rows = rows::load(spec, "x").unwrap();
    assert!(!rows.is_empty());
    let env = DedEnv::new(Arc::new(rows.clone()), exec()).unwrap();
    for (id, row) in rows.iter().enumerate() {
        let t = env.task(id as u64).unwrap();
        let key = env.key(&t);
        let cases = key["cases"].as_array().unwrap();
        assert!(
            !cases.is_empty()
                && cases
                    .iter()
                    .all(|c| c["suffix"].as_str().unwrap().contains("print(result)"))
        );
        // The canonical solution passes; a stub does not.
        let demo = env.demonstration(&t).unwrap();
        assert_eq!(reward(env.score(&t, &demo)), 1.0, "{}", row.name);
        let stub = format!(
            "```python\n{}    return None\n```",
            row.prompt.as_deref().unwrap()
        );
        assert_eq!(reward(env.score(&t, &stub)), 0.0, "{}", row.name);
    }
}
