//! `pushonce bench plugins`: to be built by its issue.

/// Arguments of `pushonce bench plugins`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `pushonce bench plugins`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`pushonce bench plugins` is not built yet")
}
