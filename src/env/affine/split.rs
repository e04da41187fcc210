//! Training and held-out tasks of a sibling environment ([`Split`]): every
//! tenth task id of the environment's own (ids 9, 19, 29, ...) is held out.
//! `generate --environment` and `ppo` see only the others; `eval
//! --environment` sees only these unless told otherwise. Without the split,
//! supervised data written from ids 0..N and an evaluation of ids 0..M
//! asked the model the same SAT formulas and the same ABD and DED rows it
//! had been trained on.
//!
//! The wrapper renumbers: its id `i` is the `i`-th id of its part, so
//! every command keeps counting tasks from 0 (`--tasks`, `--task_offset`,
//! Stage 3's draws). For an environment with any number of tasks (SAT) the
//! mapping is arithmetic; for one over rows (ABD, DED) it is a list of the
//! part's rows. `trace-train task --task_id N` takes [`Part::All`], where
//! ids are the environment's own.

use std::sync::Arc;

use crate::env::{Environment, Episode, Score, Task};

/// Which of a sibling environment's tasks a command sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Every task, under the environment's own ids.
    All,
    /// The nine in ten that are not held out (training).
    Train,
    /// Every tenth (ids 9, 19, ...): evaluation.
    HeldOut,
}

impl Part {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "all" => Self::All,
            "train" => Self::Train,
            "heldout" => Self::HeldOut,
            other => anyhow::bail!("--split {other}: expected heldout, train or all"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Train => "train",
            Self::HeldOut => "heldout",
        }
    }
}

/// Whether the environment's own task `id` is held out.
pub fn held_out(id: u64) -> bool {
    id % 10 == 9
}

/// `inner` seen through `part`.
pub struct Split {
    inner: Arc<dyn Environment>,
    part: Part,
    /// The part's ids in the inner environment, where it has a task count.
    ids: Option<Vec<u64>>,
}

impl Split {
    pub fn new(inner: Arc<dyn Environment>, part: Part) -> Self {
        let ids = match (part, inner.task_count()) {
            (Part::All, _) | (_, None) => None,
            (part, Some(n)) => Some(
                (0..n)
                    .filter(|&id| held_out(id) == (part == Part::HeldOut))
                    .collect(),
            ),
        };
        Self { inner, part, ids }
    }

    /// The inner environment's id of this part's task `id`, or `None`
    /// past the part's last row.
    pub fn inner_id(&self, id: u64) -> Option<u64> {
        if let Some(ids) = &self.ids {
            return usize::try_from(id).ok().and_then(|i| ids.get(i).copied());
        }
        match self.part {
            Part::All => Some(id),
            // Nine of every ten: 0..=8, 10..=18, ...
            Part::Train => id.checked_add(id / 9),
            Part::HeldOut => id.checked_mul(10).and_then(|x| x.checked_add(9)),
        }
    }

    fn with_id(&self, mut task: Task, id: u64) -> Task {
        task.task_id = id;
        task
    }

    /// `task` (one of this part's, under this part's id) under the inner
    /// environment's id, for everything the inner environment looks up by
    /// id when it scores, explains or demonstrates (SAT's formula, ABD's
    /// and DED's row).
    fn inner_task(&self, task: &Task) -> Result<Task, String> {
        let inner = self.inner_id(task.task_id).ok_or_else(|| {
            format!(
                "task {} is past the {} {}'s last task",
                task.task_id,
                self.inner.name(),
                self.part.name()
            )
        })?;
        let mut t = task.clone();
        t.task_id = inner;
        Ok(t)
    }
}

impl Environment for Split {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn task(&self, task_id: u64) -> Result<Task, String> {
        let inner = self.inner_id(task_id).ok_or_else(|| {
            format!(
                "task {task_id} is past the {} {}'s last task",
                self.inner.name(),
                self.part.name()
            )
        })?;
        self.inner.task(inner).map(|t| self.with_id(t, task_id))
    }

    fn tasks(&self, ids: &[u64]) -> Vec<Result<Task, String>> {
        let inner: Vec<Option<u64>> = ids.iter().map(|&id| self.inner_id(id)).collect();
        let known: Vec<u64> = inner.iter().flatten().copied().collect();
        let mut made = self.inner.tasks(&known).into_iter();
        ids.iter()
            .zip(&inner)
            .map(|(&id, i)| match i {
                Some(_) => made
                    .next()
                    .expect("one a known id")
                    .map(|t| self.with_id(t, id)),
                None => self.task(id),
            })
            .collect()
    }

    fn score(&self, task: &Task, completion: &str) -> Score {
        match self.inner_task(task) {
            Ok(t) => self.inner.score(&t, completion),
            Err(why) => Score::Masked(why),
        }
    }

    fn key(&self, task: &Task) -> serde_json::Value {
        match self.inner_task(task) {
            Ok(t) => self.inner.key(&t),
            Err(why) => serde_json::json!({ "error": why }),
        }
    }

    fn demonstration(&self, task: &Task) -> Option<String> {
        self.inner.demonstration(&self.inner_task(task).ok()?)
    }

    fn task_count(&self) -> Option<u64> {
        match &self.ids {
            Some(ids) => Some(ids.len() as u64),
            None => self.inner.task_count(),
        }
    }

    fn feedback(&self, task: &Task, completion: &str, kind: &str) -> Result<String, String> {
        self.inner
            .feedback(&self.inner_task(task)?, completion, kind)
    }

    fn own_id(&self, task_id: u64) -> u64 {
        self.inner_id(task_id).unwrap_or(task_id)
    }

    fn multi_step(&self) -> bool {
        self.inner.multi_step()
    }

    /// The episode of the task under the environment's own id.
    fn start(&self, task: &Task) -> Result<Box<dyn Episode + '_>, String> {
        self.inner.start(&self.inner_task(task)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::affine::sat::SatEnv;

    /// Row-indexed tasks: task `i` says which row it is, and, as ABD and
    /// DED do, scoring and demonstrating look the row up by the task's id.
    struct Rows(u64);

    impl Environment for Rows {
        fn name(&self) -> &'static str {
            "rows"
        }
        fn task(&self, task_id: u64) -> Result<Task, String> {
            if task_id >= self.0 {
                return Err(format!("no row {task_id}"));
            }
            Ok(Task {
                task_id,
                prompt: format!("row {task_id}"),
                expected: task_id.to_string(),
                difficulty: Default::default(),
            })
        }
        fn score(&self, task: &Task, completion: &str) -> Score {
            match self.task(task.task_id) {
                Ok(row) => Score::Reward(f64::from(u8::from(completion == row.expected))),
                Err(why) => Score::Masked(why),
            }
        }
        fn demonstration(&self, task: &Task) -> Option<String> {
            self.task(task.task_id).ok().map(|row| row.expected)
        }
        fn key(&self, task: &Task) -> serde_json::Value {
            serde_json::json!({ "row": task.task_id })
        }
        fn feedback(&self, task: &Task, _: &str, _: &str) -> Result<String, String> {
            Ok(format!("row {} wanted", task.task_id))
        }
        fn task_count(&self) -> Option<u64> {
            Some(self.0)
        }
    }

    #[test]
    fn the_parts_share_no_task_and_cover_every_one() {
        // Rows: 95 rows make 86 training and 9 held-out tasks.
        let rows: Arc<dyn Environment> = Arc::new(Rows(95));
        let (train, held) = (
            Split::new(Arc::clone(&rows), Part::Train),
            Split::new(Arc::clone(&rows), Part::HeldOut),
        );
        assert_eq!((train.task_count(), held.task_count()), (Some(86), Some(9)));
        let seen = |s: &Split| -> Vec<String> {
            let n = s.task_count().unwrap();
            let ids: Vec<u64> = (0..n).collect();
            s.tasks(&ids)
                .into_iter()
                .map(|t| t.unwrap().prompt)
                .collect()
        };
        let (a, b) = (seen(&train), seen(&held));
        assert!(a.iter().all(|p| !b.contains(p)));
        assert_eq!(a.len() + b.len(), 95);
        assert_eq!(b[0], "row 9");
        // Renumbered from 0, scored by the inner rule, nothing past the end.
        let t = held.task(1).unwrap();
        assert_eq!((t.task_id, t.prompt.as_str()), (1, "row 19"));
        assert_eq!(held.score(&t, "19"), Score::Reward(1.0));
        assert_eq!(held.score(&t, "1"), Score::Reward(0.0));
        // Everything the inner environment looks up by id sees its own id
        // (scoring task 1 as row 1 scored every renumbered ABD and DED
        // reply, and checked SAT's answers, against the wrong task).
        for s in [&train, &held] {
            let n = s.task_count().unwrap();
            for t in s.tasks(&(0..n).collect::<Vec<_>>()) {
                let t = t.unwrap();
                let inner = s.inner_id(t.task_id).unwrap();
                let demo = s.demonstration(&t).unwrap();
                assert_eq!(demo, inner.to_string());
                assert_eq!(s.score(&t, &demo), Score::Reward(1.0));
                assert_eq!(s.key(&t), serde_json::json!({ "row": inner }));
                assert_eq!(
                    s.feedback(&t, "", "line").unwrap(),
                    format!("row {inner} wanted")
                );
                assert_eq!(s.own_id(t.task_id), inner);
            }
        }
        assert!(held.task(9).unwrap_err().contains("past the rows heldout"));
        assert!(held.tasks(&[8, 9])[1].is_err());
        // All: the environment's own ids.
        let all = Split::new(rows, Part::All);
        assert_eq!(all.task(9).unwrap().prompt, "row 9");
        assert_eq!(all.task_count(), Some(95));
    }

    #[test]
    fn sat_training_ids_skip_every_tenth_and_held_out_ids_take_them() {
        let sat: Arc<dyn Environment> = Arc::new(SatEnv);
        let train = Split::new(Arc::clone(&sat), Part::Train);
        let held = Split::new(Arc::clone(&sat), Part::HeldOut);
        let inner: Vec<u64> = (0..20).map(|i| train.inner_id(i).unwrap()).collect();
        assert_eq!(&inner[..10], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 10]);
        assert!(inner.iter().all(|&i| !held_out(i)));
        assert!(inner.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(held.inner_id(0), Some(9));
        assert_eq!(held.inner_id(3), Some(39));
        // The same formula as the environment's own id, renumbered.
        let (a, b) = (held.task(3).unwrap(), sat.task(39).unwrap());
        assert_eq!((a.task_id, &a.prompt), (3, &b.prompt));
        // Scored against its own formula: every planted solution passes,
        // through either part (a random full assignment fails about one
        // formula in sixteen, so checking against the renumbered id's
        // formula fails some of these).
        for s in [&train, &held] {
            for t in s.tasks(&(0..60).collect::<Vec<_>>()) {
                let t = t.unwrap();
                let inner = sat.task(s.inner_id(t.task_id).unwrap()).unwrap();
                assert_eq!(s.key(&t), sat.key(&inner));
                let demo = s.demonstration(&t).unwrap();
                assert_eq!(s.score(&t, &demo), Score::Reward(1.0), "task {}", t.task_id);
            }
        }
        assert_eq!(train.task_count(), None);
        assert_eq!(held.inner_id(u64::MAX), None);
    }

    #[test]
    fn the_split_names_parse() {
        for p in [Part::All, Part::Train, Part::HeldOut] {
            assert_eq!(Part::parse(p.name()).unwrap(), p);
        }
        assert!(
            Part::parse("test")
                .unwrap_err()
                .to_string()
                .contains("heldout")
        );
    }

    /// A multi-step environment stays one behind the split: its episodes
    /// start under the environment's own ids.
    #[test]
    fn a_split_multi_step_environment_keeps_its_episodes() {
        let env = Split::new(
            Arc::new(crate::env::WordStepsEnv::new(&["a", "b", "c"], 2)),
            Part::HeldOut,
        );
        assert!(env.multi_step());
        // Held-out task 0 is the environment's own task 9: its words are
        // a (9 mod 3 = 0), then b (10 mod 3 = 1).
        let task = env.task(0).unwrap();
        assert_eq!(task.prompt, "Answer with the word a and nothing else.");
        let mut ep = crate::env::begin(&env, &task).unwrap();
        let s = ep.act("a");
        assert!(!s.done && s.observation.contains("word b"));
        assert!(ep.act("b").success);
    }
}
