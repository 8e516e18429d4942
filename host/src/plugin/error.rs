//! The plugin runtime's errors: why a file is refused (`LoadError`), why a
//! requirement does not resolve (`ResolveError`), why a call failed
//! (`CallError`). Messages name the file or the plugin (`name@version`) and
//! the cause in plain words; wasmtime's own errors are rendered with `{:#}`.

use std::path::PathBuf;

/// Why a plugin file was not loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", file.display())]
    Read {
        /// The plugin file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file does not start with the WebAssembly magic bytes.
    #[error("{}: is not WebAssembly (no `\\0asm` header)", file.display())]
    NotWasm {
        /// The plugin file.
        file: PathBuf,
    },
    /// The file is a core module: plugins must be components (`wasm32-wasip2`).
    #[error(
        "{}: is a core wasm module, not a component (build the plugin for `wasm32-wasip2`)",
        file.display()
    )]
    CoreModule {
        /// The plugin file.
        file: PathBuf,
    },
    /// wasmtime could not compile or validate the component.
    #[error("{}: is not a valid component: {reason}", file.display())]
    Invalid {
        /// The plugin file.
        file: PathBuf,
        /// wasmtime's explanation.
        reason: String,
    },
    /// The component exports neither the key-policy nor the channel interface.
    #[error(
        "{}: exports neither world: expected `{}` (key policy) or `{}` (channel); it exports: {exports}",
        file.display(), super::bindings::KEY_POLICY_EXPORT, super::bindings::CHANNEL_EXPORT
    )]
    WrongWorld {
        /// The plugin file.
        file: PathBuf,
        /// What the component does export, comma-separated.
        exports: String,
    },
    /// The component is a channel plugin of contract 1
    /// (`pushonce:plugin/channel@1.x`), which contract 2 replaced.
    #[error(
        "{}: channel contract 1.x ({export}) is no longer supported: rebuild the plugin against pushonce:channel@2 (`{}`) — see docs/channels.md",
        file.display(), super::bindings::CHANNEL_EXPORT
    )]
    OldChannelContract {
        /// The plugin file.
        file: PathBuf,
        /// The contract-1 export it has, e.g. `pushonce:plugin/channel@1.0.0`.
        export: String,
    },
    /// The component exports a world's interface but does not match it
    /// (other version, missing `describe`, wrong types, unknown imports).
    #[error("{}: does not fit the {world} world: {reason}", file.display())]
    Mismatch {
        /// The plugin file.
        file: PathBuf,
        /// The world it looked like.
        world: super::World,
        /// wasmtime's explanation.
        reason: String,
    },
    /// `describe` failed (trap, budget) when called at load time.
    #[error("{}: `describe` failed: {reason}", file.display())]
    Describe {
        /// The plugin file.
        file: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// `describe` returned a name or version the host does not accept.
    #[error("{}: describe() returned {what}", file.display())]
    BadInfo {
        /// The plugin file.
        file: PathBuf,
        /// What is wrong, e.g. "an invalid name `Per Event` (expected [a-z0-9-]+)".
        what: String,
    },
    /// Another file already registered the same `name@version`.
    #[error("{}: duplicate plugin {id}: already loaded from {}", file.display(), first.display())]
    Duplicate {
        /// The file refused.
        file: PathBuf,
        /// `name@version`.
        id: String,
        /// The file that registered it first.
        first: PathBuf,
    },
    /// The plugin directory could not be listed.
    #[error("plugin directory {}: {source}", dir.display())]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The wasmtime engine could not be built from the limits.
    #[error("cannot configure the plugin engine: {0}")]
    Engine(String),
}

impl LoadError {
    /// The file this refusal is about, if any.
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            LoadError::Read { file, .. }
            | LoadError::NotWasm { file }
            | LoadError::CoreModule { file }
            | LoadError::Invalid { file, .. }
            | LoadError::WrongWorld { file, .. }
            | LoadError::OldChannelContract { file, .. }
            | LoadError::Mismatch { file, .. }
            | LoadError::Describe { file, .. }
            | LoadError::BadInfo { file, .. }
            | LoadError::Duplicate { file, .. } => Some(file),
            LoadError::Dir { .. } | LoadError::Engine(_) => None,
        }
    }
}

/// Why a requirement like `per-user-per-day@^1.2` found no plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The requirement is not `NAME@REQ` with a semver requirement.
    #[error("`{spec}` is not a plugin requirement like `per-event@^1`: {reason}")]
    BadSpec {
        /// The requirement as given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// No plugin of that kind has this name.
    #[error(
        "no {world} plugin named `{name}` is loaded (known: {})",
        list_or_none(known)
    )]
    UnknownName {
        /// The name asked for.
        name: String,
        /// The world searched.
        world: super::World,
        /// Names that are loaded in that world.
        known: Vec<String>,
    },
    /// The name is known but no version matches.
    #[error(
        "no version of `{name}` matches `{req}` (available: {})",
        list_or_none(available)
    )]
    NoMatch {
        /// The name asked for.
        name: String,
        /// The semver requirement.
        req: String,
        /// Versions that are loaded.
        available: Vec<String>,
    },
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// Why one plugin call failed. The plugin's instance is dropped after any
/// variant but `Refused`; the next call gets a fresh one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The plugin ran and returned an error for this input.
    #[error("plugin {plugin} refused the input: {message}")]
    Refused {
        /// `name@version`.
        plugin: String,
        /// The plugin's message.
        message: String,
    },
    /// The call used up its fuel.
    #[error("plugin {plugin} ran out of its time budget (fuel: {fuel} units)")]
    OutOfFuel {
        /// `name@version`.
        plugin: String,
        /// The budget it had.
        fuel: u64,
    },
    /// The instance tried to grow its memory past the cap.
    #[error("plugin {plugin} exceeded its memory cap of {mib} MiB")]
    MemoryCap {
        /// `name@version`.
        plugin: String,
        /// The cap in MiB.
        mib: usize,
    },
    /// The guest trapped (a panic shows as `unreachable`, with its message).
    #[error("plugin {plugin} trapped: {cause}")]
    Trap {
        /// `name@version`.
        plugin: String,
        /// The trap in plain words, with the guest's panic message if any.
        cause: String,
    },
    /// The guest called a host function plugins may not use (clock, random, files...).
    #[error(
        "plugin {plugin} called `{import}`, which plugins may not use (no clock, randomness, files or network)"
    )]
    Forbidden {
        /// `name@version`.
        plugin: String,
        /// The import's name, e.g. `wasi:clocks/wall-clock@0.2.6#now`.
        import: String,
    },
    /// An async call (a channel send) ran past its wall-clock budget and was cut off.
    #[error("plugin {plugin} did not answer within {millis} ms")]
    TimedOut {
        /// `name@version`.
        plugin: String,
        /// The budget, in ms.
        millis: u64,
    },
    /// Every instance slot was taken (`plugin_limits.instances`, all plugins
    /// together): the call did not run; retrying later is safe.
    #[error(
        "plugin {plugin} found no free instance slot ({reason}): retry later, or raise `plugin_limits.instances`"
    )]
    Busy {
        /// `name@version`.
        plugin: String,
        /// wasmtime's explanation (the limit reached).
        reason: String,
    },
    /// The plugin answered with something the host does not keep (an
    /// identifier longer than its bound: `plugin::bounds`).
    #[error("plugin {plugin} returned a malformed answer: {what}")]
    Malformed {
        /// `name@version`.
        plugin: String,
        /// What is wrong with the answer.
        what: String,
    },
    /// A new instance could not be created.
    #[error("plugin {plugin} could not be instantiated: {reason}")]
    Instantiate {
        /// `name@version`.
        plugin: String,
        /// wasmtime's explanation.
        reason: String,
    },
}

impl CallError {
    /// The plugin (`name@version`) the error is about.
    pub fn plugin(&self) -> &str {
        match self {
            CallError::Refused { plugin, .. }
            | CallError::OutOfFuel { plugin, .. }
            | CallError::MemoryCap { plugin, .. }
            | CallError::Trap { plugin, .. }
            | CallError::Forbidden { plugin, .. }
            | CallError::TimedOut { plugin, .. }
            | CallError::Busy { plugin, .. }
            | CallError::Malformed { plugin, .. }
            | CallError::Instantiate { plugin, .. } => plugin,
        }
    }
}
