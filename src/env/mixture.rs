//! Several environments as one ([`Mixture`]): Stage 3 on `trace+abd+ded`
//! draws each task from one of them, chosen by weight from a hash of the
//! task id, so the choice is a pure function of the id like every other
//! draw (a resume and every rank agree on it). The inner task id is the
//! id itself for an environment that takes any id (Trace wraps it onto its
//! rows, SAT seeds from it) and the id modulo the row count for one that
//! indexes rows without wrapping (ABD, DED).

use std::sync::Arc;

use super::{Environment, Episode, Score, Task};
use crate::rng;

/// Weighted environments behind one [`Environment`].
pub struct Mixture {
    envs: Vec<Arc<dyn Environment>>,
    /// Cumulative weights, normalised to end at 1.
    cumulative: Vec<f64>,
}

impl Mixture {
    /// `envs` with their weights (each > 0).
    pub fn new(envs: Vec<(Arc<dyn Environment>, f64)>) -> anyhow::Result<Self> {
        anyhow::ensure!(!envs.is_empty(), "a mixture needs at least one environment");
        anyhow::ensure!(
            envs.iter().all(|(_, w)| w.is_finite() && *w > 0.0),
            "every environment's weight must be a number above 0"
        );
        for (e, _) in &envs {
            anyhow::ensure!(
                e.task_count() != Some(0),
                "the {} environment has no tasks",
                e.name()
            );
        }
        let total: f64 = envs.iter().map(|(_, w)| w).sum();
        let mut acc = 0.0;
        let cumulative = envs
            .iter()
            .map(|(_, w)| {
                acc += w / total;
                acc
            })
            .collect();
        Ok(Self {
            envs: envs.into_iter().map(|(e, _)| e).collect(),
            cumulative,
        })
    }

    /// The environment of `task_id` and the id it has there.
    pub fn route(&self, task_id: u64) -> (usize, u64) {
        let u = (rng::mix(task_id ^ 0x6d69_7874_7572_6521) >> 11) as f64 / (1u64 << 53) as f64;
        let i = self
            .cumulative
            .iter()
            .position(|&c| u < c)
            .unwrap_or(self.envs.len() - 1);
        let inner = match self.envs[i].task_count() {
            Some(n) => rng::mix(task_id) % n,
            None => task_id,
        };
        (i, inner)
    }

    /// The environment a task of this mixture came from.
    pub fn env_of(&self, task_id: u64) -> &dyn Environment {
        &*self.envs[self.route(task_id).0]
    }

    fn inner(&self, task: &Task) -> (usize, Task) {
        let (i, inner) = self.route(task.task_id);
        let mut t = task.clone();
        t.task_id = inner;
        (i, t)
    }
}

impl Environment for Mixture {
    fn name(&self) -> &'static str {
        "mixture"
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        let (i, inner) = self.route(task_id);
        self.envs[i].task(inner).map(|mut t| {
            t.task_id = task_id;
            t
        })
    }

    /// Each environment makes its share in one call (in parallel where it
    /// pays), in the given order.
    fn tasks(&self, ids: &[u64]) -> Vec<Result<Task, String>> {
        let routes: Vec<(usize, u64)> = ids.iter().map(|&id| self.route(id)).collect();
        let mut made: Vec<Option<Result<Task, String>>> = vec![None; ids.len()];
        for (i, env) in self.envs.iter().enumerate() {
            let mine: Vec<usize> = (0..ids.len()).filter(|&k| routes[k].0 == i).collect();
            if mine.is_empty() {
                continue;
            }
            let inner: Vec<u64> = mine.iter().map(|&k| routes[k].1).collect();
            for (&k, t) in mine.iter().zip(env.tasks(&inner)) {
                made[k] = Some(t.map(|mut t| {
                    t.task_id = ids[k];
                    t
                }));
            }
        }
        made.into_iter()
            .map(|t| t.expect("every id routed"))
            .collect()
    }

    fn score(&self, task: &Task, completion: &str) -> Score {
        let (i, t) = self.inner(task);
        self.envs[i].score(&t, completion)
    }

    fn demonstration(&self, task: &Task) -> Option<String> {
        let (i, t) = self.inner(task);
        self.envs[i].demonstration(&t)
    }

    fn key(&self, task: &Task) -> serde_json::Value {
        let (i, t) = self.inner(task);
        serde_json::json!({ "environment": self.envs[i].name(), "key": self.envs[i].key(&t) })
    }

    fn feedback(&self, task: &Task, completion: &str, kind: &str) -> Result<String, String> {
        let (i, t) = self.inner(task);
        self.envs[i].feedback(&t, completion, kind)
    }

    fn output_lines_at_least(&self, task_id: u64) -> Option<u32> {
        let (i, inner) = self.route(task_id);
        self.envs[i].output_lines_at_least(inner)
    }

    fn multi_step(&self) -> bool {
        self.envs.iter().any(|e| e.multi_step())
    }

    /// The episode of the task's own environment (one answer where that
    /// is a one-answer environment).
    fn start(&self, task: &Task) -> Result<Box<dyn Episode + '_>, String> {
        let (i, t) = self.inner(task);
        super::begin(&*self.envs[i], &t)
    }

    fn parts(&self) -> Vec<&'static str> {
        self.envs.iter().map(|e| e.name()).collect()
    }

    fn part_of(&self, task_id: u64) -> Option<usize> {
        Some(self.route(task_id).0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::WordEnv;
    use crate::env::affine::sat::SatEnv;

    #[test]
    fn routes_by_weight_and_scores_with_the_right_environment() {
        let m = Mixture::new(vec![
            (
                Arc::new(WordEnv::new(&["a", "b"])) as Arc<dyn Environment>,
                3.0,
            ),
            (Arc::new(SatEnv), 1.0),
        ])
        .unwrap();
        let ids: Vec<u64> = (0..4000).collect();
        let words = ids.iter().filter(|&&id| m.route(id).0 == 0).count();
        assert!(
            (2800..3200).contains(&words),
            "{words} of 4000 at weight 3:1"
        );
        let tasks = m.tasks(&ids[..50]);
        for (id, t) in ids[..50].iter().zip(tasks) {
            let t = t.unwrap();
            assert_eq!(t.task_id, *id);
            assert_eq!(m.task(*id).unwrap(), t);
            let right = m.score(&t, &t.expected);
            assert_eq!(
                right,
                Score::Reward(1.0),
                "{} task {id}",
                m.env_of(*id).name()
            );
            assert_eq!(m.score(&t, "zz"), Score::Reward(0.0));
        }
        // Feedback comes from the environment a task routes to, on its own
        // task: SAT names the unsatisfied clauses of the inner formula.
        for id in 0..20 {
            let t = m.task(id).unwrap();
            let (i, inner) = m.route(id);
            let said = m.feedback(&t, "x1=True", "line").unwrap();
            let own = if i == 1 {
                SatEnv.feedback(&SatEnv.task(inner).unwrap(), "x1=True", "line")
            } else {
                WordEnv::new(&["a", "b"]).feedback(&t, "x1=True", "line")
            };
            assert_eq!(said, own.unwrap(), "task {id}");
            assert_eq!(said.contains("clauses unsatisfied"), i == 1, "task {id}");
        }
        assert_eq!(m.parts(), ["word", "sat"]);
        for id in 0..100 {
            assert_eq!(m.part_of(id), Some(m.route(id).0));
        }
        assert!(Mixture::new(vec![]).is_err());
        assert!(Mixture::new(vec![(Arc::new(SatEnv) as Arc<dyn Environment>, 0.0)]).is_err());
    }
}
