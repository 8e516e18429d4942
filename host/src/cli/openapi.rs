//! `pushonce openapi [--out FILE]`: prints (or writes) the API's OpenAPI 3.1
//! document, the same text `/openapi.json` serves and `openapi.json` holds.

use std::path::PathBuf;

use anyhow::Context;

/// Arguments of `pushonce openapi`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write the document to this file instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Run `pushonce openapi`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let doc = crate::api::openapi::document();
    match args.out {
        Some(path) => {
            std::fs::write(&path, doc).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{doc}"),
    }
    Ok(())
}
