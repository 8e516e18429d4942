//! `PluginRegistry`: loads plugin files, refuses bad ones with a reason, and
//! resolves requirements like `per-user-per-day@^1.2` to the highest matching
//! version.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use semver::{Version, VersionReq};
use wasmtime::Store;
use wasmtime::component::Component;

use super::bindings::{self, CHANNEL_EXPORT, CHANNEL_V1_EXPORT, KEY_POLICY_EXPORT, PluginInfo};
use super::cache::{self, CacheOutcome};
use super::channel::ChannelPlugin;
use super::error::{LoadError, ResolveError};
use super::key_policy::KeyPolicyPlugin;
use super::limits::Limits;
use super::runtime::PluginRuntime;
use super::state::HostState;
use super::{LoadStats, Plugin, PluginMeta, World};

/// Every loaded plugin by world, name and version.
pub struct PluginRegistry {
    /// Engine, linkers, limits.
    runtime: Arc<PluginRuntime>,
    /// Where compiled plugins are cached; `None` compiles every time.
    cache_dir: Option<PathBuf>,
    /// Key-policy plugins: name → version → plugin.
    key_policies: BTreeMap<String, BTreeMap<Version, Arc<KeyPolicyPlugin>>>,
    /// Channel plugins: name → version → plugin.
    channels: BTreeMap<String, BTreeMap<Version, Arc<ChannelPlugin>>>,
    /// Which file registered each `name@version`, for duplicate messages.
    files: HashMap<String, PathBuf>,
    /// How many components were compiled vs loaded from the cache.
    stats: LoadStats,
}

impl PluginRegistry {
    /// An empty registry with a new runtime for `limits`.
    pub fn new(limits: &Limits, cache_dir: Option<&Path>) -> Result<Self, LoadError> {
        Ok(Self::with_runtime(PluginRuntime::new(limits)?, cache_dir))
    }

    /// An empty registry sharing `runtime` (and its engine).
    pub fn with_runtime(runtime: Arc<PluginRuntime>, cache_dir: Option<&Path>) -> Self {
        Self {
            runtime,
            cache_dir: cache_dir.map(Path::to_path_buf),
            key_policies: BTreeMap::new(),
            channels: BTreeMap::new(),
            files: HashMap::new(),
            stats: LoadStats::default(),
        }
    }

    /// Loads every `*.wasm` in `dir` (in file-name order). Files that cannot
    /// be loaded are returned as refusals: the caller decides whether one is
    /// fatal. Only an unreadable directory or engine failure is an `Err`.
    pub fn load_dir(
        dir: &Path,
        limits: &Limits,
        cache_dir: Option<&Path>,
    ) -> Result<(Self, Vec<LoadError>), LoadError> {
        Self::load_dir_with(PluginRuntime::new(limits)?, dir, cache_dir)
    }

    /// [`PluginRegistry::load_dir`] on `runtime`: its engine and instance
    /// pool serve this registry beside any other built on it (a reload
    /// reuses the running host's, so no engine is reserved per reload).
    pub fn load_dir_with(
        runtime: Arc<PluginRuntime>,
        dir: &Path,
        cache_dir: Option<&Path>,
    ) -> Result<(Self, Vec<LoadError>), LoadError> {
        let mut registry = Self::with_runtime(runtime, cache_dir);
        let refused = registry.add_dir(dir)?;
        Ok((registry, refused))
    }

    /// Adds every `*.wasm` in `dir` to this registry; returns the refusals.
    pub(crate) fn add_dir(&mut self, dir: &Path) -> Result<Vec<LoadError>, LoadError> {
        let dir_error = |source| LoadError::Dir {
            dir: dir.to_path_buf(),
            source,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(dir_error)? {
            let path = entry.map_err(dir_error)?.path();
            // Not `is_file()`: a FIFO or a link to a device is refused by
            // name when read, not skipped silently.
            if path.extension().is_some_and(|e| e == "wasm") && !path.is_dir() {
                files.push(path);
            }
        }
        files.sort();
        Ok(files
            .iter()
            .filter_map(|f| self.load_file(f).err())
            .collect())
    }

    /// Loads one plugin file and registers it under `name@version`.
    pub fn load_file(&mut self, file: &Path) -> Result<Plugin, LoadError> {
        let started = Instant::now();
        let file_buf = file.to_path_buf();
        let max = self.runtime.limits().max_file_bytes;
        let bytes =
            crate::files::read_regular_file(file, max).map_err(|source| LoadError::Read {
                file: file_buf.clone(),
                source,
            })?;
        check_header(file, &bytes)?;
        let sha256 = cache::sha256_hex(&bytes);
        let (component, outcome) = cache::load_component(
            self.runtime.engine(),
            self.runtime.fingerprint(),
            &bytes,
            &sha256,
            self.cache_dir.as_deref(),
        )
        .map_err(|e| LoadError::Invalid {
            file: file_buf.clone(),
            reason: format!("{e:#}"),
        })?;
        match outcome {
            CacheOutcome::Compiled => self.stats.compiled += 1,
            CacheOutcome::FromCache => self.stats.from_cache += 1,
        }
        let world = detect_world(self.runtime.engine(), file, &component)?;
        let meta = PluginMeta {
            id: String::new(),
            name: String::new(),
            version: Version::new(0, 0, 0),
            description: String::new(),
            world,
            file: file_buf.clone(),
            size: bytes.len() as u64,
            sha256,
            cache: outcome,
            load_time: started.elapsed(),
        };
        let plugin = match world {
            World::KeyPolicy => self.key_policy_plugin(file, &component, meta, started)?,
            World::Channel => self.channel_plugin(file, &component, meta, started)?,
        };
        self.register(&plugin);
        Ok(plugin)
    }

    /// A key policy component, linked, described and ready to instantiate.
    fn key_policy_plugin(
        &self,
        file: &Path,
        component: &Component,
        mut meta: PluginMeta,
        started: Instant,
    ) -> Result<Plugin, LoadError> {
        let mismatch = mismatch(file, meta.world);
        let mut linker = self.runtime.key_linker.clone();
        super::state::stub_other_imports(&mut linker, component, &[])
            .map_err(|e| mismatch(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(component)
            .and_then(bindings::key_policy::KeyPolicyPluginPre::new)
            .map_err(|e| mismatch(format!("{e:#}")))?;
        let info = self.describe(file, |store| {
            pre.instantiate(&mut *store)?.call_describe(&mut *store)
        })?;
        self.fill_meta(&mut meta, info)?;
        meta.load_time = started.elapsed();
        Ok(Plugin::KeyPolicy(Arc::new(KeyPolicyPlugin::new(
            meta,
            self.runtime.clone(),
            pre,
        ))))
    }

    /// A channel component, linked, described and ready to instantiate.
    fn channel_plugin(
        &self,
        file: &Path,
        component: &Component,
        mut meta: PluginMeta,
        started: Instant,
    ) -> Result<Plugin, LoadError> {
        let mismatch = mismatch(file, meta.world);
        let mut linker = self.runtime.channel_linker.clone();
        super::state::stub_other_imports(
            &mut linker,
            component,
            super::state::CHANNEL_EXTRA_INTERFACES,
        )
        .map_err(|e| mismatch(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(component)
            .and_then(bindings::channel::ChannelPluginPre::new)
            .map_err(|e| mismatch(format!("{e:#}")))?;
        // Channel exports are async; `describe` is polled on this thread
        // (no runtime needed, none nested), within the load timeout: a
        // plugin may wait on a clock there, and fuel does not run out while
        // it waits.
        let plugin = ChannelPlugin::new(meta.clone(), self.runtime.clone(), pre)
            .map_err(|e| mismatch(format!("{e:#}")))?;
        let load_timeout = self.runtime.limits().load_timeout;
        let info = self.describe(file, |store| {
            super::channel::block_on_within(
                async {
                    // Instantiating type-checks the optional exports too.
                    let exports = plugin.instantiate(&mut *store).await?;
                    let info = exports.describe(&mut *store).await?;
                    Ok(PluginInfo {
                        name: info.name,
                        version: info.version,
                        description: info.description,
                    })
                },
                load_timeout,
            )
        })?;
        self.fill_meta(&mut meta, info)?;
        meta.load_time = started.elapsed();
        Ok(Plugin::Channel(Arc::new(plugin.with_meta(meta))))
    }

    /// Runs `describe` in a fresh store under the call limits.
    fn describe(
        &self,
        file: &Path,
        call: impl FnOnce(&mut Store<HostState>) -> wasmtime::Result<PluginInfo>,
    ) -> Result<PluginInfo, LoadError> {
        let limits = self.runtime.limits();
        let mut store = Store::new(
            self.runtime.engine(),
            HostState::new(limits, HashMap::new()),
        );
        store.limiter(|s| &mut s.limiter);
        let result = store
            .set_fuel(limits.fuel_per_call)
            .and_then(|()| call(&mut store));
        result.map_err(|e| LoadError::Describe {
            file: file.to_path_buf(),
            reason: match e.downcast_ref::<super::channel::LoadTimedOut>() {
                Some(timed_out) => format!(
                    "{timed_out} (it waits at load; a plugin must describe itself without waiting)"
                ),
                None => super::call::classify("(describe)", e, store.data(), limits.fuel_per_call)
                    .to_string()
                    .replacen("plugin (describe) ", "", 1),
            },
        })
    }

    /// Checks `describe`'s answer and the uniqueness of `name@version`.
    fn fill_meta(&self, meta: &mut PluginMeta, info: PluginInfo) -> Result<(), LoadError> {
        let bad = |what: String| LoadError::BadInfo {
            file: meta.file.clone(),
            what,
        };
        if !valid_name(&info.name) {
            return Err(bad(format!(
                "an invalid name `{}` (expected 1..=64 of [a-z0-9-], like `per-event`)",
                info.name.escape_debug()
            )));
        }
        let version = Version::parse(&info.version).map_err(|e| {
            bad(format!(
                "an invalid version `{}` ({e}; expected semver like `1.2.0`)",
                info.version.escape_debug()
            ))
        })?;
        let id = format!("{}@{version}", info.name);
        if let Some(first) = self.files.get(&id) {
            return Err(LoadError::Duplicate {
                file: meta.file.clone(),
                id,
                first: first.clone(),
            });
        }
        meta.id = id;
        meta.name = info.name;
        meta.version = version;
        meta.description = info.description;
        Ok(())
    }

    fn register(&mut self, plugin: &Plugin) {
        let meta = plugin.meta();
        self.files.insert(meta.id.clone(), meta.file.clone());
        match plugin {
            Plugin::KeyPolicy(p) => {
                self.key_policies
                    .entry(meta.name.clone())
                    .or_default()
                    .insert(meta.version.clone(), p.clone());
            }
            Plugin::Channel(p) => {
                self.channels
                    .entry(meta.name.clone())
                    .or_default()
                    .insert(meta.version.clone(), p.clone());
            }
        }
    }

    /// The highest loaded key-policy plugin matching `spec` (`name@req`, or
    /// just `name` for any version).
    pub fn resolve_key_policy(&self, spec: &str) -> Result<Arc<KeyPolicyPlugin>, ResolveError> {
        resolve(&self.key_policies, World::KeyPolicy, spec)
    }

    /// The highest loaded channel plugin matching `spec`.
    pub fn resolve_channel(&self, spec: &str) -> Result<Arc<ChannelPlugin>, ResolveError> {
        resolve(&self.channels, World::Channel, spec)
    }

    /// Every loaded plugin, by world, name and version.
    pub fn plugins(&self) -> Vec<Plugin> {
        let keys = self
            .key_policies
            .values()
            .flat_map(|v| v.values())
            .map(|p| Plugin::KeyPolicy(p.clone()));
        let channels = self
            .channels
            .values()
            .flat_map(|v| v.values())
            .map(|p| Plugin::Channel(p.clone()));
        keys.chain(channels).collect()
    }

    /// Compiled vs cached loads so far.
    pub fn stats(&self) -> LoadStats {
        self.stats
    }

    /// Whether `meta`'s channel plugin is loaded here: the same
    /// `name@version` from a file with the same SHA-256.
    pub(crate) fn holds_channel(&self, meta: &PluginMeta) -> bool {
        self.channels
            .get(&meta.name)
            .and_then(|versions| versions.get(&meta.version))
            .is_some_and(|p| p.meta().sha256 == meta.sha256)
    }

    /// The shared runtime.
    pub fn runtime(&self) -> &Arc<PluginRuntime> {
        &self.runtime
    }
}

/// Parses `name@req` and picks the highest matching version in `map`.
fn resolve<P>(
    map: &BTreeMap<String, BTreeMap<Version, Arc<P>>>,
    world: World,
    spec: &str,
) -> Result<Arc<P>, ResolveError> {
    let bad = |reason: String| ResolveError::BadSpec {
        spec: spec.to_string(),
        reason,
    };
    let (name, req_text) = match spec.split_once('@') {
        Some((name, req)) => (name.trim(), req.trim()),
        None => (spec.trim(), "*"),
    };
    if !valid_name(name) {
        return Err(bad(format!(
            "`{name}` is not a plugin name ([a-z0-9-], like `per-event`)"
        )));
    }
    let req = VersionReq::parse(req_text)
        .map_err(|e| bad(format!("`{req_text}` is not a semver requirement: {e}")))?;
    let Some(versions) = map.get(name) else {
        return Err(ResolveError::UnknownName {
            name: name.to_string(),
            world,
            known: map.keys().cloned().collect(),
        });
    };
    versions
        .iter()
        .rev()
        .find(|(v, _)| req.matches(v))
        .map(|(_, p)| p.clone())
        .ok_or_else(|| ResolveError::NoMatch {
            name: name.to_string(),
            req: req_text.to_string(),
            available: versions.keys().map(Version::to_string).collect(),
        })
}

/// `[a-z0-9]` words joined by single `-`, 1..=64 bytes.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.split('-').all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// Refuses files that are not WebAssembly, or are core modules.
fn check_header(file: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(LoadError::NotWasm {
            file: file.to_path_buf(),
        });
    }
    // Bytes 4..8: version and layer. Layer 0 is a core module, 1 a component.
    if bytes[6..8] == [0, 0] {
        return Err(LoadError::CoreModule {
            file: file.to_path_buf(),
        });
    }
    Ok(())
}

/// Which world a component exports, by its exported interface names.
fn detect_world(
    engine: &wasmtime::Engine,
    file: &Path,
    component: &Component,
) -> Result<World, LoadError> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    // `name@M.x` for any minor and patch of the export's major version `M`.
    let has = |export: &str| {
        let (prefix, version) = export.split_once('@').unwrap_or((export, ""));
        let major = version.split('.').next().unwrap_or("");
        exports
            .iter()
            .any(|e| e == export || e.starts_with(&format!("{prefix}@{major}.")))
    };
    if let Some(old) = exports
        .iter()
        .find(|e| e.starts_with(&format!("{CHANNEL_V1_EXPORT}@")))
    {
        return Err(LoadError::OldChannelContract {
            file: file.to_path_buf(),
            export: old.clone(),
        });
    }
    match (has(KEY_POLICY_EXPORT), has(CHANNEL_EXPORT)) {
        (true, false) => Ok(World::KeyPolicy),
        (false, true) => Ok(World::Channel),
        (true, true) => Err(LoadError::WrongWorld {
            file: file.to_path_buf(),
            exports: format!("{} (both worlds at once)", exports.join(", ")),
        }),
        (false, false) => Err(LoadError::WrongWorld {
            file: file.to_path_buf(),
            exports: if exports.is_empty() {
                "nothing".into()
            } else {
                exports.join(", ")
            },
        }),
    }
}

/// A load error for a component of `world` that does not fit it.
fn mismatch(file: &Path, world: World) -> impl Fn(String) -> LoadError {
    let file = file.to_path_buf();
    move |reason| LoadError::Mismatch {
        file: file.clone(),
        world,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::valid_name;

    #[test]
    fn names() {
        assert!(valid_name("per-event"));
        assert!(valid_name("v2"));
        assert!(!valid_name("Per-Event"));
        assert!(!valid_name("a--b"));
        assert!(!valid_name("-a"));
        assert!(!valid_name(""));
    }
}
