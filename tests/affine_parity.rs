//! Scorer parity: our SAT, ABD and DED scoring against a short Python
//! reference written from the documentation (benches/affine_scorer_ref.py),
//! on 600 seeded replies an environment: right answers, wrong ones, and
//! adversarial ones aimed at every documented quirk and at the places
//! where Rust's and Python's string rules differ (line breaks, whitespace,
//! Unicode digits and word characters, case folding). Programs are not
//! run: both sides simulate the run the same way (ABD: the program echoes
//! the stdin the reply gives; DED: it prints its own code), so what is
//! compared is extraction, gating and judging. Every score must be
//! identical. Without /usr/bin/python3 the test prints SKIPPED.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use trace_train::env::affine::{abd, ded, run::PyRun, sat};
use trace_train::rng::SplitMix64;

const PYTHON: &str = "/usr/bin/python3";
const PER_ENV: usize = 600;

fn pick<'a>(r: &mut SplitMix64, items: &[&'a str]) -> &'a str {
    items[r.below(items.len() as u64) as usize]
}

/// Noise that the scorers must treat as Python does.
const NOISE: &[&str] = &[
    "", " ", "\n", "\r\n", "\t", "\u{1c}", "\u{1d}", "\u{1e}", "\u{1f}", "\u{85}", "\u{a0}",
    "\u{2028}", "\u{2029}", "\u{3000}", "\u{b}", "\u{c}", "\r", "\u{200b}",
];

fn sat_reply(r: &mut SplitMix64, task_id: u64) -> String {
    let f = sat::Formula::new(task_id);
    let good = f.planted_answer();
    let mut s = match r.below(14) {
        0 | 1 => good.clone(),
        2 => good.replace("=True", "=1").replace("=False", "=0"),
        3 => good.replace("=True", "=true"),
        4 => good.replace('=', " = "),
        5 => good.replace("x1=", "xx1=").replace("x2=", "\u{ac}x2="),
        6 => good
            .replace("x3=", "x03=")
            .replace("x4=", "x\u{664}=")
            .replace("x5=", "x\u{ff15}="),
        7 => good.replace("x6=", "x\u{2076}="), // superscript: no \d
        8 => format!("<think>{}</think>{good}", good.replace("True", "False")),
        9 => format!("{good}\n<think>{}</think>", good.replace("True", "False")),
        10 => "UNSAT".to_owned(),
        11 => good.replace("=True", "=10").replace("=False", "=01"),
        12 => {
            // Random assignment.
            (1..=15)
                .map(|i| format!("x{i}={}", if r.chance(0.5) { "True" } else { "False" }))
                .collect::<Vec<_>>()
                .join(", ")
        }
        _ => format!("{good}, x16=True, x99999999999999999999999=False"),
    };
    if r.chance(0.2) {
        // Flip one planted value: sometimes still satisfying.
        let i = 1 + r.below(15);
        let flip = |v: &str| if v == "True" { "False" } else { "True" };
        let v = if f.planted[i as usize - 1] {
            "True"
        } else {
            "False"
        };
        s = s.replacen(&format!("x{i}={v}"), &format!("x{i}={}", flip(v)), 1);
    }
    if r.chance(0.05) {
        s = pick(r, NOISE).to_owned();
    }
    format!("{}{s}{}", pick(r, NOISE), pick(r, NOISE))
}

const PROGRAMS: &[&str] = &[
    "print(input())",
    "a = input()\nb = input()\nprint(a, b)",
    "for _ in range(int(input())):\n    print(input())",
    "import sys\nprint(sys.stdin.read())",
    "print(1)",
    "x = input()\ny = input()\nz = input()",
];

fn abd_block(r: &mut SplitMix64) -> String {
    let words = [
        "1", "2", "3", "ab", " c ", "²", "\u{663}", "10", "", "  ", "x\ty",
    ];
    let n = r.below(5);
    let mut s = String::new();
    for i in 0..n {
        if i > 0 || r.chance(0.3) {
            s.push_str(pick(
                r,
                &["\n", "\r\n", "\r", "\u{1e}", "\u{c}", "\u{2028}", "\n\n"],
            ));
        }
        s.push_str(pick(r, &words));
    }
    s.push_str(pick(r, NOISE));
    s
}

fn abd_reply(r: &mut SplitMix64) -> String {
    let tags = [
        ("<INPUT>", "</INPUT>"),
        ("<input>", "</input>"),
        ("<Input>", "</INPUT>"),
        ("<\u{131}nput>", "</INPUT>"),
        ("<\u{130}NPUT>", "</\u{130}NPUT>"),
        ("<INPUT >", "</INPUT>"),
        ("<INPUT>", "</OUTPUT>"),
    ];
    let mut s = String::new();
    for _ in 0..=r.below(3) {
        let (open, close) = tags[r.below(tags.len() as u64) as usize];
        let block = format!("{open}{}{close}", abd_block(r));
        let wrapped = match r.below(6) {
            0 => format!("<think>{block}</think>"),
            1 => format!("<thinking>{block}</thinking>"),
            2 => format!("<think>{block}"),
            3 => format!("<THINK>{block}</THINK>"),
            _ => block,
        };
        s.push_str(pick(r, &["", "Here you go:\n", "Reasoning... ", "\n\n"]));
        s.push_str(&wrapped);
    }
    if r.chance(0.1) {
        s = abd_block(r);
    }
    s
}

fn ded_reply(r: &mut SplitMix64) -> String {
    let code = [
        "print(1)",
        "print(2)\nprint(3)",
        "x",
        "print(1) ",
        "  print(1)",
        "1\n\n2",
    ];
    let tags = [
        "python",
        "Python",
        "PYTHON",
        "py",
        "",
        "python3",
        "python ",
        "python\t",
        "text",
        "a\u{345}",
        "a\u{b2}",
        "\u{1c}",
        "python\u{1f}",
    ];
    let mut s = String::new();
    for _ in 0..=r.below(3) {
        let c = pick(r, &code);
        let tag = pick(r, &tags);
        let nl = pick(r, &["\n", "", " ", "\r\n", "\u{85}"]);
        let block = match r.below(5) {
            0 => c.to_owned(),
            1 => format!("```{tag}{nl}{c}"),
            _ => format!("```{tag}{nl}{c}{}```", pick(r, &["\n", "", " \n"])),
        };
        s.push_str(pick(r, &["", "Solution:\n", "<think>", "</think>", "\n"]));
        s.push_str(&block);
    }
    s
}

#[test]
fn scores_match_the_python_reference() {
    if !std::path::Path::new(PYTHON).exists() {
        println!("SKIPPED: {PYTHON} not found");
        return;
    }
    let mut r = SplitMix64::new(20);
    let mut items: Vec<Value> = Vec::new();
    for i in 0..PER_ENV {
        let task_id = [0, 1, 42, 7, 1000 + i as u64][i % 5];
        items.push(json!({"env": "sat", "task_id": task_id, "reply": sat_reply(&mut r, task_id)}));
    }
    let expected_outputs = [
        "1\n",
        "1\n2\n",
        "2\na\nb\n",
        "ab\n",
        " c\n",
        "1",
        "\r\n1\r\n",
    ];
    for _ in 0..PER_ENV {
        let reply = abd_reply(&mut r);
        let program = pick(&mut r, PROGRAMS);
        // Right answers: the expected output is what the echo prints.
        let expected = if r.chance(0.4) {
            match abd::extract(trace_train::env::affine::py::strip(&reply), program) {
                Ok(stdin) => stdin,
                Err(_) => pick(&mut r, &expected_outputs).to_owned(),
            }
        } else {
            pick(&mut r, &expected_outputs).to_owned()
        };
        let stderr = if r.chance(0.85) {
            ""
        } else {
            pick(&mut r, &[" ", "\n", "Warning"])
        };
        items.push(json!({"env": "abd", "reply": reply, "program": program, "expected": expected, "stderr": stderr}));
    }
    for _ in 0..PER_ENV {
        let reply = ded_reply(&mut r);
        let code = trace_train::env::affine::run::strip_fences(
            trace_train::env::affine::py::strip(&reply),
        );
        let n = r.below(4);
        let cases: Vec<Value> = (0..n)
            .map(|_| match r.below(4) {
                0 => Value::Null,
                1 => json!(pick(&mut r, &["print(1)", "print(2)\nprint(3)", "x"])),
                _ => json!(format!(
                    "{code}{}",
                    pick(&mut r, &["", " ", "\n\n", "\r\n"])
                )),
            })
            .collect();
        let stderr = if r.chance(0.85) {
            ""
        } else {
            pick(&mut r, &[" \n", "Traceback"])
        };
        items.push(json!({"env": "ded", "reply": reply, "cases": cases, "stderr": stderr}));
    }

    let mut child = Command::new(PYTHON)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/affine_scorer_ref.py"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the reference");
    let input: String = items.iter().map(|v| format!("{v}\n")).collect();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Vec<f64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["score"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(theirs.len(), items.len());

    let mut ones = std::collections::BTreeMap::<&str, (usize, usize)>::new();
    for (item, want) in items.iter().zip(&theirs) {
        let env = item["env"].as_str().unwrap();
        let reply = item["reply"].as_str().unwrap();
        let stderr = item["stderr"].as_str().unwrap_or_default().to_owned();
        let ours = match env {
            "sat" => sat::score(
                reply,
                &sat::Formula::new(item["task_id"].as_u64().unwrap()).clauses,
            ),
            "abd" => abd::score_reply(
                reply,
                item["program"].as_str().unwrap(),
                item["expected"].as_str().unwrap(),
                |stdin| {
                    Ok(PyRun {
                        stdout: stdin.to_owned(),
                        stderr,
                    })
                },
            )
            .unwrap(),
            _ => {
                let cases = item["cases"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| {
                        c.as_str().map(|e| ded::Case {
                            suffix: String::new(),
                            stdin: "\n".into(),
                            expected: e.to_owned(),
                        })
                    })
                    .collect();
                ded::score_cases(&ded::Tests::Cases(cases), reply, |code, _| {
                    Ok(PyRun {
                        stdout: code.to_owned(),
                        stderr: stderr.clone(),
                    })
                })
                .unwrap()
            }
        };
        assert_eq!(ours, *want, "{env}: {item}");
        let e = ones.entry(env).or_default();
        e.0 += 1;
        e.1 += usize::from(ours == 1.0);
    }
    // The replies exercise both outcomes in every environment.
    for (env, (n, right)) in &ones {
        println!("{env}: {n} replies, {right} scored 1.0, identical to the reference");
        assert_eq!(*n, PER_ENV);
        assert!(
            *right > n / 10 && *right < n * 9 / 10,
            "{env}: {right} of {n} right"
        );
    }
}
