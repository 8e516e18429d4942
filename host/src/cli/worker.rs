//! `pushonce worker`: run dispatcher workers (a development sender until channel plugins land).

/// Arguments of `pushonce worker`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `pushonce worker`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`pushonce worker` is not built yet")
}
