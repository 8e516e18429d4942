//! `pushonce bench permit`: to be built by its issue.

/// Arguments of `pushonce bench permit`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `pushonce bench permit`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`pushonce bench permit` is not built yet")
}
