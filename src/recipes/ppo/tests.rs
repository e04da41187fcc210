//! Micro-batching of Stage 3's passes on the tiny chat model (f32, CPU):
//! the update's gradients, the sums it reports and the old/reference
//! log-probs and values are those of one pass over the whole minibatch,
//! whatever the token budget, with or without gradient checkpointing, on one
//! rank or several.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::phases::*;
use super::*;
use crate::config::{ModelConfig, RlConfig};
use crate::dist::inprocess::run_ranks;
use crate::model::decode::generate::Generation;
use crate::model::layers::init::Rng;
use crate::rl::loss::completion_weights;
use crate::rl::memory::{self, micro_batches};

/// The tiny chat model with a policy for `algorithm` and `aggregation`;
/// the LoRA `B` factors and the value head's output weights made non-zero
/// (fresh, they are zero: `A`'s gradient and the value head's first layer
/// would get none, and the reference would equal the policy), the same
/// for every call with the same arguments.
fn policy(dir: &Path, algorithm: &str, aggregation: &str) -> Policy {
    let base = dir.join("base");
    if !base.exists() {
        crate::model::arch::tiny::write_tiny_chat_model(&base, 7).unwrap();
    }
    let grpo = algorithm == "grpo";
    let cfg = RlConfig {
        algorithm: algorithm.into(),
        group_size: Some(if grpo { 3 } else { 1 }),
        loss_aggregation: aggregation.into(),
        kl_coef: Some(if grpo { 0.2 } else { 0.05 }),
        entropy_coef: 0.01,
        max_new_tokens: 16,
        mini_batch_size: 9,
        ppo_epochs: 2,
        value_learning_rate: 1e-3,
        optim: crate::config::OptimSettings {
            learning_rate: 1e-3,
            ..RlConfig::default().optim
        },
        lora: crate::config::LoraSettings {
            r: 4,
            alpha: 8.0,
            ..RlConfig::default().lora
        },
        ..RlConfig::default()
    };
    let p = Policy::load(&base, &cfg, &ModelConfig::default(), &Device::Cpu).unwrap();
    assert!(!p.gradient_checkpointing(), "off on the CPU by default");
    assert_eq!(p.micro_batch_tokens(), memory::CPU_TOKENS);
    let randomise = |name: &str, var: &candle_core::Var, scale: f32| {
        let shape = var.as_tensor().shape().clone();
        let v = Rng::for_tensor(3, name).uniform(shape.elem_count(), -scale, scale);
        var.set(&Tensor::from_vec(v, shape, &Device::Cpu).unwrap())
            .unwrap();
    };
    for (name, var) in p.opt.vars() {
        if name.contains("lora_B") {
            randomise(name, var, 0.2);
        }
    }
    if let Some(v) = &p.value {
        for (name, var) in v.named_vars() {
            if name.ends_with("w2") || name.ends_with("b2") {
                randomise(&name, &var, 0.5);
            }
        }
    }
    p
}

/// Fake completions of varying prompt and response lengths (some ended by
/// the stop token), in groups of `group`, with rewards that vary within
/// each group.
fn samples(p: &Policy, n: usize, group: usize) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let prompt_len = 3 + (i * 7) % 23;
            let response_len = 1 + (i * 5) % 13;
            let prompt: Vec<u32> = (0..prompt_len)
                .map(|j| ((i * 31 + j * 17 + 5) % 256) as u32)
                .collect();
            let mut response: Vec<u32> = (0..response_len)
                .map(|j| ((i * 13 + j * 29 + 11) % 256) as u32)
                .collect();
            let stopped = i % 2 == 0;
            if stopped {
                *response.last_mut().unwrap() = p.stop_id();
            }
            Sample {
                group: i / group,
                prompt,
                response,
                stopped,
                reward: ((i * 7) % 5) as f64 / 4.0,
                bucket: None,
                episode: None,
                step_reward: None,
                sampler_logp: Vec::new(),
                trained: Vec::new(),
                actions: Vec::new(),
                old_logp: Vec::new(),
                ref_logp: Vec::new(),
                old_values: Vec::new(),
                advantages: Vec::new(),
                returns: Vec::new(),
            }
        })
        .collect()
}

/// Old log-probs, values, reference and advantages in one pass; then the
/// old log-probs moved off the policy's (as after an earlier minibatch) so
/// that ratios differ from 1 and some are clipped.
fn scored(p: &mut Policy, n: usize) -> Vec<Sample> {
    let mut s = samples(p, n, p.cfg.group_size());
    p.micro_tokens = usize::MAX;
    p.score_old(&mut s).unwrap();
    p.advantages(&mut s);
    for (i, smp) in s.iter_mut().enumerate() {
        for (j, lp) in smp.old_logp.iter_mut().enumerate() {
            *lp += 0.35 * ((i * 3 + j) as f64).sin();
        }
    }
    s
}

/// `max |a - b| / max |a|` of two gradients, and `max |a|`.
fn relative(a: &Tensor, b: &Tensor) -> (f64, f64) {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let scale = a.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs()));
    (diff / scale.max(1e-30), scale)
}

fn assert_same(what: &str, one: &(Vec<Tensor>, [f64; 7]), other: &(Vec<Tensor>, [f64; 7])) {
    assert_eq!(one.0.len(), other.0.len());
    for (k, (a, b)) in one.0.iter().zip(&other.0).enumerate() {
        let (rel, scale) = relative(a, b);
        assert!(
            scale > 0.0,
            "{what}: gradient {k} is zero; nothing compared"
        );
        assert!(
            rel <= 1e-5,
            "{what}: gradient {k} differs by {rel:e} relative"
        );
    }
    // The losses are sums of per-token terms of order 1 whose weights add
    // up to at most 1, of either sign (advantages): compared to 1e-5 of
    // that scale (or of the sum, when larger). The counts are exact.
    for (k, (&x, &y)) in one.1.iter().zip(&other.1).enumerate().take(5) {
        assert!(
            (x - y).abs() <= 1e-5 * x.abs().max(1.0),
            "{what}: sum {k}: {x} vs {y}"
        );
    }
    assert_eq!(one.1[5..], other.1[5..], "{what}: clipped and tokens");
}

#[test]
fn a_micro_batched_minibatch_has_the_one_pass_gradients() {
    let dir = tempfile::tempdir().unwrap();
    for (algorithm, aggregation) in [
        ("ppo", "token_mean"),
        ("grpo", "seq_mean"),
        ("grpo", "dr_grpo"),
    ] {
        let what = format!("{algorithm} {aggregation}");
        let mut p = policy(dir.path(), algorithm, aggregation);
        let s = scored(&mut p, 12);
        let mb: Vec<&Sample> = s.iter().collect();
        let lens: Vec<usize> = s.iter().map(|x| x.response.len()).collect();
        let w = completion_weights(p.agg, &lens);
        let dev = Device::Cpu;

        p.micro_tokens = usize::MAX;
        let one = p.member_gradients(&mb, &w, &dev).unwrap();
        // The sums are the one pass's terms: tokens, and some clipped.
        assert_eq!(one.1[6], lens.iter().sum::<usize>() as f64, "{what}");
        assert!(one.1[5] > 0.0 && one.1[5] < one.1[6], "{what}: {:?}", one.1);
        assert!(one.1[1] > 0.0, "{what}: entropy {:?}", one.1);
        if algorithm == "grpo" {
            assert!(one.1[2].abs() > 1e-6, "{what}: no KL term {:?}", one.1);
        } else {
            assert!(one.1[3] > 0.0, "{what}: no value loss {:?}", one.1);
        }

        // A budget that splits the minibatch into several micro-batches.
        let seq: Vec<usize> = s
            .iter()
            .map(|x| x.prompt.len() + x.response.len())
            .collect();
        let budget = seq.iter().sum::<usize>() / 4;
        let parts = micro_batches(&seq, budget);
        assert!(parts.len() >= 3, "{what}: {} micro-batches", parts.len());
        p.micro_tokens = budget;
        let micro = p.member_gradients(&mb, &w, &dev).unwrap();
        assert_same(&format!("{what}, budget {budget}"), &one, &micro);
        // Each row alone.
        p.micro_tokens = 1;
        let alone = p.member_gradients(&mb, &w, &dev).unwrap();
        assert_same(&format!("{what}, one row each"), &one, &alone);
        // Checkpointing gives the same gradients.
        p.loaded.model.set_gradient_checkpointing(true);
        p.micro_tokens = budget;
        let ckpt = p.member_gradients(&mb, &w, &dev).unwrap();
        assert_same(&format!("{what}, checkpointing"), &one, &ckpt);
        p.loaded.model.set_gradient_checkpointing(false);

        // What the comparison catches: weights renormalised over each
        // micro-batch are far from the one pass.
        let mut wrong: Option<Vec<Tensor>> = None;
        for part in &parts {
            let members: Vec<&Sample> = part.iter().map(|&i| mb[i]).collect();
            let part_lens: Vec<usize> = part.iter().map(|&i| lens[i]).collect();
            let (g, _) = p
                .micro_gradients(&members, &completion_weights(p.agg, &part_lens), &dev)
                .unwrap();
            wrong = Some(match wrong {
                None => g,
                Some(acc) => acc.iter().zip(&g).map(|(a, b)| (a + b).unwrap()).collect(),
            });
        }
        let worst = one
            .0
            .iter()
            .zip(&wrong.unwrap())
            .map(|(a, b)| relative(a, b).0)
            .fold(0f64, f64::max);
        assert!(worst > 1e-2, "{what}: renormalised weights pass: {worst:e}");
    }
}

#[test]
fn score_old_in_micro_batches_matches_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    for algorithm in ["ppo", "grpo"] {
        let mut p = policy(dir.path(), algorithm, "token_mean");
        let group = p.cfg.group_size();
        let mut one = samples(&p, 12, group);
        p.micro_tokens = usize::MAX;
        p.score_old(&mut one).unwrap();
        for budget in [1, 40, 100] {
            let mut micro = samples(&p, 12, group);
            p.micro_tokens = budget;
            p.score_old(&mut micro).unwrap();
            for (a, b) in one.iter().zip(&micro) {
                for (x, y, what) in [
                    (&a.old_logp, &b.old_logp, "old log-probs"),
                    (&a.ref_logp, &b.ref_logp, "reference log-probs"),
                    (&a.old_values, &b.old_values, "values"),
                ] {
                    assert_eq!(x.len(), a.response.len());
                    for (u, v) in x.iter().zip(y) {
                        assert!(
                            (u - v).abs() <= 1e-5 * u.abs().max(1.0),
                            "{algorithm}, budget {budget}, {what}: {u} vs {v}"
                        );
                    }
                }
            }
        }
        // Not vacuous: the adapter moved the policy off the reference, and
        // PPO's values are not all equal.
        let gap = one
            .iter()
            .flat_map(|s| s.old_logp.iter().zip(&s.ref_logp))
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(gap > 1e-3, "{algorithm}: {gap}");
        if algorithm == "ppo" {
            let v: Vec<f64> = one.iter().flat_map(|s| s.old_values.clone()).collect();
            assert!(v.iter().any(|&x| (x - v[0]).abs() > 1e-4), "{v:?}");
        }
    }
}

/// The trainable tensors after `update_with` on `world` in-process ranks
/// (each holding every `world`-th sample) at a token budget, and the
/// update's stats.
fn trained(
    dir: &Path,
    algorithm: &str,
    world: usize,
    budget: usize,
) -> (BTreeMap<String, Vec<f32>>, UpdateStats) {
    let out = run_ranks(world, |comm| {
        let mut p = policy(dir, algorithm, "token_mean");
        let all = scored(&mut p, 12);
        // Whole groups a rank (GRPO's advantages need them; PPO's groups
        // are single samples).
        let group = p.cfg.group_size();
        let mine: Vec<usize> = (0..all.len())
            .filter(|&i| (i / group) % world == comm.rank())
            .collect();
        let layout = Layout {
            lens: all.iter().map(|s| s.response.len()).collect(),
            mine: mine.clone(),
        };
        let share: Vec<Sample> = mine.iter().map(|&i| all[i].clone()).collect();
        p.micro_tokens = budget;
        let st = p.update_with(&share, &layout, 0, 1e-3, &comm)?;
        let params = p
            .params()
            .into_iter()
            .map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
            .collect();
        Ok((params, st))
    })
    .unwrap();
    out.into_iter().next().unwrap()
}

#[test]
fn updates_with_micro_batches_on_one_or_two_ranks_match_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    for algorithm in ["ppo", "grpo"] {
        let (one, st) = trained(dir.path(), algorithm, 1, usize::MAX);
        // Two epochs of minibatches of 9 out of 12: 4 optimizer steps.
        assert_eq!((st.minibatches, st.skipped_minibatches), (4, 0));
        let start = {
            let p = policy(dir.path(), algorithm, "token_mean");
            p.params()
        };
        let moved = one
            .iter()
            .map(|(k, v)| {
                let s = start[k].flatten_all().unwrap().to_vec1::<f32>().unwrap();
                v.iter()
                    .zip(&s)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
            })
            .fold(0f32, f32::max);
        assert!(moved > 1e-4, "{algorithm}: the update moved nothing");
        for (world, budget) in [(1, 30), (2, 30), (2, usize::MAX)] {
            let (other, ost) = trained(dir.path(), algorithm, world, budget);
            for (k, a) in &one {
                let b = &other[k];
                let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                // Four AdamW steps of 1e-3 each: AdamW divides each
                // gradient by its own running scale, so the rounding of a
                // near-zero gradient can move a weight by a small share of
                // a step (two ranks in one pass differ as much); 1% of a
                // step bounds it.
                assert!(
                    diff <= 1e-5,
                    "{algorithm}, {world} ranks, budget {budget}: `{k}` differs by {diff:e}"
                );
            }
            for (x, y, what) in [
                (st.policy_loss, ost.policy_loss, "policy loss"),
                (st.grad_norm, ost.grad_norm, "grad norm"),
                (st.value_loss, ost.value_loss, "value loss"),
                (st.entropy, ost.entropy, "entropy"),
                (st.kl_loss, ost.kl_loss, "kl loss"),
                (st.clip_fraction, ost.clip_fraction, "clip fraction"),
            ] {
                assert!(
                    (x - y).abs() <= 1e-5 * x.abs().max(1e-3),
                    "{algorithm}, {world} ranks, budget {budget}, {what}: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn gradient_checkpointing_follows_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    crate::model::arch::tiny::write_tiny_chat_model(&base, 7).unwrap();
    for (setting, want) in [(None, false), (Some(true), true), (Some(false), false)] {
        let cfg = RlConfig {
            gradient_checkpointing: setting,
            micro_batch_tokens: Some(333),
            ..RlConfig::default()
        };
        let p = Policy::load(&base, &cfg, &ModelConfig::default(), &Device::Cpu).unwrap();
        assert_eq!(p.gradient_checkpointing(), want, "{setting:?}");
        assert_eq!(p.micro_batch_tokens(), 333);
    }
    // 0 is auto: the CPU's default.
    let cfg = RlConfig {
        micro_batch_tokens: Some(0),
        ..RlConfig::default()
    };
    let p = Policy::load(&base, &cfg, &ModelConfig::default(), &Device::Cpu).unwrap();
    assert_eq!(p.micro_batch_tokens(), memory::CPU_TOKENS);
}

#[test]
fn a_resume_ignores_the_memory_settings() {
    let a = RlConfig::default();
    let b = RlConfig {
        micro_batch_tokens: Some(1000),
        gradient_checkpointing: Some(true),
        ..RlConfig::default()
    };
    assert_eq!(fingerprinted(&a).unwrap(), fingerprinted(&b).unwrap());
    let c = RlConfig {
        mini_batch_size: 3,
        ..RlConfig::default()
    };
    assert_ne!(fingerprinted(&a).unwrap(), fingerprinted(&c).unwrap());
    assert!(
        fingerprinted(&a)
            .unwrap()
            .get("micro_batch_tokens")
            .is_none()
    );
}

#[test]
fn settings_added_later_are_fingerprinted_only_when_changed() {
    let plain = fingerprinted(&RlConfig::default()).unwrap();
    for k in ["abd_dataset", "ded_dataset", "temperature_schedule"] {
        assert!(
            plain.get(k).is_none(),
            "{k} at its default is fingerprinted"
        );
    }
    let mut c = RlConfig::default();
    c.temperature_schedule.enabled = true;
    c.ded_dataset = "rows.jsonl".into();
    let changed = fingerprinted(&c).unwrap();
    assert_eq!(changed["temperature_schedule"]["enabled"], true);
    assert_eq!(changed["ded_dataset"], "rows.jsonl");
    assert!(changed.get("abd_dataset").is_none());
}

/// GRPO's advantages in multi-turn runs are taken over episodes: a group's
/// answers that share an episode count once and take its advantage.
#[test]
fn grpo_advantages_are_an_episodes_and_its_answers_share_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy(dir.path(), "grpo", "token_mean");
    let answer = |episode: Option<usize>, reward: f64| {
        let g = Generation {
            tokens: vec![5, 6],
            logprobs: vec![-1.0, -1.0],
            stopped: true,
            stop_logprob: Some(-0.5),
        };
        let mut s = Sample::new(0, vec![1, 2, 3], &g, 9, reward);
        s.episode = episode;
        s
    };
    // Episode 0: wrong, then right (reward 1 on both answers); episode 1:
    // wrong twice; episode 2: right at once.
    let mut samples = vec![
        answer(Some(0), 1.0),
        answer(Some(0), 1.0),
        answer(Some(1), 0.0),
        answer(Some(1), 0.0),
        answer(Some(2), 1.0),
    ];
    p.advantages_with(&mut samples, &Single).unwrap();
    let want = p
        .cfg
        .rl_algorithm()
        .group_advantages(&[1.0, 0.0, 1.0], p.cfg.scale_rewards);
    let got: Vec<f64> = samples.iter().map(|s| s.advantages[0]).collect();
    let expect = [want[0], want[0], want[1], want[1], want[2]];
    for (g, w) in got.iter().zip(expect) {
        assert!((g - w).abs() < 1e-12, "{got:?} against {expect:?}");
    }
    // Counted by answers instead, episode 0 would weigh twice.
    let by_answer = p
        .cfg
        .rl_algorithm()
        .group_advantages(&[1.0, 1.0, 0.0, 0.0, 1.0], p.cfg.scale_rewards);
    assert!((by_answer[0] - want[0]).abs() > 1e-3);
}

/// A stopped answer's sampler log-probs cover its stop token, which the
/// trainer scores too, so TIS weighs every token of it; an answer cut at
/// the length limit has one log-prob a token.
#[test]
fn a_stopped_answers_sampler_logprobs_cover_the_stop_token() {
    let g = Generation {
        tokens: vec![5, 6],
        logprobs: vec![-1.0, -2.0],
        stopped: true,
        stop_logprob: Some(-0.5),
    };
    let s = Sample::new(0, vec![1], &g, 9, 1.0);
    assert_eq!(s.response, vec![5, 6, 9]);
    assert_eq!(s.sampler_logp, vec![-1.0, -2.0, -0.5]);
    let cut = Generation {
        stopped: false,
        stop_logprob: None,
        ..g
    };
    let s = Sample::new(0, vec![1], &cut, 9, 1.0);
    assert_eq!((s.response.len(), s.sampler_logp.len()), (2, 2));
}

/// TIS (`tis_cap`): with the sampler's log-probs equal to the old pass's,
/// every weight is 1 and the gradients are those without TIS; with the
/// sampler 0.3 nats below, the policy-gradient term scales by e^0.3, and
/// 1 nat below by the cap, 2; the entropy and value terms stay as they are.
#[test]
fn tis_weighs_the_policy_term_by_the_truncated_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = policy(dir.path(), "ppo", "token_mean");
    let mut s = scored(&mut p, 8);
    let lens: Vec<usize> = s.iter().map(|x| x.response.len()).collect();
    let w = completion_weights(p.agg, &lens);
    let dev = Device::Cpu;
    p.micro_tokens = usize::MAX;
    let off = {
        let mb: Vec<&Sample> = s.iter().collect();
        p.member_gradients(&mb, &w, &dev).unwrap()
    };
    p.cfg.tis_cap = 2.0;
    let mut with_shift = |shift: f64| {
        for smp in &mut s {
            smp.sampler_logp = smp.old_logp.iter().map(|&x| (x - shift) as f32).collect();
        }
        let mb: Vec<&Sample> = s.iter().collect();
        p.member_gradients(&mb, &w, &dev).unwrap()
    };
    assert_same("TIS at ratio 1", &off, &with_shift(0.0));
    for (shift, factor) in [(0.3, 0.3f64.exp()), (1.0, 2.0)] {
        let g = with_shift(shift);
        assert!(
            (g.1[0] / off.1[0] - factor).abs() < 1e-4,
            "shift {shift}: policy loss {} against {}",
            g.1[0],
            off.1[0]
        );
        for k in [1, 3] {
            assert!((g.1[k] - off.1[k]).abs() < 1e-6, "shift {shift}: term {k}");
        }
    }
}

/// PPO over a multi-step episode: each action's step reward (less its KL
/// penalty) and the value at its last token make one step of GAE, and
/// every token of the action takes that step's advantage and return.
#[test]
fn ppo_advantages_run_over_an_episodes_steps() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = policy(dir.path(), "ppo", "token_mean");
    p.cfg.gamma = 0.9;
    p.cfg.lam = 0.8;
    p.cfg.whiten_advantages = false;
    p.cfg.kl_coef = Some(0.0);
    let action = |episode: usize, step_reward: f64, values: &[f64]| {
        let g = Generation {
            tokens: vec![5; values.len() - 1],
            logprobs: Vec::new(),
            stopped: true,
            stop_logprob: None,
        };
        let mut s = Sample::new(0, vec![1, 2], &g, 9, 0.0);
        s.episode = Some(episode);
        s.step_reward = Some(step_reward);
        s.old_values = values.to_vec();
        s.old_logp = vec![-1.0; values.len()];
        s.ref_logp = vec![-1.0; values.len()];
        s
    };
    // Episode 7: three actions, rewards 0, 0.2, 1; values at their last
    // tokens 0.5, 0.6, 0.7 (the earlier tokens' values play no part).
    // delta2 = 1 - 0.7 = 0.3; delta1 = 0.2 + 0.9*0.7 - 0.6 = 0.23;
    // delta0 = 0 + 0.9*0.6 - 0.5 = 0.04.
    // A2 = 0.3; A1 = 0.23 + 0.72*0.3 = 0.446; A0 = 0.04 + 0.72*0.446 = 0.36112.
    // Episode 8, one action: A = 0.5 - 0.1 = 0.4.
    let mut samples = vec![
        action(7, 0.0, &[9.0, 0.5]),
        action(8, 0.5, &[3.0, 3.0, 0.1]),
        action(7, 0.2, &[0.6]),
        action(7, 1.0, &[-4.0, 0.7]),
    ];
    p.advantages_with(&mut samples, &Single).unwrap();
    let want = [(0.36112, 0.86112), (0.4, 0.5), (0.446, 1.046), (0.3, 1.0)];
    for (s, (a, r)) in samples.iter().zip(want) {
        assert_eq!(s.advantages.len(), s.response.len());
        for (&x, &y) in s.advantages.iter().zip(&s.returns) {
            assert!(
                (x - a).abs() < 1e-9 && (y - r).abs() < 1e-9,
                "{:?} {:?} against {a} {r}",
                s.advantages,
                s.returns
            );
        }
    }
    // A KL penalty in the reward is paid a step, summed over its tokens:
    // episode 8's action with k1 = 0.5 on each of its 3 tokens at 0.1.
    p.cfg.kl_coef = Some(0.1);
    let mut one = vec![action(8, 0.5, &[3.0, 3.0, 0.1])];
    one[0].ref_logp = vec![-1.5; 3];
    p.advantages_with(&mut one, &Single).unwrap();
    assert!(
        (one[0].advantages[0] - (0.5 - 0.15 - 0.1)).abs() < 1e-9,
        "{:?}",
        one[0].advantages
    );
}

/// An episode trained as one sequence (`episode_sequences`) gives its
/// actions the log-probs, values and advantages and, over a minibatch
/// holding every action, the gradients of the actions trained one
/// sequence each: the observations between them condition the actions and
/// train nothing. GRPO (episode advantages) and PPO (GAE over the steps,
/// values at each action's last token, a KL penalty a step, whitening).
#[test]
fn an_episode_as_one_sequence_trains_as_its_actions_do() {
    for algorithm in ["grpo", "ppo"] {
        one_sequence_trains_as_actions(algorithm);
    }
}

fn one_sequence_trains_as_actions(algorithm: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut p = policy(dir.path(), algorithm, "token_mean");
    if algorithm == "ppo" {
        p.cfg.kl_coef = Some(0.05);
        p.cfg.gamma = 0.9;
        p.cfg.lam = 0.8;
    }
    p.micro_tokens = usize::MAX;
    let stop = p.stop_id();
    let toks = |seed: usize, n: usize| -> Vec<u32> {
        (0..n)
            .map(|j| ((seed * 37 + j * 11 + 3) % 250) as u32)
            .collect()
    };
    // Two episodes of three actions (one group), the prompts chaining as
    // `next_turn` makes them: prompt, answer, observation, answer, ...
    let episode = |e: usize, reward: f64| -> Vec<Sample> {
        let mut prompt = toks(e, 9);
        let mut out = Vec::new();
        for k in 0..3 {
            let mut response = toks(e * 10 + k, 4 + k);
            response.push(stop);
            let mut s = samples(&p, 1, 1).remove(0);
            s.group = 0;
            s.episode = Some(e);
            s.reward = reward;
            s.step_reward = Some(reward * (k + 1) as f64 / 6.0);
            s.prompt = prompt.clone();
            s.response = response.clone();
            s.stopped = true;
            out.push(s);
            prompt.extend(&response);
            prompt.extend(toks(e * 100 + k, 5));
        }
        out
    };
    let apart: Vec<Sample> = [episode(1, 1.0), episode(2, 0.2)].concat();
    let mut one: Vec<Sample> = [episode(1, 1.0), episode(2, 0.2)]
        .into_iter()
        .map(|e| Sample::episode(e).unwrap())
        .collect();
    assert_eq!(one[0].trained_len(), 4 + 5 + 6 + 3);
    assert_eq!(one[0].response.len(), one[0].trained_len() + 2 * 5);
    let spans: Vec<(usize, usize)> = one[0].actions.iter().map(|a| (a.start, a.end)).collect();
    assert_eq!(spans, vec![(0, 5), (10, 16), (21, 28)]);
    let mut apart = apart;
    p.score_old(&mut apart).unwrap();
    p.score_old(&mut one).unwrap();
    p.advantages(&mut apart);
    p.advantages(&mut one);
    // The actions' old and reference log-probs and advantages agree.
    for (e, merged) in one.iter().enumerate() {
        let actions = &apart[e * 3..e * 3 + 3];
        let pick = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .enumerate()
                .filter(|(i, _)| merged.trains(*i))
                .map(|(_, &x)| x)
                .collect()
        };
        let cat = |f: &dyn Fn(&Sample) -> &Vec<f64>| -> Vec<f64> {
            actions.iter().flat_map(|s| f(s).clone()).collect()
        };
        for (a, b) in pick(&merged.old_logp).iter().zip(cat(&|s| &s.old_logp)) {
            assert!((a - b).abs() < 1e-4, "old log-prob {a} against {b}");
        }
        for (a, b) in pick(&merged.ref_logp).iter().zip(cat(&|s| &s.ref_logp)) {
            assert!((a - b).abs() < 1e-4, "reference log-prob {a} against {b}");
        }
        for (a, b) in pick(&merged.old_values).iter().zip(cat(&|s| &s.old_values)) {
            assert!((a - b).abs() < 1e-4, "value {a} against {b}");
        }
        for (what, a, b) in [
            (
                "advantage",
                pick(&merged.advantages),
                cat(&|s| &s.advantages),
            ),
            ("return", pick(&merged.returns), cat(&|s| &s.returns)),
        ] {
            assert_eq!(a.len(), b.len());
            for (a, b) in a.iter().zip(&b) {
                assert!((a - b).abs() < 1e-3, "{algorithm}: {what} {a} against {b}");
            }
        }
        // The observations' tokens take nothing.
        for (i, &a) in merged.advantages.iter().enumerate() {
            assert!(merged.trains(i) || a == 0.0, "observation token {i}: {a}");
        }
    }
    // The advantages are not all one value (GAE over steps of different
    // rewards), so the comparison above can fail.
    let all: Vec<f64> = apart.iter().flat_map(|s| s.advantages.clone()).collect();
    assert!(all.iter().any(|&a| (a - all[0]).abs() > 1e-3), "{all:?}");
    // Off the policy a little, as after an earlier minibatch, so that
    // ratios differ from 1: the same shift for the same action tokens.
    let shift = |e: usize, j: usize| 0.3 * ((e * 7 + j) as f64).sin();
    for (i, s) in apart.iter_mut().enumerate() {
        let before: usize = apart_offsets(i);
        for (j, lp) in s.old_logp.iter_mut().enumerate() {
            *lp += shift(i / 3, before + j);
        }
    }
    for (e, s) in one.iter_mut().enumerate() {
        let mut j = 0;
        for i in 0..s.old_logp.len() {
            if s.trains(i) {
                s.old_logp[i] += shift(e, j);
                j += 1;
            }
        }
    }
    let dev = Device::Cpu;
    let grads = |p: &Policy, s: &[Sample]| {
        let lens: Vec<usize> = s.iter().map(Sample::trained_len).collect();
        let w = completion_weights(p.agg, &lens);
        let refs: Vec<&Sample> = s.iter().collect();
        p.member_gradients(&refs, &w, &dev).unwrap()
    };
    let (ga, sa) = grads(&p, &apart);
    let (go, so) = grads(&p, &one);
    for (a, b) in ga.iter().zip(&go) {
        let (rel, scale) = relative(a, b);
        assert!(
            scale > 0.0 && rel < 1e-3,
            "gradient off by {rel} of {scale}"
        );
    }
    // Policy loss, entropy, KL, the value loss and the total agree.
    for k in [0, 1, 2, 3, 4] {
        assert!(
            (sa[k] - so[k]).abs() < 1e-4 * sa[k].abs().max(1.0),
            "sum {k}: {} against {}",
            sa[k],
            so[k]
        );
    }
}

/// Tokens of the earlier actions of action `i`'s episode (three actions
/// of 4, 5 and 6 tokens with the stop token).
fn apart_offsets(i: usize) -> usize {
    [0, 5, 11][i % 3]
}

#[test]
fn an_episode_whose_prompts_do_not_chain_stays_apart() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy(dir.path(), "grpo", "token_mean");
    let mut steps = samples(&p, 2, 2);
    steps[1].prompt = vec![1, 2, 3];
    let back = Sample::episode(steps.clone()).unwrap_err();
    assert_eq!(back.len(), 2);
    assert_eq!(back[1].prompt, vec![1, 2, 3]);
    assert!(Sample::episode(Vec::new()).is_err());
}
