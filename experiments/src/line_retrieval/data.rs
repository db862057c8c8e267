//! What a training step sees: line-retrieval records as plain text (the project's own format,
//! [`super::example`]),
//! the same records through the model's chat template (each question a user turn, each answer the
//! assistant's reply), or a user's conversations (`{"messages": [...]}` JSONL) through it. In a
//! conversation the loss is on the assistant's replies, their end-of-turn tokens included (the
//! standard SFT mask); every other token weighs `lm_weight` (0 for none).

use super::spec::Prompts;
use anyhow::{Context, Result, bail};
use datasets::{ChatMessage, ChatTemplate, Quiz, SplitMix64, TextTokenizer};
use std::path::Path;
use workbench::train::Example;

/// Where a step's examples come from.
pub enum TrainData<'a> {
    /// Line-retrieval records as plain text ([`super::example`]).
    Lines(Prompts),
    /// Line-retrieval records through the chat template: the record and its first question the
    /// first user turn, each later question a user turn of its own, each answer the assistant's.
    ChatLines(Prompts, &'a ChatTemplate),
    /// Conversations from a file, `batch` a step in an order drawn from `seed` anew each pass over
    /// the file.
    Conversations {
        /// Every conversation.
        all: Vec<Vec<ChatMessage>>,
        /// Conversations a step.
        batch: usize,
        /// Seeds the order of each pass.
        seed: u64,
        /// Its template.
        chat: &'a ChatTemplate,
        /// The weight of every token the assistant did not write.
        lm_weight: f32,
    },
}

impl TrainData<'_> {
    /// The examples of step `step` (the same on every rank and every run).
    pub fn batch(&self, tokenizer: &dyn TextTokenizer, step: usize) -> Result<Vec<Example>> {
        match self {
            TrainData::Lines(prompts) => Ok(prompts.batch(tokenizer, step)?),
            TrainData::ChatLines(prompts, chat) => {
                let mut rng = prompts.step_rng(step);
                (0..prompts.batch)
                    .map(|_| {
                        let quiz = prompts.draw(&mut rng);
                        conversation_example(
                            tokenizer,
                            chat,
                            &quiz_conversation(&quiz),
                            prompts.lm_weight,
                        )
                    })
                    .collect()
            }
            TrainData::Conversations {
                all,
                batch,
                seed,
                chat,
                lm_weight,
            } => (0..*batch)
                .map(|i| {
                    let index = step * batch + i;
                    let order = pass_order(all.len(), *seed, index / all.len());
                    let messages = &all[order[index % all.len()]];
                    conversation_example(tokenizer, chat, messages, *lm_weight)
                })
                .collect(),
        }
    }
}

/// The order of pass `pass` over `n` conversations: a shuffle drawn from `seed` and the pass.
fn pass_order(n: usize, seed: u64, pass: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64::new(seed ^ (pass as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for i in (1..n).rev() {
        let j = rng.range_inclusive(0, i as u64) as usize;
        order.swap(i, j);
    }
    order
}

/// A line-retrieval record as a conversation: the record and its first question from the user,
/// the value from the assistant, then each later question and its value.
pub fn quiz_conversation(quiz: &Quiz) -> Vec<ChatMessage> {
    let turn = |role: &str, content: String| ChatMessage {
        role: role.to_owned(),
        content,
    };
    let mut messages = vec![
        turn("user", quiz.first.prompt.clone()),
        turn("assistant", quiz.first.expected_number.to_string()),
    ];
    for (question, value) in &quiz.follow_ups {
        messages.push(turn("user", question.trim().to_owned()));
        messages.push(turn("assistant", value.to_string()));
    }
    messages
}

/// A conversation's tokens and weights through `chat`: the text is rendered a message at a time,
/// each rendering a prefix of the next (a template that rewrites earlier turns is refused), every
/// piece tokenized on its own; the pieces an assistant message adds weigh 1, the rest `lm_weight`.
/// An assistant turn's piece starts after the generation prompt the template puts before it.
pub fn conversation_example(
    tokenizer: &dyn TextTokenizer,
    chat: &ChatTemplate,
    messages: &[ChatMessage],
    lm_weight: f32,
) -> Result<Example> {
    if messages.is_empty() {
        bail!("an empty conversation");
    }
    if !messages.iter().any(|m| m.role == "assistant") {
        bail!("a conversation without an assistant turn gives nothing to learn");
    }
    let mut text = String::new();
    let mut tokens: Vec<u32> = Vec::new();
    let mut weights: Vec<f32> = Vec::new();
    let mut push = |piece: &str, weight: f32, tokens: &mut Vec<u32>| -> Result<()> {
        let ids = tokenizer.text_ids(piece)?;
        // weights[i] weighs predicting tokens[i + 1]: each of this piece's tokens is predicted by
        // the token before it.
        for _ in &ids {
            if !tokens.is_empty() {
                weights.push(weight);
            }
            tokens.push(0);
        }
        let start = tokens.len() - ids.len();
        tokens[start..].copy_from_slice(&ids);
        Ok(())
    };
    for k in 0..messages.len() {
        let next_is_reply = messages.get(k + 1).is_some_and(|m| m.role == "assistant");
        let rendered = chat.render(&messages[..=k], next_is_reply)?;
        let Some(piece) = rendered.strip_prefix(text.as_str()) else {
            bail!(
                "the chat template rewrites the conversation's earlier turns when message {k} \
                 ({}) is added: the reply's tokens cannot be told apart",
                messages[k].role
            );
        };
        let weight = if messages[k].role == "assistant" {
            1.0
        } else {
            lm_weight
        };
        push(piece, weight, &mut tokens)?;
        text = rendered;
    }
    if tokens.len() < 2 {
        bail!("a conversation of fewer than 2 tokens");
    }
    Ok(Example { tokens, weights })
}

/// One line of a conversations file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConversationLine {
    messages: Vec<ChatMessage>,
}

/// The conversations of a JSONL file, each line `{"messages": [{"role", "content"}, ...]}` with
/// at least one assistant turn; an error names the line.
pub fn read_conversations(path: &Path) -> Result<Vec<Vec<ChatMessage>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut all = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{} line {}", path.display(), n + 1);
        let line: ConversationLine = serde_json::from_str(line).with_context(at)?;
        if let Some(m) = line
            .messages
            .iter()
            .find(|m| !["system", "user", "assistant"].contains(&m.role.as_str()))
        {
            bail!(
                "{}: role {:?} is not system, user or assistant",
                at(),
                m.role
            );
        }
        if !line.messages.iter().any(|m| m.role == "assistant") {
            bail!("{}: no assistant turn to learn from", at());
        }
        all.push(line.messages);
    }
    if all.is_empty() {
        bail!("{}: no conversations", path.display());
    }
    Ok(all)
}
