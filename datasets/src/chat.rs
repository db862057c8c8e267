//! A model's chat template (Jinja) applied to a conversation as transformers' `apply_chat_template`
//! renders it: minijinja with Jinja2's `trim_blocks` and `lstrip_blocks`, Python's string methods
//! (`strip`, `startswith`, …), `raise_exception`, and `tojson` as Python's `json.dumps` writes it.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A user's message.
    pub fn user(content: &str) -> Self {
        ChatMessage {
            role: "user".into(),
            content: content.into(),
        }
    }
}

/// A chat template that failed to compile or render (`raise_exception` included).
#[derive(Debug, thiserror::Error)]
#[error("chat template: {message}")]
pub struct ChatError {
    message: String,
}

impl From<Error> for ChatError {
    fn from(e: Error) -> Self {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(inner) = source {
            message.push_str(&format!(": {inner}"));
            source = inner.source();
        }
        ChatError { message }
    }
}

/// A chat template with the special tokens its text may name.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// The template `source`, with the texts of the model's BOS and EOS tokens (empty if none).
    pub fn new(source: String, bos_token: String, eos_token: String) -> Self {
        ChatTemplate {
            source,
            bos_token,
            eos_token,
        }
    }

    /// The conversation's text; with `add_generation_prompt`, ending where the assistant's reply
    /// begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let mut env = Environment::new();
        let syntax = env
            .syntax()
            .to_builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_filter("tojson", python_json);
        let template = env.template_from_str(&self.source)?;
        Ok(template.render(context! {
            messages => Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })?)
    }
}

/// `tojson` as transformers' templates get it: Python's `json.dumps(value, ensure_ascii=False,
/// indent=indent)` (", " and ": " separators; minijinja's own escapes `<`, `>`, `&` and `'` for HTML).
fn python_json(value: Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(n) => Some(n),
        None => indent,
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// `value` as JSON, maps in their insertion order (as Python's dicts).
fn write_json(
    value: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    let (open, between, close) = match indent {
        Some(n) => (
            format!("\n{}", " ".repeat(n * (depth + 1))),
            format!(",\n{}", " ".repeat(n * (depth + 1))),
            format!("\n{}", " ".repeat(n * depth)),
        ),
        None => (String::new(), ", ".to_string(), String::new()),
    };
    let text = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    match value.kind() {
        ValueKind::Map | ValueKind::Seq | ValueKind::Iterable => {
            let map = value.kind() == ValueKind::Map;
            let items: Vec<Value> = value.try_iter()?.collect();
            let (start, end) = if map { ('{', '}') } else { ('[', ']') };
            out.push(start);
            if !items.is_empty() {
                out.push_str(&open);
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&between);
                    }
                    if map {
                        let key = item
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or(item.to_string());
                        out.push_str(&text(&key));
                        out.push_str(": ");
                        write_json(&value.get_item(item)?, indent, depth + 1, out)?;
                    } else {
                        write_json(item, indent, depth + 1, out)?;
                    }
                }
                out.push_str(&close);
            }
            out.push(end);
        }
        ValueKind::String => out.push_str(&text(value.as_str().unwrap_or_default())),
        ValueKind::None | ValueKind::Undefined => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&value.to_string()),
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {other} value has no JSON form"),
            ));
        }
    }
    Ok(())
}
