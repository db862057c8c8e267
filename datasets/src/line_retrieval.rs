//! LongChat's line-retrieval task (Li et al. 2023, "How Long Can Open-Source LLMs Truly Promise on
//! Context Length?"): a record of `line <name>: REGISTER_CONTENT is <n>` lines, then a question for one
//! name. The strings below are those of LongChat's published test files.

use crate::SplitMix64;
use crate::words::{ADJECTIVES, FRESH_ADJECTIVES, FRESH_NOUNS, NOUNS};
use serde::Deserialize;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// LongChat's prompt preamble, word for word.
pub const HEADER: &str = "Below is a record of lines I want you to remember. Each line begins with 'line <line index>' and contains a '<REGISTER_CONTENT>' at the end of the line as a numerical value. For each line index, memorize its corresponding <REGISTER_CONTENT>. At the end of the record, I will ask you to retrieve the corresponding <REGISTER_CONTENT> of a certain line index. Now the record start:\n\n";
/// The question after the record, before the line's name.
pub const QUESTION_START: &str =
    "\nNow the record is over. Tell me what is the <REGISTER_CONTENT> in line ";
/// The end of the question.
pub const QUESTION_END: &str = "? I need the number.";
/// The smallest register value (values are uniform in `MIN_NUMBER..=MAX_NUMBER`).
pub const MIN_NUMBER: u64 = 1;
/// The largest register value.
pub const MAX_NUMBER: u64 = 50000;

/// Every string a case is made of, in one text: the fixed strings, every name's words, every digit.
/// A tokenizer that encodes it encodes every case (a check made before training, so that no step
/// fails on an unknown character).
pub fn every_string() -> String {
    let mut text =
        format!("{HEADER}{QUESTION_START}{QUESTION_END}line -: REGISTER_CONTENT is <0123456789>\n");
    for word in ADJECTIVES.iter().chain(NOUNS) {
        text.push_str(word);
        text.push(' ');
    }
    text
}

/// Why cases could not be read or generated.
#[derive(Debug, Error)]
pub enum DatasetError {
    /// The file could not be read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        cause: std::io::Error,
    },
    /// A line is not a case.
    #[error("{path}:{line}: {message}")]
    Jsonl {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What the JSON reader said.
        message: String,
    },
    /// The file holds no case.
    #[error("{path}: no cases (the file has no JSON lines)")]
    NoCases {
        /// The file.
        path: PathBuf,
    },
    /// More lines than there are distinct names to give them.
    #[error(
        "{num_lines} lines need {num_lines} distinct names but the {split:?} word lists give {available}"
    )]
    TooManyLines {
        /// Lines asked for.
        num_lines: usize,
        /// Names the split offers.
        available: usize,
        /// The split.
        split: WordSplit,
    },
}

/// Which words line names are made of; training and evaluation words are disjoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordSplit {
    /// The first 80% of each word list.
    Train,
    /// The last 20%: names never seen in training.
    Eval,
    /// Every word of the two lists above.
    All,
    /// Words of lists of their own (`words::FRESH_ADJECTIVES`, `FRESH_NOUNS`), in neither split:
    /// 1,600 held-out names, for held-out records longer than the 441 of `Eval`.
    Fresh,
}

impl WordSplit {
    /// Every split, with the name `gen-lines --split` and a spec's `split` give it.
    pub const NAMED: [(&'static str, WordSplit); 4] = [
        ("eval", WordSplit::Eval),
        ("fresh", WordSplit::Fresh),
        ("train", WordSplit::Train),
        ("all", WordSplit::All),
    ];

    /// The splits' names, for a refusal: `eval, fresh, train, all`.
    pub fn names() -> String {
        Self::NAMED.map(|(n, _)| n).join(", ")
    }

    /// The split named `name`, if there is one.
    pub fn by_name(name: &str) -> Option<WordSplit> {
        Self::NAMED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
    }

    fn words(self, list: &'static [&'static str]) -> &'static [&'static str] {
        let cut = list.len() * 4 / 5;
        match self {
            WordSplit::Train => &list[..cut],
            WordSplit::Eval => &list[cut..],
            WordSplit::All | WordSplit::Fresh => list,
        }
    }

    /// The adjectives and nouns names are made of.
    fn lists(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            WordSplit::Fresh => (FRESH_ADJECTIVES, FRESH_NOUNS),
            split => (split.words(ADJECTIVES), split.words(NOUNS)),
        }
    }
}

/// How many distinct line names `split` offers: the most lines one record of it can hold.
pub fn name_pool(split: WordSplit) -> usize {
    let (adjectives, nouns) = split.lists();
    adjectives.len() * nouns.len()
}

/// One test case, as in LongChat's JSONL files.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Case {
    /// The whole prompt: preamble, record and question.
    pub prompt: String,
    /// The register value asked for.
    pub expected_number: u64,
    /// Lines in the record.
    pub num_lines: usize,
}

/// Generates a prompt of `num_lines` lines with distinct names and asks for one of them.
pub fn generate(
    rng: &mut SplitMix64,
    num_lines: usize,
    split: WordSplit,
) -> Result<Case, DatasetError> {
    Ok(generate_quiz(rng, num_lines, 1, split)?.first)
}

/// One record asked about several of its lines in turn: a training prompt with more answers per
/// token than a [`Case`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quiz {
    /// The record and its first question, exactly as [`generate`] makes them from the same seed.
    pub first: Case,
    /// Each later question (`QUESTION_START name QUESTION_END`) and the value it asks for; no line
    /// is asked twice, so an answer cannot be copied from an earlier one.
    pub follow_ups: Vec<(String, u64)>,
}

/// Generates a record of `num_lines` lines with distinct names and asks for `questions` distinct
/// lines of it (at least 1, at most `num_lines`). With one question this draws what [`generate`]
/// draws, so earlier training streams are unchanged.
pub fn generate_quiz(
    rng: &mut SplitMix64,
    num_lines: usize,
    questions: usize,
    split: WordSplit,
) -> Result<Quiz, DatasetError> {
    let (adjectives, nouns) = split.lists();
    let available = name_pool(split);
    if num_lines == 0 || num_lines > available {
        return Err(DatasetError::TooManyLines {
            num_lines,
            available,
            split,
        });
    }
    let mut names = Vec::with_capacity(num_lines);
    let mut seen = HashSet::new();
    while names.len() < num_lines {
        let adjective = adjectives[rng.below(adjectives.len() as u64) as usize];
        let noun = nouns[rng.below(nouns.len() as u64) as usize];
        let name = format!("{adjective}-{noun}");
        if seen.insert(name.clone()) {
            names.push(name);
        }
    }
    let numbers: Vec<u64> = (0..num_lines)
        .map(|_| rng.range_inclusive(MIN_NUMBER, MAX_NUMBER))
        .collect();
    let mut targets: Vec<usize> = Vec::new();
    while targets.len() < questions.clamp(1, num_lines) {
        let target = rng.below(num_lines as u64) as usize;
        if !targets.contains(&target) {
            targets.push(target);
        }
    }
    let question = |t: usize| format!("{QUESTION_START}{}{QUESTION_END}", names[t]);
    let mut prompt = String::from(HEADER);
    for (name, n) in names.iter().zip(&numbers) {
        prompt += &format!("line {name}: REGISTER_CONTENT is <{n}>\n");
    }
    prompt += &question(targets[0]);
    Ok(Quiz {
        first: Case {
            prompt,
            expected_number: numbers[targets[0]],
            num_lines,
        },
        follow_ups: targets[1..]
            .iter()
            .map(|&t| (question(t), numbers[t]))
            .collect(),
    })
}

/// Reads LongChat test cases: one JSON object per line with `prompt`, `expected_number` and
/// `num_lines` (other fields are ignored). Blank lines are skipped.
pub fn read_jsonl(path: &Path) -> Result<Vec<Case>, DatasetError> {
    let text = std::fs::read_to_string(path).map_err(|cause| DatasetError::Io {
        path: path.to_owned(),
        cause,
    })?;
    let cases: Vec<Case> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<Case>(l).map_err(|e| DatasetError::Jsonl {
                path: path.to_owned(),
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    if cases.is_empty() {
        return Err(DatasetError::NoCases {
            path: path.to_owned(),
        });
    }
    Ok(cases)
}

/// LongChat's scoring: the answer is the last integer in the reply; `None` if it has none.
pub fn score_reply(reply: &str) -> Option<u64> {
    let mut last = None;
    let mut current: Option<u64> = None;
    for c in reply.chars() {
        match c.to_digit(10) {
            Some(d) => {
                current = Some(
                    current
                        .unwrap_or(0)
                        .saturating_mul(10)
                        .saturating_add(d as u64),
                )
            }
            None => {
                if current.is_some() {
                    last = current.take();
                }
            }
        }
    }
    current.or(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_prompt_has_longchat_structure() {
        let mut rng = SplitMix64::new(3);
        let case = generate(&mut rng, 5, WordSplit::Train).unwrap();
        assert!(case.prompt.starts_with(HEADER));
        assert!(case.prompt.ends_with(QUESTION_END));
        let lines: Vec<&str> = case.prompt[HEADER.len()..]
            .lines()
            .filter(|l| l.starts_with("line "))
            .collect();
        assert_eq!(lines.len(), 5);
        let asked = case
            .prompt
            .rsplit("in line ")
            .next()
            .unwrap()
            .trim_end_matches(QUESTION_END);
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("line {asked}:")))
            .unwrap();
        assert_eq!(
            line,
            &format!(
                "line {asked}: REGISTER_CONTENT is <{}>",
                case.expected_number
            )
        );
        assert!((MIN_NUMBER..=MAX_NUMBER).contains(&case.expected_number));
    }

    #[test]
    fn train_and_eval_words_are_disjoint() {
        for list in [ADJECTIVES, NOUNS] {
            let train: HashSet<_> = WordSplit::Train.words(list).iter().collect();
            assert!(
                WordSplit::Eval
                    .words(list)
                    .iter()
                    .all(|w| !train.contains(w))
            );
            assert_eq!(
                list.iter().collect::<HashSet<_>>().len(),
                list.len(),
                "no duplicate words"
            );
        }
        // The fresh lists share no word with the others (nor within themselves), and a record of
        // them names 1,600 lines.
        let others: HashSet<&str> = ADJECTIVES.iter().chain(NOUNS).copied().collect();
        let fresh: Vec<&str> = FRESH_ADJECTIVES
            .iter()
            .chain(FRESH_NOUNS)
            .copied()
            .collect();
        assert!(fresh.iter().all(|w| !others.contains(w)));
        assert_eq!(fresh.iter().collect::<HashSet<_>>().len(), fresh.len());
        assert_eq!(name_pool(WordSplit::Fresh), 1600);
        let long = generate(&mut SplitMix64::new(3), 700, WordSplit::Fresh).unwrap();
        assert_eq!(long.num_lines, 700);
        assert!(
            !others
                .iter()
                .any(|w| long.prompt.contains(&format!(" {w}-")))
        );
    }

    #[test]
    fn a_quiz_asks_distinct_lines_and_begins_as_the_case_of_its_seed() {
        let case = generate(&mut SplitMix64::new(5), 6, WordSplit::Train).unwrap();
        let quiz = generate_quiz(&mut SplitMix64::new(5), 6, 4, WordSplit::Train).unwrap();
        assert_eq!(quiz.first, case, "one question draws what generate draws");
        assert_eq!(quiz.follow_ups.len(), 3);
        let asked = |q: &str| {
            let name = &q[q.rfind("in line ").unwrap() + 8..q.len() - QUESTION_END.len()];
            let line = case
                .prompt
                .lines()
                .find(|l| l.starts_with(&format!("line {name}:")))
                .unwrap();
            (name.to_string(), line.to_string())
        };
        let mut names = vec![asked(&case.prompt).0];
        for (question, value) in &quiz.follow_ups {
            assert!(question.starts_with(QUESTION_START) && question.ends_with(QUESTION_END));
            let (name, line) = asked(question);
            assert!(line.ends_with(&format!("<{value}>")), "{line} vs {value}");
            assert!(!names.contains(&name), "{name} asked twice");
            names.push(name);
        }
        // More questions than lines ask every line once; zero asks one.
        let all = generate_quiz(&mut SplitMix64::new(5), 3, 9, WordSplit::Train).unwrap();
        assert_eq!(all.follow_ups.len(), 2);
        let none = generate_quiz(&mut SplitMix64::new(5), 3, 0, WordSplit::Train).unwrap();
        assert!(none.follow_ups.is_empty());
    }

    #[test]
    fn generation_is_seeded() {
        let a = generate(&mut SplitMix64::new(9), 7, WordSplit::Eval).unwrap();
        let b = generate(&mut SplitMix64::new(9), 7, WordSplit::Eval).unwrap();
        assert_eq!(a, b);
        let c = generate(&mut SplitMix64::new(10), 7, WordSplit::Eval).unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn scoring_takes_the_last_integer() {
        assert_eq!(score_reply("The number is <123> not 45"), Some(45));
        assert_eq!(score_reply("<31337>"), Some(31337));
        assert_eq!(score_reply("no number"), None);
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        let dir = std::env::temp_dir().join(format!("ringbench-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cases.jsonl");
        std::fs::write(
            &path,
            "{\"prompt\": \"p\", \"expected_number\": 5, \"num_lines\": 1, \"topic\": \"x\"}\n\n{\"prompt\": \"q\", \"num_lines\": 2}\n",
        )
        .unwrap();
        let err = read_jsonl(&path).unwrap_err().to_string();
        assert!(
            err.contains("cases.jsonl:3:") && err.contains("expected_number"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
