//! Chat templates rendered as transformers renders them: `fixtures/chat/templates.json` (written by
//! `make_chat_fixture.py` with transformers' `render_jinja_template`) holds templates, conversations
//! and transformers' text for each, or the error the template raised; ringbench's rendering must
//! give the same text, byte for byte, or an error carrying the template's message.

use datasets::{ChatMessage, ChatTemplate};
use std::path::Path;

#[test]
fn chat_templates_render_as_transformers_renders_them() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/templates.json");
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let templates = fixture["templates"].as_array().unwrap();
    assert_eq!(templates.len(), 4);
    let (mut rendered, mut raised) = (0, 0);
    for t in templates {
        let name = t["name"].as_str().unwrap();
        let template = ChatTemplate::new(
            t["template"].as_str().unwrap().to_string(),
            t["bos_token"].as_str().unwrap().to_string(),
            t["eos_token"].as_str().unwrap().to_string(),
        );
        for case in t["cases"].as_array().unwrap() {
            let messages: Vec<ChatMessage> =
                serde_json::from_value(case["messages"].clone()).unwrap();
            let generation = case["add_generation_prompt"].as_bool().unwrap();
            let got = template.render(&messages, generation);
            match (case.get("text"), case.get("error")) {
                (Some(want), None) => {
                    assert_eq!(got.unwrap(), want.as_str().unwrap(), "{name}: {messages:?}");
                    rendered += 1;
                }
                (None, Some(want)) => {
                    let error = got.unwrap_err().to_string();
                    assert!(error.contains(want.as_str().unwrap()), "{name}: {error}");
                    raised += 1;
                }
                _ => panic!("{name}: a case with neither text nor error"),
            }
        }
    }
    assert_eq!((rendered, raised), (20, 4));
}

#[test]
fn a_broken_template_is_an_error_not_a_panic() {
    let template = ChatTemplate::new(
        "{% for m in messages %}".into(),
        String::new(),
        String::new(),
    );
    let error = template
        .render(&[ChatMessage::user("hi")], true)
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("chat template:"), "{error}");
}
