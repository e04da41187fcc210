//! Preference pairs from scored rollouts: for each prompt, a correct answer
//! over an incorrect one (iterative RPO's rule, Pang et al. 2024), and
//! optionally, among correct answers, the better over the worse by a stated
//! criterion (shorter, or fewer lines). Pairs whose texts are identical, or
//! closer than a minimum edit distance, teach nothing or push the shared
//! tokens down (Smaug/DPOP, Pal et al. 2024), and are dropped; ties under a
//! criterion are dropped; at most `max_pairs_per_prompt` are kept a prompt,
//! chosen by a seeded hash so a re-run keeps the same ones, those with the
//! prompt's greedy answer (`rollouts --greedy`) first. Every prompt
//! that gave no pair is counted under why.
//!
//! With `same_lines`, a pair of a right answer over a wrong one is kept only
//! where both have the same number of lines, so that the pair's difference is
//! in what the lines say and not in how many there are: on prompts whose
//! answers are one line, a wrong answer is mostly a longer one, and pairs
//! that differ in length teach the model to stop early everywhere.
//!
//! With `demonstrations`, a prompt none of whose answers is right pairs the
//! environment's own right answer (the rollouts' `demonstration`) over each
//! wrong one, as SPIN pairs the data's answer over the model's (Chen et al.
//! 2024): a weak model whose answers are mostly wrong otherwise leaves most
//! prompts without a pair.
//!
//! With `first_error`, each wrong answer also gives a pair at the line where
//! it first leaves the expected output, as Step-DPO pairs a right step over a
//! wrong one after a shared right prefix (Lai et al. 2024): both sides are
//! the answer's own text up to that line, then the expected line (chosen)
//! against the answer's line (rejected). Where the answer stopped too soon,
//! the rejected side is the answer as it ended and the chosen one goes on
//! with the missing line; where it went on past the output's end, the chosen
//! side ends there and the rejected one goes on with the extra line. A side
//! that goes on is *open*: it is trained without the end-of-turn token, so
//! the pair teaches the line and not a length. Such pairs need the expected
//! output, which every rollout has, and not a right sample, which most
//! prompts of a weak model lack.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::rollout::Rollout;
use crate::reward::{extract_answer, first_different_line, python_strip};

/// How to rank correct answers against each other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Criterion {
    /// Fewer completion tokens is better.
    Shorter,
    /// Fewer lines in the completion text is better.
    FewerLines,
    /// A higher score of this name is better: one of the line's `scores`
    /// (added by the user), or `reward`.
    Score(String),
}

impl Criterion {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "shorter" => Ok(Self::Shorter),
            "fewer_lines" => Ok(Self::FewerLines),
            s => match s.strip_prefix("score:") {
                Some(field) if !field.is_empty() => Ok(Self::Score(field.to_owned())),
                _ => Err(format!(
                    "`{s}` is not one of shorter, fewer_lines, score:NAME (a score the rollouts' lines hold in `scores`, or `reward`)"
                )),
            },
        }
    }

    /// The amount that ranks a rollout (lower is better); `None` where the
    /// rollout lacks the score.
    fn cost(&self, r: &Rollout) -> Option<f64> {
        match self {
            Self::Shorter => Some(r.tokens as f64),
            Self::FewerLines => Some(line_count(&r.completion) as f64),
            Self::Score(f) if f == "reward" => Some(-r.reward),
            Self::Score(f) => r.scores.get(f).map(|x| -x),
        }
    }

    fn name(&self) -> String {
        match self {
            Self::Shorter => "shorter".into(),
            Self::FewerLines => "fewer_lines".into(),
            Self::Score(f) => format!("score:{f}"),
        }
    }
}

/// What `prefs` is asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct PairRules {
    /// Rank correct answers against each other too.
    pub among_correct: Option<Criterion>,
    /// Drop pairs whose texts are closer than this many character edits
    /// (0: only identical texts are dropped).
    pub min_edit_distance: usize,
    /// Most pairs a prompt (0: all).
    pub max_pairs_per_prompt: usize,
    /// Seeds which pairs a capped prompt keeps.
    pub seed: u64,
    /// Where no answer of a prompt is right, its demonstration stands as
    /// the chosen answer against each wrong one (pairs of kind
    /// `demonstration`).
    pub demonstrations: bool,
    /// Keep a right-over-wrong pair (`correctness`, `demonstration`) only
    /// where both texts have the same number of lines (pairs ranked by a
    /// criterion are about length and are kept as they are).
    pub same_lines: bool,
    /// Each wrong answer also gives a pair at its first wrong line (pairs
    /// of kind `first_error`).
    pub first_error: bool,
}

impl Default for PairRules {
    fn default() -> Self {
        Self {
            among_correct: None,
            min_edit_distance: 0,
            max_pairs_per_prompt: 4,
            seed: 42,
            demonstrations: false,
            same_lines: false,
            first_error: false,
        }
    }
}

/// One preference pair, a line of the pairs file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    pub prompt_id: u64,
    /// The user message, before any chat template.
    pub prompt: String,
    pub chosen: String,
    pub rejected: String,
    /// The chosen text is the start of an answer, not a whole one: it is
    /// trained without the end-of-turn token (`first_error` pairs).
    #[serde(default, skip_serializing_if = "is_false")]
    pub chosen_open: bool,
    /// The same for the rejected text.
    #[serde(default, skip_serializing_if = "is_false")]
    pub rejected_open: bool,
    /// `correctness`, `demonstration` (the environment's answer over a
    /// wrong one), `first_error` (the expected line over the answer's first
    /// wrong one, after the answer's right lines), or the criterion that
    /// ranked two correct answers.
    pub kind: String,
    pub chosen_reward: f64,
    pub rejected_reward: f64,
    /// Character edits between the two texts.
    pub edit_distance: usize,
}

/// What `prefs` made and left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PairStats {
    pub rollouts: usize,
    pub prompts: usize,
    pub prompts_with_pairs: usize,
    /// Prompts that gave no pair, by why: `all_incorrect`, `all_correct`
    /// (and no criterion, or every correct answer tied), `single_rollout`,
    /// `all_identical`, `all_other_line_counts`, `all_too_similar`.
    pub prompts_without_pairs: BTreeMap<String, usize>,
    /// Pairs written, by kind.
    pub pairs: BTreeMap<String, usize>,
    /// Candidate pairs dropped, by why: `identical`, `other_line_count`,
    /// `too_similar`, `tie`, `over_cap`, `not_bare` (a wrong answer that is
    /// not the bare output, e.g. fenced or with a reasoning block, gives no
    /// `first_error` pair).
    pub dropped: BTreeMap<String, usize>,
    /// Pairs written that hold the prompt's greedy answer (`rollouts
    /// --greedy`) as chosen or rejected.
    pub with_greedy: usize,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Levenshtein distance in characters (two rows of the DP table, over what
/// is left once the common prefix and suffix are cut: they change nothing,
/// and `first_error` pairs share long prefixes).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let pre = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[pre..], &b[pre..]);
    let suf = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (a, b) = (&a[..a.len() - suf], &b[..b.len() - suf]);
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The pairs of `rollouts` under `rules`, prompt by prompt in prompt-id
/// order, and what was made and left out.
pub fn make_pairs(rollouts: &[Rollout], rules: &PairRules) -> (Vec<Pair>, PairStats) {
    let mut by_prompt: BTreeMap<u64, Vec<&Rollout>> = BTreeMap::new();
    for r in rollouts {
        by_prompt.entry(r.prompt_id).or_default().push(r);
    }
    let mut stats = PairStats {
        rollouts: rollouts.len(),
        prompts: by_prompt.len(),
        ..PairStats::default()
    };
    let mut out = Vec::new();
    for (&id, group) in &by_prompt {
        let (pairs, why) = prompt_pairs(id, group, rules, &mut stats.dropped);
        match why {
            Some(why) => *stats.prompts_without_pairs.entry(why).or_default() += 1,
            None => stats.prompts_with_pairs += 1,
        }
        for (p, greedy) in pairs {
            *stats.pairs.entry(p.kind.clone()).or_default() += 1;
            stats.with_greedy += usize::from(greedy);
            out.push(p);
        }
    }
    (out, stats)
}

/// A candidate pair before the rules drop or cap it.
struct Candidate<'a> {
    chosen: Cow<'a, str>,
    chosen_open: bool,
    chosen_reward: f64,
    rejected: Cow<'a, str>,
    rejected_open: bool,
    /// The wrong (or worse) answer the rejected side comes from.
    from: &'a Rollout,
    kind: Cow<'a, str>,
    /// The prompt's greedy answer is one of the two answers it comes from.
    greedy: bool,
}

impl<'a> Candidate<'a> {
    /// A whole answer over another (`from`).
    fn whole(
        chosen: &'a str,
        chosen_reward: f64,
        from: &'a Rollout,
        kind: &str,
        greedy_text: Option<&str>,
    ) -> Self {
        Candidate {
            chosen: Cow::Borrowed(chosen),
            chosen_open: false,
            chosen_reward,
            rejected: Cow::Borrowed(&from.completion),
            rejected_open: false,
            from,
            kind: Cow::Owned(kind.to_owned()),
            greedy: greedy_text.is_some_and(|g| g == chosen || g == from.completion),
        }
    }
}

/// One prompt's pairs, or why it gave none.
fn prompt_pairs(
    id: u64,
    group: &[&Rollout],
    rules: &PairRules,
    dropped: &mut BTreeMap<String, usize>,
) -> (Vec<(Pair, bool)>, Option<String>) {
    if group.len() < 2 {
        return (Vec::new(), Some("single_rollout".into()));
    }
    let correct: Vec<&Rollout> = group.iter().copied().filter(|r| r.correct).collect();
    let wrong: Vec<&Rollout> = group.iter().copied().filter(|r| !r.correct).collect();
    let greedy_text = group
        .iter()
        .find(|r| r.is_greedy())
        .map(|r| r.completion.as_str());
    let mut candidates: Vec<Candidate> = Vec::new();
    for c in &correct {
        for w in &wrong {
            candidates.push(Candidate::whole(
                &c.completion,
                c.reward,
                w,
                "correctness",
                greedy_text,
            ));
        }
    }
    let demonstration = group.iter().find_map(|r| r.demonstration.as_deref());
    if let Some(d) = demonstration.filter(|_| rules.demonstrations && correct.is_empty()) {
        for w in &wrong {
            candidates.push(Candidate::whole(d, 1.0, w, "demonstration", greedy_text));
        }
    }
    if rules.first_error {
        let mut not_bare = 0usize;
        for w in &wrong {
            match first_error(w) {
                Some(FirstError::Split {
                    chosen,
                    chosen_open,
                    rejected,
                    rejected_open,
                }) => candidates.push(Candidate {
                    chosen: Cow::Owned(chosen),
                    chosen_open,
                    chosen_reward: 1.0,
                    rejected: Cow::Owned(rejected),
                    rejected_open,
                    from: w,
                    kind: Cow::Borrowed("first_error"),
                    greedy: greedy_text == Some(w.completion.as_str()),
                }),
                Some(FirstError::NotBare) => not_bare += 1,
                None => {}
            }
        }
        if not_bare > 0 {
            *dropped.entry("not_bare".into()).or_default() += not_bare;
        }
    }
    let mut ties = 0usize;
    let mut unscored = 0usize;
    if let Some(crit) = &rules.among_correct {
        let name = crit.name();
        for (i, a) in correct.iter().enumerate() {
            for b in &correct[i + 1..] {
                let (Some(ca), Some(cb)) = (crit.cost(a), crit.cost(b)) else {
                    unscored += 1;
                    continue;
                };
                if ca < cb {
                    candidates.push(Candidate::whole(
                        &a.completion,
                        a.reward,
                        b,
                        &name,
                        greedy_text,
                    ));
                } else if cb < ca {
                    candidates.push(Candidate::whole(
                        &b.completion,
                        b.reward,
                        a,
                        &name,
                        greedy_text,
                    ));
                } else {
                    ties += 1;
                }
            }
        }
    }
    if unscored > 0 {
        // A pair of correct answers one of which lacks the score.
        *dropped.entry("no_score".into()).or_default() += unscored;
    }
    if ties > 0 {
        *dropped.entry("tie".into()).or_default() += ties;
    }
    if candidates.is_empty() {
        let why = if correct.is_empty() {
            "all_incorrect"
        } else {
            "all_correct"
        };
        return (Vec::new(), Some(why.into()));
    }
    // The kept pairs, each with whether the prompt's greedy answer is one
    // of the answers it comes from.
    let mut kept: Vec<(Pair, bool)> = Vec::new();
    let (mut identical, mut other_lines, mut similar) = (0usize, 0usize, 0usize);
    for c in candidates {
        if c.chosen == c.rejected && c.chosen_open == c.rejected_open {
            identical += 1;
            continue;
        }
        let right_over_wrong = c.kind == "correctness" || c.kind == "demonstration";
        if rules.same_lines && right_over_wrong && line_count(&c.chosen) != line_count(&c.rejected)
        {
            other_lines += 1;
            continue;
        }
        let d = edit_distance(&c.chosen, &c.rejected);
        if d < rules.min_edit_distance {
            similar += 1;
            continue;
        }
        let pair = Pair {
            prompt_id: id,
            prompt: c.from.prompt.clone(),
            chosen: c.chosen.into_owned(),
            rejected: c.rejected.into_owned(),
            chosen_open: c.chosen_open,
            rejected_open: c.rejected_open,
            kind: c.kind.into_owned(),
            chosen_reward: c.chosen_reward,
            rejected_reward: c.from.reward,
            edit_distance: d,
        };
        kept.push((pair, c.greedy));
    }
    for (why, n) in [
        ("identical", identical),
        ("other_line_count", other_lines),
        ("too_similar", similar),
    ] {
        if n > 0 {
            *dropped.entry(why.into()).or_default() += n;
        }
    }
    if kept.is_empty() {
        // The last rule that left candidates out names the prompt.
        let why = if similar > 0 {
            "all_too_similar"
        } else if other_lines > 0 {
            "all_other_line_counts"
        } else {
            "all_identical"
        };
        return (Vec::new(), Some(why.into()));
    }
    if rules.max_pairs_per_prompt > 0 && kept.len() > rules.max_pairs_per_prompt {
        // The pairs with a greedy answer first (they are about the answer
        // the model gives when evaluated), each group in a seeded order;
        // then the original order among the kept ones.
        let mut order: Vec<usize> = (0..kept.len()).collect();
        order.sort_by_key(|&i| (!kept[i].1, crate::rng::keyed(rules.seed, id, i as u64)));
        let mut keep: Vec<usize> = order[..rules.max_pairs_per_prompt].to_vec();
        keep.sort_unstable();
        *dropped.entry("over_cap".into()).or_default() += kept.len() - keep.len();
        kept = keep.into_iter().map(|i| kept[i].clone()).collect();
    }
    (kept, None)
}

/// What a wrong answer gives as a `first_error` pair.
#[derive(Debug, PartialEq)]
enum FirstError {
    /// The two sides, sharing the answer's text before its first wrong line.
    Split {
        chosen: String,
        chosen_open: bool,
        rejected: String,
        rejected_open: bool,
    },
    /// The answer is not the bare output (what scoring reads of it is not
    /// the whole text, stripped): its lines cannot be lined up with the
    /// output's.
    NotBare,
}

/// The pair at the first line where `r`'s answer leaves the expected
/// output, lines compared as the environment compares answers (whitespace
/// removed, lowercased: [`first_different_line`]); `None` where
/// every line agrees (an answer scored wrong for some other reason).
fn first_error(r: &Rollout) -> Option<FirstError> {
    let text = r.completion.as_str();
    let body = python_strip(text);
    if extract_answer(text) != body {
        return Some(FirstError::NotBare);
    }
    let start = text.len()
        - text
            .trim_start_matches(crate::reward::is_python_space)
            .len();
    // The answer's lines, as `str::lines` splits them: slices of `text`.
    let got: Vec<&str> = body.lines().collect();
    let expected: Vec<&str> = python_strip(&r.expected).lines().collect();
    let k = first_different_line(&got, &expected)?;
    // The answer's line k, with where it starts in `text`.
    let at_k = got
        .get(k)
        .map(|&g| (g.as_ptr() as usize - text.as_ptr() as usize, g));
    let split = match (expected.get(k), at_k) {
        // A wrong line: the expected one over it, both going on.
        (Some(e), Some((at, g))) => FirstError::Split {
            chosen: format!("{}{e}", &text[..at]),
            chosen_open: true,
            rejected: format!("{}{g}", &text[..at]),
            rejected_open: true,
        },
        // Stopped too soon: going on with the missing line over stopping.
        (Some(e), None) => {
            let ended = &text[..start + body.len()];
            let sep = if got.is_empty() { "" } else { "\n" };
            FirstError::Split {
                chosen: format!("{ended}{sep}{e}"),
                chosen_open: true,
                rejected: ended.to_owned(),
                rejected_open: false,
            }
        }
        // Went on past the output's end: stopping over the extra line.
        (None, Some((at, g))) => {
            let ended = if k == 0 { &text[..at] } else { &text[..at - 1] };
            let ended = ended.strip_suffix('\r').unwrap_or(ended);
            FirstError::Split {
                chosen: ended.to_owned(),
                chosen_open: false,
                rejected: format!("{}{g}", &text[..at]),
                rejected_open: true,
            }
        }
        (None, None) => unreachable!("k is below the longer of the two"),
    };
    Some(split)
}

/// Lines of an answer, trailing blank lines and spaces not counted.
fn line_count(text: &str) -> usize {
    text.trim_end().lines().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roll(id: u64, text: &str, correct: bool, tokens: usize) -> Rollout {
        Rollout {
            prompt_id: id,
            prompt: format!("prompt {id}"),
            completion: text.into(),
            answer: text.into(),
            expected: "x".into(),
            demonstration: None,
            tokens,
            stopped: true,
            reward: f64::from(u8::from(correct)),
            correct,
            sample: 0,
            sampling: Default::default(),
            model: "m".into(),
            model_commit: None,
            adapter: None,
            variant: None,
            scores: BTreeMap::new(),
        }
    }

    /// `score:NAME` ranks correct answers by a score the lines hold, higher
    /// first; a pair where one side lacks it is dropped and counted.
    #[test]
    fn a_score_ranks_correct_answers_higher_first() {
        let scored = |text: &str, q: Option<f64>| {
            let mut r = roll(1, text, true, 5);
            r.scores.extend(q.map(|q| ("quality".to_owned(), q)));
            r
        };
        let rolls = vec![
            scored("a", Some(0.9)),
            scored("b", Some(0.2)),
            scored("c", Some(0.9)),
            scored("d", None),
        ];
        let rules = PairRules {
            among_correct: Some(Criterion::parse("score:quality").unwrap()),
            max_pairs_per_prompt: 0,
            ..PairRules::default()
        };
        let (pairs, stats) = make_pairs(&rolls, &rules);
        let got: Vec<(&str, &str, &str)> = pairs
            .iter()
            .map(|p| (p.chosen.as_str(), p.rejected.as_str(), p.kind.as_str()))
            .collect();
        assert_eq!(
            got,
            [("a", "b", "score:quality"), ("c", "b", "score:quality")]
        );
        assert_eq!(stats.dropped.get("tie"), Some(&1));
        assert_eq!(stats.dropped.get("no_score"), Some(&3));
        for bad in ["score:", "longer", "score"] {
            assert!(Criterion::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Criterion::parse("score:reward"),
            Ok(Criterion::Score("reward".into()))
        );
    }

    #[test]
    fn edit_distance_counts_character_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
        assert_eq!(edit_distance("1\n2", "1\n3"), 1);
        // What the two share at either end is cut first: the same counts.
        assert_eq!(edit_distance("abcXdef", "abcYYdef"), 2);
        assert_eq!(edit_distance("aaa", "aaaa"), 1);
        assert_eq!(edit_distance("abab", "ab"), 2);
        let long = "x = 1\n".repeat(200);
        assert_eq!(
            edit_distance(&format!("{long}sitting"), &format!("{long}kitten")),
            3
        );
    }

    #[test]
    fn correct_over_incorrect_and_why_prompts_gave_none() {
        let rs = vec![
            // Prompt 1: two correct, one wrong: two pairs.
            roll(1, "4", true, 2),
            roll(1, "4\n", true, 3),
            roll(1, "5", false, 2),
            // Prompt 2: all wrong.
            roll(2, "a", false, 1),
            roll(2, "b", false, 1),
            // Prompt 3: all correct, no criterion.
            roll(3, "a", true, 1),
            roll(3, "a", true, 1),
            // Prompt 4: one rollout.
            roll(4, "a", true, 1),
            // Prompt 5: the wrong answer's text equals the correct one's
            // (a scoring that looked at more than the text).
            roll(5, "same", true, 1),
            roll(5, "same", false, 1),
        ];
        let (pairs, st) = make_pairs(&rs, &PairRules::default());
        assert_eq!(pairs.len(), 2);
        assert!(pairs.iter().all(|p| p.prompt_id == 1 && p.rejected == "5"));
        assert_eq!(pairs[0].chosen, "4");
        assert_eq!(pairs[0].kind, "correctness");
        assert_eq!(
            (pairs[0].chosen_reward, pairs[0].rejected_reward),
            (1.0, 0.0)
        );
        assert_eq!(st.prompts, 5);
        assert_eq!(st.prompts_with_pairs, 1);
        let why = &st.prompts_without_pairs;
        assert_eq!(why["all_incorrect"], 1);
        assert_eq!(why["all_correct"], 1);
        assert_eq!(why["single_rollout"], 1);
        assert_eq!(why["all_identical"], 1);
        assert_eq!(st.dropped["identical"], 1);
        assert_eq!(st.pairs["correctness"], 2);
    }

    #[test]
    fn a_criterion_ranks_correct_answers_and_drops_ties() {
        let rs = vec![
            roll(1, "1\n2\n3", true, 9),
            roll(1, "123", true, 4),
            roll(1, "321", true, 4),
        ];
        let shorter = PairRules {
            among_correct: Some(Criterion::Shorter),
            ..PairRules::default()
        };
        let (pairs, st) = make_pairs(&rs, &shorter);
        // 4 < 9 twice; the two of 4 tokens tie.
        assert_eq!(pairs.len(), 2, "{pairs:?}");
        assert!(
            pairs
                .iter()
                .all(|p| p.rejected == "1\n2\n3" && p.kind == "shorter")
        );
        assert_eq!(st.dropped["tie"], 1);
        let lines = PairRules {
            among_correct: Some(Criterion::FewerLines),
            ..PairRules::default()
        };
        let (pairs, _) = make_pairs(&rs, &lines);
        assert!(
            pairs
                .iter()
                .all(|p| p.kind == "fewer_lines" && p.rejected == "1\n2\n3")
        );
        // Lines are counted as `same_lines` counts them: trailing blank
        // lines do not make an answer longer.
        let blank = vec![roll(3, "1\n2", true, 3), roll(3, "1\n2\n\n", true, 5)];
        let (pairs, st) = make_pairs(&blank, &lines);
        assert!(pairs.is_empty(), "{pairs:?}");
        assert_eq!(st.dropped["tie"], 1);
        // Every correct answer tied: no pair, counted as all_correct.
        let tied = vec![roll(2, "a", true, 1), roll(2, "b", true, 1)];
        let (pairs, st) = make_pairs(&tied, &shorter);
        assert!(pairs.is_empty());
        assert_eq!(st.prompts_without_pairs["all_correct"], 1);
    }

    /// `demonstrations`: a prompt with no right answer pairs the
    /// environment's demonstration over each wrong one (capped as any
    /// other); a prompt with a right answer keeps its own pairs only; off,
    /// the all-wrong prompt gives none.
    #[test]
    fn demonstrations_stand_in_where_every_answer_is_wrong() {
        let with = |r: Rollout| Rollout {
            demonstration: Some("42".into()),
            ..r
        };
        let rs = vec![
            with(roll(1, "41", false, 2)),
            with(roll(1, "40", false, 2)),
            with(roll(1, "41", false, 2)),
            with(roll(2, "42", true, 2)),
            with(roll(2, "7", false, 2)),
            // No demonstration: nothing to stand in.
            roll(3, "0", false, 1),
            roll(3, "1", false, 1),
        ];
        let (pairs, st) = make_pairs(&rs, &PairRules::default());
        assert_eq!(pairs.len(), 1, "{pairs:?}");
        assert_eq!(st.prompts_without_pairs["all_incorrect"], 2);
        let on = PairRules {
            demonstrations: true,
            ..PairRules::default()
        };
        let (pairs, st) = make_pairs(&rs, &on);
        let demo: Vec<&Pair> = pairs.iter().filter(|p| p.kind == "demonstration").collect();
        assert_eq!(demo.len(), 3, "{pairs:?}");
        assert!(demo.iter().all(|p| p.prompt_id == 1
            && p.chosen == "42"
            && p.chosen_reward == 1.0
            && p.rejected_reward == 0.0
            && p.prompt == "prompt 1"));
        assert_eq!(demo[1].rejected, "40");
        assert_eq!(demo[1].edit_distance, 1);
        // Prompt 2 had a right answer: its pair is the sampled one.
        assert!(
            pairs
                .iter()
                .any(|p| p.prompt_id == 2 && p.kind == "correctness" && p.chosen == "42")
        );
        assert_eq!(st.pairs["demonstration"], 3);
        assert_eq!(st.prompts_with_pairs, 2);
        assert_eq!(st.prompts_without_pairs["all_incorrect"], 1);
        let capped = PairRules {
            max_pairs_per_prompt: 2,
            ..on
        };
        let (_, st) = make_pairs(&rs, &capped);
        assert_eq!(st.pairs["demonstration"], 2);
        assert_eq!(st.dropped["over_cap"], 1);
    }

    /// `same_lines`: right-over-wrong pairs (sampled or demonstrated) only
    /// where both answers have as many lines (a trailing newline not
    /// counted); pairs ranked by a criterion are kept whatever their lines.
    #[test]
    fn same_lines_keeps_right_over_wrong_pairs_of_equal_line_counts() {
        let with = |r: Rollout| Rollout {
            demonstration: Some("7".into()),
            ..r
        };
        let rs = vec![
            roll(1, "5\n", true, 2),
            roll(1, "4", false, 1),
            roll(1, "5\n6", false, 3),
            roll(1, "5\n6\n7\n", false, 4),
            // Only longer wrong answers: no pair, said why.
            roll(2, "1", true, 1),
            roll(2, "1\n2", false, 2),
            // The demonstration against wrong answers of one and two lines.
            with(roll(3, "8", false, 1)),
            with(roll(3, "7\n8", false, 2)),
        ];
        let on = PairRules {
            same_lines: true,
            demonstrations: true,
            max_pairs_per_prompt: 0,
            ..PairRules::default()
        };
        let (pairs, st) = make_pairs(&rs, &on);
        let got: Vec<(u64, &str, &str, &str)> = pairs
            .iter()
            .map(|p| {
                (
                    p.prompt_id,
                    p.chosen.as_str(),
                    p.rejected.as_str(),
                    p.kind.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (1, "5\n", "4", "correctness"),
                (3, "7", "8", "demonstration")
            ]
        );
        assert_eq!(st.dropped["other_line_count"], 4, "{st:?}");
        assert_eq!(st.prompts_without_pairs["all_other_line_counts"], 1);
        assert_eq!(st.prompts_with_pairs, 2);
        // Off: every right-over-wrong pair.
        let off = PairRules {
            same_lines: false,
            ..on.clone()
        };
        assert_eq!(make_pairs(&rs, &off).0.len(), 6);
        // A criterion's pairs differ in length by design and stay.
        let correct = vec![roll(4, "1\n2", true, 2), roll(4, "1", true, 1)];
        let fewer = PairRules {
            among_correct: Some(Criterion::FewerLines),
            ..on
        };
        let (pairs, _) = make_pairs(&correct, &fewer);
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs[0].kind, "fewer_lines");
    }

    #[test]
    fn minimum_edit_distance_and_the_cap() {
        let rs = vec![
            roll(1, "10", true, 1),
            roll(1, "11", false, 1),
            roll(1, "99999", false, 1),
        ];
        let rules = PairRules {
            min_edit_distance: 2,
            ..PairRules::default()
        };
        let (pairs, st) = make_pairs(&rs, &rules);
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs[0].rejected, "99999");
        assert_eq!(pairs[0].edit_distance, 5);
        assert_eq!(st.dropped["too_similar"], 1);
        let only_close = vec![roll(2, "10", true, 1), roll(2, "11", false, 1)];
        let (_, st) = make_pairs(&only_close, &rules);
        assert_eq!(st.prompts_without_pairs["all_too_similar"], 1);

        // Three correct x three wrong = 9 candidates, capped at 4, the same
        // four on every run, and another seed picks others.
        let many: Vec<Rollout> = (0..6)
            .map(|i| roll(7, &format!("answer {i}"), i < 3, 2))
            .collect();
        let cap = PairRules {
            max_pairs_per_prompt: 4,
            ..PairRules::default()
        };
        let (a, st) = make_pairs(&many, &cap);
        assert_eq!(a.len(), 4);
        assert_eq!(st.dropped["over_cap"], 5);
        assert_eq!(make_pairs(&many, &cap).0, a);
        let other: Vec<Vec<Pair>> = (0..8)
            .map(|seed| {
                make_pairs(
                    &many,
                    &PairRules {
                        seed,
                        ..cap.clone()
                    },
                )
                .0
            })
            .collect();
        assert!(other.iter().any(|o| *o != a), "the seed changes nothing");
    }

    /// Under the cap, the pairs with the prompt's greedy answer (temperature
    /// 0 in its `sampling`) are kept before any other, whichever side it is
    /// on; the rest of the cap is the seeded choice among the others.
    #[test]
    fn the_cap_keeps_the_greedy_answers_pairs_first() {
        let greedy = |r: Rollout| Rollout {
            sampling: super::super::rollout::SamplingSettings {
                temperature: 0.0,
                ..Default::default()
            },
            sample: 8,
            ..r
        };
        // Greedy wrong, five sampled right, three sampled wrong: 20
        // candidates, 5 with the greedy answer, capped at 3.
        let mut rs: Vec<Rollout> = (0..8)
            .map(|i| roll(4, &format!("answer {i}"), i < 5, 2))
            .collect();
        rs.push(greedy(roll(4, "greedy", false, 2)));
        assert!(rs[8].is_greedy() && !rs[0].is_greedy());
        for seed in 0..8 {
            let rules = PairRules {
                max_pairs_per_prompt: 3,
                seed,
                ..PairRules::default()
            };
            let (pairs, st) = make_pairs(&rs, &rules);
            assert_eq!(pairs.len(), 3);
            assert!(pairs.iter().all(|p| p.rejected == "greedy"), "{pairs:?}");
            assert_eq!((st.dropped["over_cap"], st.with_greedy), (17, 3));
            // A cap above the greedy pairs: all five, then others.
            let (pairs, st) = make_pairs(
                &rs,
                &PairRules {
                    max_pairs_per_prompt: 7,
                    ..rules
                },
            );
            assert_eq!(pairs.iter().filter(|p| p.rejected == "greedy").count(), 5);
            assert_eq!((pairs.len(), st.with_greedy), (7, 5));
        }
        // Without a greedy answer nothing counts as one.
        let (_, st) = make_pairs(&rs[..8], &PairRules::default());
        assert_eq!(st.with_greedy, 0);
        // Greedy right: the pairs that hold it up come first.
        let mut rs: Vec<Rollout> = (0..8)
            .map(|i| roll(5, &format!("answer {i}"), i < 2, 2))
            .collect();
        rs.push(greedy(roll(5, "greedy", true, 2)));
        let (pairs, _) = make_pairs(
            &rs,
            &PairRules {
                max_pairs_per_prompt: 6,
                ..PairRules::default()
            },
        );
        assert_eq!(pairs.len(), 6);
        assert!(pairs.iter().all(|p| p.chosen == "greedy"), "{pairs:?}");
    }

    /// `first_error`: the sides share the answer's own text before its
    /// first wrong line (compared as the environment compares: whitespace
    /// and case aside), then the expected line over the answer's; an
    /// answer that stopped too soon or went on too long gives the open side
    /// that goes on against the closed one that stops.
    #[test]
    fn first_error_splits_a_wrong_answer_at_its_first_wrong_line() {
        let wrong = |text: &str, expected: &str| Rollout {
            expected: expected.into(),
            ..roll(1, text, false, 3)
        };
        let e = "1\n2\n3";
        // (answer, expected output, chosen, open, rejected, open)
        let cases = [
            // A wrong middle line.
            ("1\n5\n3", e, "1\n2", true, "1\n5", true),
            // The first line wrong: nothing shared.
            ("7\n2\n3", e, "1", true, "7", true),
            // The shared part is the answer's own text (its spacing and
            // case), leading space and CRLF kept.
            (
                " 1\r\nTWO\n3",
                "1\ntwo\n4",
                " 1\r\nTWO\n4",
                true,
                " 1\r\nTWO\n3",
                true,
            ),
            // Stopped too soon: the missing line goes on over stopping.
            ("1\n2\n", e, "1\n2\n3", true, "1\n2", false),
            ("", e, "1", true, "", false),
            // Went on too long: stopping over the extra line.
            ("1\n2\n3\n4", e, "1\n2\n3", false, "1\n2\n3\n4", true),
            (
                "1\r\n2\r\n3\r\n4",
                e,
                "1\r\n2\r\n3",
                false,
                "1\r\n2\r\n3\r\n4",
                true,
            ),
            ("x", "", "", false, "x", true),
        ];
        for (answer, expected, chosen, chosen_open, rejected, rejected_open) in cases {
            let want = FirstError::Split {
                chosen: chosen.into(),
                chosen_open,
                rejected: rejected.into(),
                rejected_open,
            };
            assert_eq!(
                first_error(&wrong(answer, expected)),
                Some(want),
                "{answer:?}"
            );
        }
        // Not the bare output: its lines are not the output's.
        assert_eq!(
            first_error(&wrong("```\n9\n```", e)),
            Some(FirstError::NotBare)
        );
        assert_eq!(
            first_error(&wrong("<think>1</think>9", e)),
            Some(FirstError::NotBare)
        );
        // Every line agrees: no line to pair on.
        assert_eq!(first_error(&wrong("1\n2\n3", e)), None);
    }

    /// `first_error` in `make_pairs`: every wrong answer gives its pair,
    /// on prompts with and without a right answer; answers that are not
    /// bare are counted; the pairs carry which side is open, and the
    /// greedy answer's pair is kept first under the cap.
    #[test]
    fn first_error_pairs_come_from_every_wrong_answer() {
        let with = |r: Rollout| Rollout {
            expected: "1\n2".into(),
            ..r
        };
        let rs = vec![
            with(roll(1, "1\n3", false, 3)),
            with(roll(1, "1", false, 1)),
            with(roll(1, "```\n5\n```", false, 5)),
            with(roll(2, "1\n2", true, 3)),
            with(roll(2, "1\n2\n2", false, 5)),
        ];
        let (pairs, st) = make_pairs(&rs, &PairRules::default());
        assert_eq!(pairs.len(), 1);
        assert_eq!(st.prompts_without_pairs["all_incorrect"], 1);
        let on = PairRules {
            first_error: true,
            ..PairRules::default()
        };
        let (pairs, st) = make_pairs(&rs, &on);
        let fe: Vec<&Pair> = pairs.iter().filter(|p| p.kind == "first_error").collect();
        assert_eq!(fe.len(), 3, "{pairs:?}");
        let sides = |p: &Pair| {
            (
                p.chosen.clone(),
                p.chosen_open,
                p.rejected.clone(),
                p.rejected_open,
            )
        };
        assert_eq!(sides(fe[0]), ("1\n2".into(), true, "1\n3".into(), true));
        assert_eq!(sides(fe[1]), ("1\n2".into(), true, "1".into(), false));
        assert_eq!(sides(fe[2]), ("1\n2".into(), false, "1\n2\n2".into(), true));
        assert!(
            fe.iter()
                .all(|p| p.chosen_reward == 1.0 && p.rejected_reward == 0.0)
        );
        assert_eq!(fe[0].edit_distance, 1);
        assert_eq!(st.pairs["first_error"], 3);
        assert_eq!(st.pairs["correctness"], 1);
        assert_eq!(st.dropped["not_bare"], 1);
        assert_eq!(st.prompts_with_pairs, 2);
        assert!(st.prompts_without_pairs.is_empty());
        // The file's lines: open sides are written, closed ones left out.
        let line = serde_json::to_string(fe[1]).unwrap();
        assert!(line.contains("\"chosen_open\":true") && !line.contains("rejected_open"));
        assert_eq!(serde_json::from_str::<Pair>(&line).unwrap(), *fe[1]);
        // Under a cap of one, prompt 1 keeps its greedy answer's pair.
        let mut greedy = with(roll(1, "1", false, 1));
        greedy.sampling.temperature = 0.0;
        let rs = vec![
            with(roll(1, "1\n3", false, 3)),
            with(roll(1, "0", false, 1)),
            greedy,
        ];
        for seed in 0..8 {
            let (pairs, st) = make_pairs(
                &rs,
                &PairRules {
                    max_pairs_per_prompt: 1,
                    seed,
                    ..on.clone()
                },
            );
            assert_eq!(sides(&pairs[0]), ("1\n2".into(), true, "1".into(), false));
            assert_eq!(st.with_greedy, 1);
        }
    }
}
