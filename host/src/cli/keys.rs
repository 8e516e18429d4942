//! `pushonce keys`: the operator's dry run of key derivation.

/// Arguments of `pushonce keys`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `pushonce keys`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`pushonce keys` is not built yet")
}
