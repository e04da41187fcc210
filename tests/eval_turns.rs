//! `eval --max_turns K`: multi-turn episodes scored turn by turn, on the
//! CPU with the project's tiny chat model.
//!
//! - One turn is today's eval: the same report, byte for byte.
//! - The episodes' driver builds each later turn's prompt from the
//!   conversation (checked against the chat template over the whole
//!   conversation on scripted answers), feeds back Stage 3's text, and
//!   decodes each turn's prompts of all items in one sampler call.
//! - Two turns with the real model: the report's turns agree with its
//!   predictions, and turn 1 is the single-turn eval.
//! - Bad flag values name the flag and give a hint.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{stderr, trace_train};
use trace_train::data::{ChatTokenizer, Message, Role};
use trace_train::eval::turns::run_episodes;
use trace_train::eval::{DEFAULT_LEVEL, EvalItem, Prediction, Report};
use trace_train::model::decode::generate::Generation;
use trace_train::reward;

/// Records in `generate`'s layout: prompts `print({i} * 3)`, answers their
/// products, one or two lines.
fn write_records(path: &Path, n: usize) {
    let mut text = String::new();
    for i in 0..n {
        let prompt = format!("print({i} * 3)");
        let answer = if i % 2 == 0 {
            (i * 3).to_string()
        } else {
            format!("{}\n{}", i * 3, i)
        };
        let rec = serde_json::json!({
            "messages": [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": answer},
            ],
            "program": prompt, "input": "", "expected_output": answer,
            "metadata": {"row_index": i, "seed": null, "output_lines": answer.lines().count(),
                         "features": {"lines": 1, "loop_depth": 0}},
        });
        text.push_str(&format!("{rec}\n"));
    }
    std::fs::write(path, text).unwrap();
}

/// A folder with the tiny chat model (`base`) and six records.
fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let o = trace_train(dir.path(), &["model", "tiny", "base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    write_records(&dir.path().join("items.jsonl"), 6);
    dir
}

fn eval(dir: &Path, out: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "eval",
        "--model",
        "base",
        "--data",
        "items.jsonl",
        "--output",
        out,
        "--max_new_tokens",
        "6",
        "--device",
        "cpu",
    ];
    args.extend(extra);
    trace_train(dir, &args)
}

/// A scripted sampler call: each prompt is the episode whose turn-1
/// prompt (`firsts[i]`) it starts with, and gets `answer(i, turn)` (the
/// turn counted from 0 by the calls so far); the call's (episode,
/// prompt) pairs go to `calls`.
fn scripted<'a>(
    tok: &ChatTokenizer,
    firsts: &[Vec<u32>],
    prompts: &[Vec<u32>],
    calls: &mut Vec<Vec<(usize, Vec<u32>)>>,
    answer: impl Fn(usize, usize) -> &'a str,
) -> Vec<Generation> {
    let turn = calls.len();
    let mut call = Vec::new();
    let gens = prompts
        .iter()
        .map(|p| {
            let i = (0..firsts.len())
                .find(|&i| p.starts_with(&firsts[i]))
                .expect("a prompt of an episode");
            call.push((i, p.clone()));
            let tokens = tok.encode(answer(i, turn)).unwrap();
            Generation {
                logprobs: vec![0.0; tokens.len()],
                tokens,
                stopped: true,
                stop_logprob: Some(0.0),
            }
        })
        .collect();
    calls.push(call);
    gens
}

/// An episode's first prompt: `prompt` as one user message through the
/// chat template.
fn first_turn(tok: &ChatTokenizer, prompt: &str) -> Vec<u32> {
    tok.encode_prompt(&[Message::new(Role::User, prompt)])
        .unwrap()
}

fn read(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// `--max_turns 1` (and leaving it out) writes the report eval wrote
/// before episodes existed: the single-turn pass, rebuilt here from the
/// library's parts as eval ran it (prompts sorted by length, one batch,
/// `Report::new`), byte for byte.
#[test]
fn one_turn_is_the_single_turn_report() {
    let dir = setup();
    let d = dir.path();
    for (out, extra) in [
        ("default.json", &[][..]),
        ("one.json", &["--max_turns", "1"][..]),
    ] {
        let o = eval(d, out, extra);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(!stderr(&o).contains("after turn"), "{}", stderr(&o));
    }
    let default = std::fs::read(d.join("default.json")).unwrap();
    assert_eq!(default, std::fs::read(d.join("one.json")).unwrap());

    let model_dir = d.join("base");
    let tok = ChatTokenizer::from_dir(&model_dir).unwrap();
    let device = candle_core::Device::Cpu;
    let loaded =
        trace_train::model::load(&model_dir, None, candle_core::DType::F32, &device).unwrap();
    let text = std::fs::read_to_string(d.join("items.jsonl")).unwrap();
    let items: Vec<EvalItem> = text
        .lines()
        .map(|l| EvalItem::from_record(&serde_json::from_str(l).unwrap()).unwrap())
        .collect();
    let prompts: Vec<Vec<u32>> = items
        .iter()
        .map(|it| first_turn(&tok, &it.prompt))
        .collect();
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| prompts[i].len());
    let batch: Vec<Vec<u32>> = order.iter().map(|&i| prompts[i].clone()).collect();
    let gens = trace_train::model::decode::generate::greedy(
        &loaded.model,
        &batch,
        6,
        &tok.stop_ids(),
        tok.pad().id,
        0,
        &device,
    )
    .unwrap();
    let mut preds: Vec<Option<Prediction>> = vec![None; items.len()];
    for (&i, g) in order.iter().zip(gens) {
        let text = tok.decode(&g.tokens, true).unwrap();
        preds[i] = Some(Prediction::new(&items[i], text, g.stopped));
    }
    let want = Report::new(
        preds.into_iter().map(Option::unwrap).collect(),
        DEFAULT_LEVEL,
    );
    want.write(&d.join("rebuilt.json")).unwrap();
    assert_eq!(
        String::from_utf8(default).unwrap(),
        std::fs::read_to_string(d.join("rebuilt.json")).unwrap()
    );
    let v = read(&d.join("one.json"));
    assert!(v.get("turns").is_none(), "{v}");
    assert!(
        v["predictions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p.get("earlier").is_none())
    );
}

/// Scripted answers through the episodes' driver with the tiny model's
/// tokenizer: each turn's prompts of the items still wrong go to the
/// sampler together, each is the chat template applied to the whole
/// conversation (the item, the answers, Stage 3's feedback text), and the
/// report counts the turns and the unchanged retries.
#[test]
fn later_turns_hold_the_feedback_and_are_decoded_together() {
    let dir = tempfile::tempdir().unwrap();
    trace_train::model::arch::tiny::write_tiny_chat_model(dir.path(), 7).unwrap();
    let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
    let item = |id: &str, expected: &str| EvalItem {
        id: id.into(),
        prompt: format!("program {id}"),
        expected: expected.into(),
        difficulty: Default::default(),
    };
    let items = [
        item("a", "7"),
        item("b", "1\n2\n3"),
        item("c", "5"),
        item("d", "x"),
    ];
    // Each item's answer at turns 1, 2, 3: a right at once; b at turn 2;
    // c never, repeating its answer (spacing aside); d at turn 3.
    let script: BTreeMap<&str, [&str; 3]> = [
        ("a", ["7", "-", "-"]),
        ("b", ["0\n2\n4", "1\n2\n3", "-"]),
        ("c", ["6", " 6", "6 "]),
        ("d", ["y", "z", "x"]),
    ]
    .into_iter()
    .collect();
    let firsts: Vec<Vec<u32>> = items
        .iter()
        .map(|it| first_turn(&tok, &it.prompt))
        .collect();
    let kind = "line";
    let mut calls: Vec<Vec<(usize, Vec<u32>)>> = Vec::new();
    let preds = run_episodes(&items, &tok, 3, kind, |prompts| {
        Ok(scripted(&tok, &firsts, prompts, &mut calls, |i, turn| {
            script[items[i].id.as_str()][turn]
        }))
    })
    .unwrap();
    // One sampler call a turn, with every item still going.
    let who: Vec<Vec<&str>> = calls
        .iter()
        .map(|c| c.iter().map(|(i, _)| items[*i].id.as_str()).collect())
        .collect();
    assert_eq!(
        who,
        [
            vec!["a", "b", "c", "d"],
            vec!["b", "c", "d"],
            vec!["c", "d"]
        ]
    );
    // Each prompt is the template over the whole conversation so far.
    for (turn, call) in calls.iter().enumerate() {
        for (i, prompt) in call {
            let it = &items[*i];
            let mut chat = vec![Message::new(Role::User, it.prompt.clone())];
            for said in &script[it.id.as_str()][..turn] {
                chat.push(Message::new(Role::Assistant, *said));
                chat.push(Message::new(
                    Role::User,
                    reward::feedback(said, &it.expected, kind),
                ));
            }
            assert_eq!(
                prompt,
                &tok.encode_prompt(&chat).unwrap(),
                "{} turn {}",
                it.id,
                turn + 1
            );
            // `line` names the line where the answer has another wrong one
            // (b) and never where it would complete the answer (one-line
            // outputs).
            if turn > 0 {
                let text = tok.decode(prompt, false).unwrap();
                assert_eq!(text.contains("should be:"), it.id == "b", "{text}");
            }
        }
    }
    // Each item's last answer, with the earlier ones and their feedback.
    let answers: Vec<(usize, bool)> = preds.iter().map(|p| (p.answers(), p.correct())).collect();
    assert_eq!(answers, [(1, true), (2, true), (3, false), (3, true)]);
    for (p, it) in preds.iter().zip(&items) {
        for (a, said) in p.earlier.iter().zip(script[it.id.as_str()]) {
            assert_eq!(a.completion, said);
            assert_eq!(a.feedback, reward::feedback(said, &it.expected, kind));
        }
    }
    let r = Report::multi_turn(preds, DEFAULT_LEVEL, 3, kind);
    let t = r.turns.as_ref().unwrap();
    let correct: Vec<usize> = t.by_turn.iter().map(|x| x.correct).collect();
    assert_eq!(correct, [1, 2, 3]);
    assert_eq!(r.correct, 3, "the report's accuracy is after the last turn");
    // Retries 0 + 1 + 2 + 2; c's two repeat its answer.
    assert_eq!((t.retries, t.unchanged_retries), (5, 2));
    assert!(
        r.summary()
            .contains("after turn 1 25.0%, 2 50.0%, 3 75.0%; retries 5, unchanged 40.0%")
    );
}

/// An environment that wants `expected`: its feedback names the answer it
/// got, and it cannot give feedback on task `c` (as a sandbox failure).
struct Wants;

impl trace_train::env::Environment for Wants {
    fn name(&self) -> &'static str {
        "wants"
    }
    fn task(&self, _: u64) -> Result<trace_train::env::Task, String> {
        Err("scripted".into())
    }
    fn score(&self, task: &trace_train::env::Task, completion: &str) -> trace_train::env::Score {
        trace_train::env::Score::Reward(f64::from(u8::from(completion.trim() == task.expected)))
    }
    fn feedback(
        &self,
        task: &trace_train::env::Task,
        completion: &str,
        kind: &str,
    ) -> Result<String, String> {
        if task.prompt.ends_with('c') {
            return Err("sandbox down".into());
        }
        Ok(format!("{kind}: not `{completion}`"))
    }
}

/// Environment episodes (`eval --environment --max_turns K`): each turn's
/// prompts of the tasks still going in one sampler call, each prompt the
/// template over the conversation with the environment's own feedback,
/// the episode ending at a score of 1.0 or masked where the environment
/// cannot give feedback; the report's accuracy after each turn.
#[test]
fn environment_episodes_take_the_environments_feedback() {
    use trace_train::env::{Environment, Task};
    use trace_train::eval::envs::EnvsReport;
    use trace_train::eval::turns::run_env_episodes;
    let dir = tempfile::tempdir().unwrap();
    trace_train::model::arch::tiny::write_tiny_chat_model(dir.path(), 7).unwrap();
    let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
    let task = |id: u64, name: &str, expected: &str| Task {
        task_id: id,
        prompt: format!("task {name}"),
        expected: expected.into(),
        difficulty: Default::default(),
    };
    let tasks = [
        task(0, "a", "1"),
        task(1, "b", "2"),
        task(2, "c", "3"),
        task(3, "d", "4"),
    ];
    // Answers at turns 1 and 2: a at once, b at turn 2, c's feedback fails,
    // d never.
    let script: [[&str; 2]; 4] = [["1", "-"], ["9", "2"], ["8", "-"], ["7", "6"]];
    let env = Wants;
    let flat: Vec<(&dyn Environment, &Task)> = tasks
        .iter()
        .map(|t| (&env as &dyn Environment, t))
        .collect();
    let firsts: Vec<Vec<u32>> = tasks.iter().map(|t| first_turn(&tok, &t.prompt)).collect();
    let mut calls: Vec<Vec<(usize, Vec<u32>)>> = Vec::new();
    let preds = run_env_episodes(&flat, &tok, 2, 20, "line", |prompts| {
        Ok(scripted(&tok, &firsts, prompts, &mut calls, |i, turn| {
            script[i][turn]
        }))
    })
    .unwrap();
    let who: Vec<Vec<usize>> = calls
        .iter()
        .map(|c| c.iter().map(|(i, _)| *i).collect())
        .collect();
    assert_eq!(who, [vec![0, 1, 2, 3], vec![1, 3]]);
    for (i, prompt) in &calls[1] {
        let said = script[*i][0];
        let chat = [
            Message::new(Role::User, tasks[*i].prompt.clone()),
            Message::new(Role::Assistant, said),
            Message::new(Role::User, format!("line: not `{said}`")),
        ];
        assert_eq!(prompt, &tok.encode_prompt(&chat).unwrap(), "task {i}");
    }
    let got: Vec<(usize, Option<f64>, bool)> = preds
        .iter()
        .map(|p| (p.answers(), p.score, p.masked.is_some()))
        .collect();
    assert_eq!(
        got,
        [
            (1, Some(1.0), false),
            (2, Some(1.0), false),
            (1, None, true),
            (2, Some(0.0), false)
        ]
    );
    assert_eq!(preds[1].earlier[0].completion, "9");
    assert_eq!(preds[1].earlier[0].feedback, "line: not `9`");
    assert!(preds[2].masked.as_deref().unwrap().contains("sandbox down"));
    let mut r = EnvsReport::new("m", vec![("wants".into(), preds)], None, DEFAULT_LEVEL).unwrap();
    r.count_turns(2, "line", DEFAULT_LEVEL);
    let s = &r.environments[0];
    let by: Vec<usize> = s.by_turn.iter().map(|t| t.correct).collect();
    assert_eq!((s.metrics.n, s.metrics.masked, by), (3, 1, vec![1, 2]));
    assert_eq!(r.feedback.as_deref(), Some("line"));
    assert!(
        r.summary().contains("after turn 1 33.3%, 2 66.7%"),
        "{}",
        r.summary()
    );
}

/// Two turns with the tiny model through the command line: the report's
/// turns agree with its predictions, accuracy never falls from turn 1 to
/// turn 2, and turn 1 gives the single-turn eval's answers.
#[test]
fn two_turns_are_scored_turn_by_turn() {
    let dir = setup();
    let d = dir.path();
    let o = eval(d, "one.json", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = eval(
        d,
        "two.json",
        &[
            "--max_turns",
            "2",
            "--feedback",
            "first_diff",
            "--batch_size",
            "4",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("after turn") && err.contains("unchanged"),
        "{err}"
    );
    let (one, two) = (read(&d.join("one.json")), read(&d.join("two.json")));
    let t = &two["turns"];
    assert_eq!(t["max_turns"], 2);
    assert_eq!(t["feedback"], "first_diff");
    let by: Vec<u64> = t["by_turn"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["correct"].as_u64().unwrap())
        .collect();
    assert_eq!(by.len(), 2);
    assert!(by[0] <= by[1], "{t}");
    assert_eq!(by[1], two["correct"].as_u64().unwrap());
    assert_eq!(
        by[0],
        one["correct"].as_u64().unwrap(),
        "turn 1 is one answer"
    );
    let (mut retries, mut unchanged) = (0, 0);
    let preds = two["predictions"].as_array().unwrap();
    for (p, q) in preds.iter().zip(one["predictions"].as_array().unwrap()) {
        let earlier = p.get("earlier").and_then(|e| e.as_array());
        let first = earlier.map_or(&p["completion"], |e| &e[0]["completion"]);
        assert_eq!(first, &q["completion"], "turn 1 differs from one turn");
        let Some(earlier) = earlier else {
            assert_eq!(p["score"], 1.0, "only a right answer ends at turn 1: {p}");
            continue;
        };
        assert_eq!(earlier.len(), 1, "{p}");
        let (said, expected) = (
            earlier[0]["completion"].as_str().unwrap(),
            p["expected"].as_str().unwrap(),
        );
        assert_eq!(
            earlier[0]["feedback"].as_str().unwrap(),
            reward::feedback(said, expected, "first_diff")
        );
        retries += 1;
        unchanged += usize::from(reward::same_answer(said, p["completion"].as_str().unwrap()));
    }
    assert_eq!(t["retries"], retries);
    assert_eq!(t["unchanged_retries"], unchanged);
    // A random tiny model is wrong nearly always: there were retries.
    assert!(retries > 0, "{two}");
    let back = Report::read(&d.join("two.json")).unwrap();
    assert_eq!(back.turns.unwrap().retries, retries);
}

/// Bad values of --max_turns and --feedback, and flags that do not go
/// together, stop eval with the flag named and a hint.
#[test]
fn bad_turn_flags_name_the_flag_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (&["--max_turns", "0"], &["--max_turns", "at least one"]),
        (&["--max_turns", "two"], &["--max_turns", "`two`"]),
        (
            &["--max_turns", "2", "--feedback", "nope"],
            &["--feedback", "`nope`", "first_diff"],
        ),
        (&["--feedback", "line"], &["--feedback", "--max_turns 2"]),
        (
            &["--environment", "sat", "--feedback", "line"],
            &["--feedback", "--max_turns 2"],
        ),
    ];
    for (flags, wants) in cases {
        let mut args = vec!["eval", "--model", "nowhere", "--device", "cpu"];
        args.extend(*flags);
        let o = trace_train(dir.path(), &args);
        let e = stderr(&o);
        assert!(!o.status.success(), "{flags:?}: {e}");
        for w in *wants {
            assert!(e.contains(w), "{flags:?}: no {w:?} in {e}");
        }
        assert!(e.contains("hint:"), "{flags:?}: {e}");
    }
}

/// Multi-step episodes (`eval --environment word_steps`): each action is
/// answered by the environment until it says done or the step limit is
/// met, the observation the next user turn; the prediction's score is the
/// return, `success` the environment's, `earlier` the earlier actions with
/// their step rewards; a one-answer task beside them gets one answer.
#[test]
fn multi_step_episodes_run_until_the_environment_is_done() {
    use trace_train::env::{Environment, Task, WordEnv, WordStepsEnv};
    use trace_train::eval::envs::{EnvMetrics, EnvPrediction};
    use trace_train::eval::turns::run_env_episodes;
    let dir = tempfile::tempdir().unwrap();
    trace_train::model::arch::tiny::write_tiny_chat_model(dir.path(), 7).unwrap();
    let tok = ChatTokenizer::from_dir(dir.path()).unwrap();
    let steps = WordStepsEnv::new(&["a", "b", "c"], 3);
    let word = WordEnv::new(&["z"]);
    let tasks: Vec<Task> = (0..3).map(|id| steps.task(id).unwrap()).collect();
    let z = word.task(0).unwrap();
    let mut flat: Vec<(&dyn Environment, &Task)> = tasks
        .iter()
        .map(|t| (&steps as &dyn Environment, t))
        .collect();
    flat.push((&word, &z));
    let firsts: Vec<Vec<u32>> = flat
        .iter()
        .map(|(_, t)| first_turn(&tok, &t.prompt))
        .collect();
    // Task 0 asks a, b, c: all right. Task 1 asks b, c, a: wrong at the
    // second. Task 2 asks c, a, b: all right. The word task: wrong.
    let script: [[&str; 3]; 4] = [
        ["a", "b", "c"],
        ["b", "x", "-"],
        ["c", "a", "b"],
        ["y", "-", "-"],
    ];
    let run = |max_steps: usize| {
        let mut calls: Vec<Vec<(usize, Vec<u32>)>> = Vec::new();
        let preds = run_env_episodes(&flat, &tok, 1, max_steps, "verdict", |prompts| {
            Ok(scripted(&tok, &firsts, prompts, &mut calls, |i, turn| {
                script[i][turn]
            }))
        })
        .unwrap();
        (preds, calls)
    };
    let (preds, calls) = run(20);
    let who: Vec<Vec<usize>> = calls
        .iter()
        .map(|c| c.iter().map(|(i, _)| *i).collect())
        .collect();
    assert_eq!(who, [vec![0, 1, 2, 3], vec![0, 1, 2], vec![0, 2]]);
    // Turn 2's prompt: the first turn as read and written, then the
    // observation as a user turn.
    let (_, p) = &calls[1][0];
    let chat = [
        Message::new(Role::User, tasks[0].prompt.clone()),
        Message::new(Role::Assistant, "a"),
        Message::new(Role::User, "Answer with the word b and nothing else."),
    ];
    assert_eq!(p, &tok.encode_prompt(&chat).unwrap());
    let third = 1.0 / 3.0;
    let got: Vec<(Option<bool>, usize)> = preds.iter().map(|p| (p.success, p.answers())).collect();
    assert_eq!(
        got,
        [
            (Some(true), 3),
            (Some(false), 2),
            (Some(true), 3),
            (None, 1)
        ]
    );
    assert!((preds[0].score.unwrap() - 1.0).abs() < 1e-12);
    assert!((preds[1].score.unwrap() - third).abs() < 1e-12);
    assert_eq!(preds[3].score, Some(0.0));
    assert_eq!(preds[1].earlier[0].completion, "b");
    assert!((preds[1].earlier[0].score - third).abs() < 1e-12);
    assert_eq!(
        preds[1].earlier[0].feedback,
        "Answer with the word c and nothing else."
    );
    let m = EnvMetrics::new("word_steps", &preds[..3], DEFAULT_LEVEL);
    assert_eq!((m.n, m.correct), (3, 2));
    assert_eq!(m.mean_steps, Some(8.0 / 3.0));
    assert!((m.success_rate - 2.0 / 3.0).abs() < 1e-12);
    // At a limit of 2 steps no episode of 3 succeeds: cut, not done.
    let (preds, calls) = run(2);
    assert_eq!(calls.len(), 2);
    let cut: Vec<&EnvPrediction> = preds[..3].iter().collect();
    assert!(
        cut.iter()
            .all(|p| p.success == Some(false) && p.answers() <= 2)
    );
    assert!((cut[0].score.unwrap() - 2.0 * third).abs() < 1e-12);
}
