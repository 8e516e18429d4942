//! `pushonce plugins list|check`: inspect plugin files.

/// Arguments of `pushonce plugins`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `pushonce plugins`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`pushonce plugins` is not built yet")
}
