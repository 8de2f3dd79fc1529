//! `easd tokenize`: token ids of a text, as the model's tokenizer sees it.

use anyhow::Context;
use easd_model::{ChatMessage, ModelSources, Tokenizer, resolve_model};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    /// A GGUF file, `hf:OWNER/NAME/FILE.gguf[@REVISION]`, or `draft` / `target` for the default models.
    #[arg(long)]
    pub model: String,
    /// Models folder for `draft` / `target` [default: $EASD_MODELS_DIR or <cache dir>/easd/models].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Wrap the text as one user message in the model's chat template first.
    #[arg(long)]
    pub chat: bool,
    /// The text to tokenize.
    pub text: String,
}

pub fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    let path = resolve_model(&args.model, &ModelSources::from_env(args.dir), false)?;
    let tokenizer =
        Tokenizer::from_gguf_file(&path).with_context(|| format!("reading the tokenizer of {}", path.display()))?;
    let text =
        if args.chat { tokenizer.apply_chat_template(&[ChatMessage::new("user", args.text)])? } else { args.text };
    let ids = tokenizer.encode(&text)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
