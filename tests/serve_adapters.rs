//! `serve` with several LoRA adapters of one base, and `/v1/completions`,
//! on the tiny chat model with two adapters made here (different ranks,
//! scales and target modules). Requests naming the base and each adapter
//! are sent all at once, so rows of different adapters decode in the same
//! batch; every answer must be the library's greedy decoding of the same
//! prompt by that model alone (the base, or the base with that adapter).

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use async_openai::types::completions::CreateCompletionRequestArgs;
use candle_core::{DType, Device, Tensor};
use tokio_stream::StreamExt;

use trace_train::data::{ChatTokenizer, Message, Role};
use trace_train::model::layers::init::Rng;
use trace_train::model::layers::lora::{LoraConfig, TargetModule};
use trace_train::model::{self, LoadedModel};
use trace_train::serve::{AppState, ServeOptions};

const BASE: &str = "tiny-base";
/// The served ids, in the server's order: the base, then each adapter.
const NAMES: [&str; 3] = [BASE, "terse", "verbose"];

struct TestServer {
    url: String,
    base: PathBuf,
    adapters: Vec<PathBuf>,
    _dir: tempfile::TempDir,
}

/// Writes an adapter of `base` with rank `r` on `targets`, its `B` factors
/// random (a fresh adapter's are zero and would change nothing).
fn write_adapter(base: &Path, out: &Path, r: usize, alpha: f64, targets: &[TargetModule]) {
    let lora = LoraConfig {
        r,
        alpha,
        dropout: 0.0,
        target_modules: targets.to_vec(),
        seed: r as u64,
    };
    let m = model::load(base, Some(&lora), DType::F32, &Device::Cpu).unwrap();
    for p in m.model.projections() {
        if let Some(ad) = p.adapter() {
            let (o, r) = ad.b.as_tensor().dims2().unwrap();
            let v = Rng::for_tensor(7 + r as u64, p.name()).uniform(o * r, -0.6, 0.6);
            ad.b.set(&Tensor::from_vec(v, (o, r), &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    model::io::adapter::save(&m, out, &base.display().to_string()).unwrap();
}

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("tiny");
        model::arch::tiny::write_tiny_chat_model(&base, 11).unwrap();
        let adapters = vec![dir.path().join("a1"), dir.path().join("a2")];
        write_adapter(&base, &adapters[0], 4, 8.0, &TargetModule::ALL);
        write_adapter(
            &base,
            &adapters[1],
            8,
            8.0,
            &[
                TargetModule::QProj,
                TargetModule::VProj,
                TargetModule::DownProj,
            ],
        );
        let state = AppState::load(&ServeOptions {
            model_dir: base.clone(),
            adapters: vec![
                (Some(NAMES[1].into()), adapters[0].clone()),
                (Some(NAMES[2].into()), adapters[1].clone()),
            ],
            name: Some(BASE.into()),
            api_key: None,
            max_batch: 8,
            max_tokens: 64,
            max_model_len: None,
            log_requests: false,
            device: Device::Cpu,
            base_precision: trace_train::model::BasePrecision::Bf16,
            deadlines: Default::default(),
            special_tokens_in_messages: false,
        })
        .unwrap();
        assert_eq!(state.names(), NAMES);
        let url = common::serve_in_process(state);
        TestServer {
            url,
            base,
            adapters,
            _dir: dir,
        }
    })
}

fn client() -> Client<OpenAIConfig> {
    Client::with_config(OpenAIConfig::new().with_api_base(server().url.clone()))
}

fn tokenizer() -> ChatTokenizer {
    ChatTokenizer::from_dir(&server().base).unwrap()
}

/// Served model `which` (an index into [`NAMES`]) loaded alone.
fn alone(which: usize) -> &'static LoadedModel {
    static MODELS: OnceLock<Vec<LoadedModel>> = OnceLock::new();
    &MODELS.get_or_init(|| {
        let s = server();
        let mut v = vec![model::load(&s.base, None, DType::F32, &Device::Cpu).unwrap()];
        for a in &s.adapters {
            v.push(model::io::adapter::load(&s.base, a, DType::F32, &Device::Cpu).unwrap());
        }
        v
    })[which]
}

/// The greedy answer of model `which` alone to the prompt `ids`: its text
/// and the tokens the server counts (the stop token included).
fn greedy(which: usize, ids: Vec<u32>, max_tokens: usize) -> (String, usize) {
    let tok = tokenizer();
    let g = model::decode::generate::greedy(
        &alone(which).model,
        &[ids],
        max_tokens,
        &tok.stop_ids(),
        tok.pad().id,
        0,
        &Device::Cpu,
    )
    .unwrap()
    .remove(0);
    (
        tok.decode(&g.tokens, true).unwrap(),
        g.tokens.len() + usize::from(g.stopped),
    )
}

fn chat(model: &str, prompt: &str, max_tokens: u32) -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model(model)
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content(prompt)
            .build()
            .unwrap()
            .into()])
        .max_completion_tokens(max_tokens)
        .temperature(0.0)
        .build()
        .unwrap()
}

#[tokio::test]
async fn rows_of_different_adapters_decode_together_each_through_its_own() {
    let prompts = ["print(6 * 7)", "x = [1, 2]\nprint(x)", "def f(a): return a"];
    let mut asked = Vec::new();
    for p in prompts {
        for (which, name) in NAMES.iter().enumerate() {
            asked.push((which, p, chat(name, p, 20)));
        }
    }
    // Nine requests at once on eight rows: mixed batches, and a newcomer
    // joining rows of other adapters.
    let answers = futures_join(asked.iter().map(|(_, _, r)| r.clone())).await;
    let tok = tokenizer();
    let mut texts = vec![Vec::new(); NAMES.len()];
    for ((which, prompt, _), r) in asked.iter().zip(answers) {
        let r = r.unwrap();
        assert_eq!(r.model, NAMES[*which]);
        let ids = tok
            .encode_prompt(&[Message::new(Role::User, *prompt)])
            .unwrap();
        let (want, n) = greedy(*which, ids, 20);
        let got = r.choices[0].message.content.clone().unwrap_or_default();
        assert_eq!(got, want, "`{}` on {prompt:?}", NAMES[*which]);
        assert_eq!(r.usage.unwrap().completion_tokens, n as u32);
        texts[*which].push(got);
    }
    // The adapters change the answers: otherwise this proves nothing.
    assert_ne!(texts[0], texts[1]);
    assert_ne!(texts[0], texts[2]);
    assert_ne!(texts[1], texts[2]);
}

async fn futures_join(
    reqs: impl Iterator<Item = CreateChatCompletionRequest>,
) -> Vec<Result<async_openai::types::chat::CreateChatCompletionResponse, OpenAIError>> {
    let tasks: Vec<_> = reqs
        .map(|r| tokio::spawn(async move { client().chat().create(r).await }))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn the_models_list_names_the_base_and_each_adapter_and_others_are_refused() {
    let models = client().models().list().await.unwrap();
    let ids: Vec<&str> = models.data.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, NAMES);
    let e = client()
        .chat()
        .create(chat("nope", "hi", 4))
        .await
        .unwrap_err();
    let OpenAIError::ApiError(e) = e else {
        panic!("{e:?}")
    };
    assert_eq!(e.code.as_deref(), Some("model_not_found"));
    for n in NAMES {
        assert!(e.message.contains(&format!("`{n}`")), "{}", e.message);
    }
}

#[tokio::test]
async fn a_completion_continues_the_raw_prompt_through_the_named_adapter() {
    let prompt = "for i in range(3):";
    let tok = tokenizer();
    let mut ids: Vec<u32> = tok.bos().map(|b| b.id).into_iter().collect();
    ids.extend(tok.encode(prompt).unwrap());
    for (which, name) in NAMES.iter().enumerate() {
        let req = CreateCompletionRequestArgs::default()
            .model(*name)
            .prompt(prompt)
            .max_tokens(24u32)
            .temperature(0.0)
            .build()
            .unwrap();
        let r = client().completions().create(req.clone()).await.unwrap();
        assert_eq!(r.object, "text_completion");
        assert_eq!(r.model, *name);
        let (want, n) = greedy(which, ids.clone(), 24);
        assert_eq!(r.choices[0].text, want, "`{name}`");
        let u = r.usage.unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens),
            (ids.len() as u32, n as u32)
        );
        // Streamed, the pieces add up to the same text.
        let mut stream = client().completions().create_stream(req).await.unwrap();
        let (mut text, mut finish) = (String::new(), None);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.unwrap();
            assert_eq!(chunk.object, "text_completion");
            for c in &chunk.choices {
                text.push_str(&c.text);
                finish = finish.or(c.finish_reason);
            }
        }
        assert_eq!(text, want, "`{name}` streamed");
        assert!(finish.is_some(), "the last chunk says how it ended");
    }
    // Without max_tokens a completion gets 16 new tokens at most, as
    // OpenAI's completions do.
    let req = CreateCompletionRequestArgs::default()
        .model(NAMES[1])
        .prompt(prompt)
        .temperature(0.0)
        .build()
        .unwrap();
    let r = client().completions().create(req).await.unwrap();
    let (want, n) = greedy(1, ids.clone(), 16);
    assert_eq!(r.choices[0].text, want);
    assert_eq!(r.usage.unwrap().completion_tokens, n as u32);
}
