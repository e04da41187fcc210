//! One mixture drawing from four sources at once: a built-in environment
//! (`abd`, in the sandbox), a question file (`answers:q.jsonl`), a Python
//! file (`python:letters.py`, in the sandbox) and an AgentGym server
//! (examples/agentgym/counting_server.py on a free port, multi-step).
//! The real binary's `eval --environment` reports each under its own name
//! with its own n, accuracy, interval and mean score, weights only
//! weighting the aggregates; training draws the mixture's tasks by weight;
//! `compare` of two tiny models lists every source with both and gives
//! each rule's verdict and frontier. Needs the sandbox (root, as CI runs)
//! and python3, nothing from PyPI.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

use serde_json::Value;

use common::agentgym::Server;
use common::{stderr, trace_train};
use trace_train::env::registry::{self, EnvData};
use trace_train::eval::dominance::{self, EnvScore, Rule};
use trace_train::eval::envs::EnvsReport;
use trace_train::eval::jeffreys_interval;

/// A Python environment with partial credit, so that even a random model
/// scores above 0: a tenth for each different character, at most ten.
const LETTERS: &str = r#"
def task(task_id):
    return {"prompt": f"Task {task_id}: write ten different characters.", "expected": ""}


def score(task, completion):
    return min(len(set(completion)), 10) / 10
"#;

/// What LETTERS scores `completion`.
fn letters_score(completion: &str) -> f64 {
    completion.chars().collect::<BTreeSet<char>>().len().min(10) as f64 / 10.0
}

/// Each of the counting server's replies to an action.
fn counting_reply(text: &str) -> bool {
    text.contains("You are at") || text.starts_with("You reached") || text.starts_with("You passed")
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_mixture_of_four_sources_is_evaluated_per_source_and_compared() {
    let started = Instant::now();
    let server = Server::start("counting_server.py", &[]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (model, seed) in [("a", "7"), ("b", "8")] {
        let o = trace_train(d, &["model", "tiny", model, "--seed", seed]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // 20 questions: two held out (ids 9 and 19), fewer than --tasks.
    let rows: String = (0..20)
        .map(|i| {
            format!(
                "{{\"question\": \"What is {i} + {i}?\", \"answer\": \"{}\"}}\n",
                2 * i
            )
        })
        .collect();
    std::fs::write(d.join("q.jsonl"), rows).unwrap();
    std::fs::write(d.join("letters.py"), LETTERS).unwrap();
    let url = server.url("");
    let spec = format!("abd:2+answers:q.jsonl+python:letters.py+{url}?opening=none");
    let names = ["abd", "answers:q.jsonl", "python:letters.py", url.as_str()];

    let eval = |model: &str, out: &str| -> (Value, String) {
        let o = trace_train(
            d,
            &[
                "eval",
                "--model",
                model,
                "--environment",
                &spec,
                "--tasks",
                "3",
                "--max_new_tokens",
                "8",
                "--max_steps_per_episode",
                "3",
                "--device",
                "cpu",
                "--output",
                out,
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        (read(&d.join(out)), stderr(&o))
    };
    let (a, said) = eval("a", "a.json");
    let envs = a["environments"].as_array().unwrap();
    let got: Vec<&str> = envs
        .iter()
        .map(|e| e["environment"].as_str().unwrap())
        .collect();
    // Each source under its own name: the file for `answers:` and
    // `python:`, the server's address without its `?` settings.
    assert_eq!(got, names);
    // --tasks an environment whatever its weight (`abd:2` makes three
    // tasks, as the others); the question file stops at its two held-out
    // rows. Each prediction names the source's own id.
    let own = |e: &Value| -> Vec<u64> {
        e["predictions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["own_id"].as_u64().unwrap())
            .collect()
    };
    for (e, n) in envs.iter().zip([3, 2, 3, 3]) {
        let name = e["environment"].as_str().unwrap();
        assert_eq!(
            (e["n"].as_u64(), e["masked"].as_u64()),
            (Some(n), Some(0)),
            "{name}"
        );
        assert_eq!(own(e), [9, 19, 29][..n as usize], "{name}");
        // Its own accuracy, mean score and Jeffreys interval, from its own
        // predictions.
        let preds = e["predictions"].as_array().unwrap();
        let scores: Vec<f64> = preds.iter().map(|p| p["score"].as_f64().unwrap()).collect();
        let correct = e["correct"].as_u64().unwrap();
        assert_eq!(
            e["accuracy"].as_f64().unwrap(),
            correct as f64 / n as f64,
            "{name}"
        );
        let mean = scores.iter().sum::<f64>() / n as f64;
        assert!(
            (e["mean_score"].as_f64().unwrap() - mean).abs() < 1e-12,
            "{name}"
        );
        let level = e["interval"]["level"].as_f64().unwrap();
        let (lo, hi) = jeffreys_interval(correct, n, level);
        assert_eq!(
            (
                e["interval"]["lo"].as_f64().unwrap(),
                e["interval"]["hi"].as_f64().unwrap()
            ),
            (lo, hi),
            "{name}"
        );
        assert!(lo < hi && hi < 1.0, "{name}: [{lo}, {hi}]");
        // The terminal's summary has a line for it.
        assert!(
            said.lines()
                .any(|l| l.starts_with(name) && l.contains(&format!(" n {n:>5} "))),
            "{name}: {said}"
        );
    }
    // The Python file scored each completion (in the sandbox), and a
    // random model's characters earn partial credit.
    let py = &envs[2];
    for p in py["predictions"].as_array().unwrap() {
        let c = p["completion"].as_str().unwrap();
        assert_eq!(p["score"].as_f64().unwrap(), letters_score(c), "{p}");
    }
    assert!(py["mean_score"].as_f64().unwrap() > 0.0, "{py}");
    // The server's episodes: several steps each, every observation the
    // counting game's, success or not, and the steps counted.
    let http = &envs[3];
    for p in http["predictions"].as_array().unwrap() {
        assert!(p["success"].is_boolean(), "{p}");
        let earlier = p["earlier"].as_array().unwrap();
        assert!(earlier.len() < 3, "at most 3 steps: {p}");
        for step in earlier {
            assert!(counting_reply(step["feedback"].as_str().unwrap()), "{p}");
        }
    }
    let steps = http["mean_steps"].as_f64().unwrap();
    assert!((1.0..=3.0).contains(&steps), "{steps}");
    // The weights weight the aggregates only.
    let agg = &a["aggregate"];
    assert_eq!(agg["weights"], serde_json::json!([2.0, 1.0, 1.0, 1.0]));
    assert_eq!(agg["n"], 11);
    let weighted: f64 = envs
        .iter()
        .zip([2.0, 1.0, 1.0, 1.0])
        .map(|(e, w)| w * e["mean_score"].as_f64().unwrap())
        .sum::<f64>()
        / 5.0;
    assert!((agg["weighted_mean_score"].as_f64().unwrap() - weighted).abs() < 1e-12);

    // The second model, on the same tasks of the same server.
    let (b, _) = eval("b", "b.json");
    let completions = |r: &Value| -> Vec<String> {
        r["environments"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|e| e["predictions"].as_array().unwrap().iter())
            .map(|p| p["completion"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_ne!(completions(&a), completions(&b), "two seeds, two models");
    let st = server.stats();
    assert_eq!(st["open"], 0, "every session closed: {st}");
    assert!(st["created"].as_u64().unwrap() >= 6, "{st}");

    let o = trace_train(d, &["compare", "a.json", "b.json", "--output", "s.json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let s = read(&d.join("s.json"));
    assert_eq!(s["environments"], serde_json::json!(names));
    assert_eq!(s["left_out"], serde_json::json!([]));
    // Every source with both models: the table's rows and the JSON's cells
    // are each report's numbers, the interval the Beta rule's.
    let reports = [
        EnvsReport::read(&d.join("a.json")).unwrap(),
        EnvsReport::read(&d.join("b.json")).unwrap(),
    ];
    let lines: Vec<&str> = text.lines().collect();
    for (e, name) in names.iter().enumerate() {
        let at = lines
            .iter()
            .position(|l| l == name)
            .unwrap_or_else(|| panic!("no `{name}` row in\n{text}"));
        for (m, (letter, r)) in ["A", "B"].iter().zip(&reports).enumerate() {
            let want = &r.environments[e].metrics;
            let cell = &s["models"][m]["cells"][e];
            assert_eq!(cell["n"].as_u64(), Some(want.n as u64), "{name} {letter}");
            assert_eq!(
                cell["mean_score"].as_f64(),
                Some(want.mean_score),
                "{name} {letter}"
            );
            let (lo, hi) = dominance::beta_interval(want.score_sum, want.n, 0.9);
            assert!(
                (cell["lo"].as_f64().unwrap() - lo).abs() < 1e-12,
                "{name} {letter}"
            );
            assert!(
                (cell["hi"].as_f64().unwrap() - hi).abs() < 1e-12,
                "{name} {letter}"
            );
            let row = lines[at + 1 + m];
            let fields: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(fields[0], *letter, "{row}");
            assert_eq!(fields[1], want.n.to_string(), "{row}");
            assert_eq!(fields[3], format!("{:.3}", want.mean_score), "{row}");
        }
    }
    // Each rule's verdict is the rule applied to the two reports' scores,
    // and the table prints it with its frontier.
    let scores: Vec<Vec<EnvScore>> = reports
        .iter()
        .map(|r| {
            r.environments
                .iter()
                .map(|e| EnvScore {
                    n: e.metrics.n,
                    sum: e.metrics.score_sum,
                })
                .collect()
        })
        .collect();
    let verdicts = s["verdicts"].as_array().unwrap();
    assert_eq!(verdicts.len(), 3);
    let letter = |i: u64| ["A", "B"][i as usize];
    for (v, rule) in verdicts
        .iter()
        .zip([Rule::Pareto, Rule::Beta { level: 0.9 }, Rule::Threshold])
    {
        let want = dominance::verdict(rule, &scores);
        assert_eq!(v["rule"], serde_json::to_value(rule).unwrap());
        assert_eq!(
            v["dominates"],
            serde_json::to_value(&want.dominates).unwrap(),
            "{v}"
        );
        assert_eq!(
            v["frontier"],
            serde_json::to_value(&want.frontier).unwrap(),
            "{v}"
        );
        assert!(!want.frontier.is_empty());
        let frontier: Vec<&str> = v["frontier"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| letter(i.as_u64().unwrap()))
            .collect();
        assert!(
            text.contains(&format!("  frontier:  {}\n", frontier.join(", "))),
            "{}: {text}",
            rule.name()
        );
        let pairs: Vec<String> = v["dominates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                format!(
                    "{} > {}",
                    letter(p[0].as_u64().unwrap()),
                    letter(p[1].as_u64().unwrap())
                )
            })
            .collect();
        let dominates = if pairs.is_empty() {
            "none".to_owned()
        } else {
            pairs.join(", ")
        };
        assert!(
            text.contains(&format!("  dominates: {dominates}\n")),
            "{}: {text}",
            rule.name()
        );
    }

    // Two parts named alike are refused before anything is decoded: the
    // same server under two settings.
    let twice = format!("{url}?opening=none+{url}?opening=none&tasks=50");
    let o = trace_train(
        d,
        &[
            "eval",
            "--model",
            "a",
            "--environment",
            &twice,
            "--device",
            "cpu",
        ],
    );
    let e = stderr(&o);
    assert!(
        !o.status.success() && e.contains("both named") && e.contains("hint:"),
        "{e}"
    );
    eprintln!(
        "four-source eval, twice, and compare: {:.1?}",
        started.elapsed()
    );
}

#[test]
fn training_draws_a_four_source_mixture_by_weight() {
    let server = Server::start("counting_server.py", &[]);
    let dir = tempfile::tempdir().unwrap();
    let (q, py) = (dir.path().join("q.jsonl"), dir.path().join("letters.py"));
    let rows: String = (0..20)
        .map(|i| {
            format!(
                "{{\"question\": \"What is {i} + 1?\", \"answer\": \"{}\"}}\n",
                i + 1
            )
        })
        .collect();
    std::fs::write(&q, rows).unwrap();
    std::fs::write(&py, LETTERS).unwrap();
    let url = server.url("");
    let spec = format!(
        "abd:2+answers:{}+python:{}+{url}?opening=none",
        q.display(),
        py.display()
    );
    let data = EnvData {
        num_workers: Some(2),
        ..EnvData::default()
    };
    let (env, description) = registry::for_training(&spec, &data, false, 2).unwrap();
    assert!(env.multi_step(), "the server's episodes");
    let names = [
        "abd".to_owned(),
        format!("answers:{}", q.display()),
        format!("python:{}", py.display()),
        url.clone(),
    ];
    // Stage 3's per-environment metrics name the parts.
    assert_eq!(env.parts(), names);
    assert!(
        description.contains(&format!("python:{}:sha256:", py.display())),
        "{description}"
    );
    // 400 draws at weights 2:1:1:1.
    let ids: Vec<u64> = (0..400).collect();
    let mut drawn = [0usize; 4];
    for &id in &ids {
        drawn[env.part_of(id).unwrap()] += 1;
    }
    assert!(
        (120..=200).contains(&drawn[0]),
        "abd at weight 2: {drawn:?}"
    );
    for (k, n) in drawn.iter().enumerate().skip(1) {
        assert!((50..=110).contains(n), "{}: {drawn:?}", names[k]);
    }
    // A task of every source, made through the mixture.
    let firsts: Vec<u64> = (0..4)
        .map(|k| *ids.iter().find(|&&id| env.part_of(id) == Some(k)).unwrap())
        .collect();
    let tasks: Vec<_> = env.tasks(&firsts).into_iter().map(Result::unwrap).collect();
    assert!(tasks[1].prompt.contains("+ 1?"), "{}", tasks[1].prompt);
    assert!(
        tasks[2].prompt.contains("write ten different characters"),
        "{}",
        tasks[2].prompt
    );
    assert!(
        tasks[3].prompt.starts_with("Count to exactly"),
        "{}",
        tasks[3].prompt
    );
    // Training tasks only: no held-out row of the question file.
    let held: BTreeSet<String> = ["What is 9 + 1?", "What is 19 + 1?"]
        .map(String::from)
        .into();
    for id in ids.iter().filter(|&&id| env.part_of(id) == Some(1)) {
        let t = env.task(*id).unwrap();
        assert!(
            !held.iter().any(|h| t.prompt.starts_with(h)),
            "{}",
            t.prompt
        );
    }
}
