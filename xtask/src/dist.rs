//! `cargo xtask dist [--profile release|dev] [--out DIR]`: the release an
//! operator installs, built from one list of files ([`files`]) into two
//! artifacts in `target/dist/` (or `DIR`):
//!
//! - `pushonce-<version>-<target>.tar.gz`: one directory holding
//!   `bin/pushonce`, `plugins/*.wasm` (the key policies and provider
//!   channels of `plugins/`), `policies/*.toml` (the example policies),
//!   `pushonce.toml` (the production configuration, `dist/pushonce.toml`),
//!   `pushonce.env` (the secrets' template), `pushonce.service` (the systemd
//!   unit), `doc/` (README.md, ARCHITECTURE.md, BENCHMARKS.md, `docs/`) and
//!   `SHA256SUMS` of every other file;
//! - `pushonce_<version>_<arch>.deb`: the same files in their installed
//!   places (`/usr/bin`, `/usr/lib/pushonce/plugins`, `/etc/pushonce` as
//!   conffiles, `/lib/systemd/system`, `/usr/share/doc/pushonce`), built
//!   with `dpkg-deb --build` from a staged tree.
//!
//! and `SHA256SUMS` of both beside them.
//!
//! The .deb is built with `dpkg-deb`, not cargo-deb: installing cargo-deb
//! (`cargo install cargo-deb`, 3.8.0) took 130 s on this project's 2-core
//! machine, paid by every clean CI run, for a package whose layout this
//! file states in a dozen lines; `dpkg-deb` comes with every Debian system.
//!
//! `--profile release` (the default) builds `pushonce` with
//! `cargo build --release`; `--profile dev` packs the dev-profile binary the
//! tests use (the same build selection as `cargo xtask test`, so after the
//! tests nothing is compiled again) and compresses fast: CI's check of the
//! artifacts (`tests/it/dist.rs`), not a release.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{build_binaries, cargo_command, components, run, setup, target_dir};

/// The build profile of the packed binary.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Profile {
    Release,
    Dev,
}

/// One file of the release: where it comes from, its path in the archive,
/// its installed path in the package, its mode, whether dpkg keeps an
/// operator's changes to it on upgrade (a conffile).
struct File {
    source: PathBuf,
    archive: String,
    installed: String,
    mode: u32,
    conffile: bool,
}

/// `cargo xtask dist [--profile release|dev] [--out DIR]`.
pub(crate) fn dist(root: &Path, args: &[String]) -> Result<()> {
    let mut profile = Profile::Release;
    let mut out = target_dir(root).join("dist");
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--profile" => {
                profile = match args.next().map(String::as_str) {
                    Some("release") => Profile::Release,
                    Some("dev") | Some("debug") => Profile::Dev,
                    Some(other) => bail!("--profile takes release or dev, not {other:?}"),
                    None => bail!("--profile takes release or dev"),
                }
            }
            "--out" => {
                out = PathBuf::from(args.next().context("--out takes a directory")?);
            }
            other => bail!(
                "cargo xtask dist: unknown argument {other:?} (usage: cargo xtask dist [--profile release|dev] [--out DIR])"
            ),
        }
    }
    for program in ["tar", "gzip", "dpkg-deb", "sha256sum", "md5sum"] {
        if !crate::has_program(program) {
            bail!(
                "cargo xtask dist needs {program} (Debian: apt-get install dpkg coreutils tar gzip)"
            );
        }
    }
    setup::wasm_target()?;

    let bin = match profile {
        Profile::Release => {
            run(cargo_command().current_dir(root).args([
                "build",
                "--release",
                "-p",
                "pushonce",
                "--bin",
                "pushonce",
            ]))?;
            target_dir(root).join("release/pushonce")
        }
        Profile::Dev => {
            build_binaries(root)?;
            target_dir(root).join("debug/pushonce")
        }
    };
    let plugins = root.join("plugins");
    let wasm = components::wasm_dir(root);
    run(&mut components::release_build(&plugins, &wasm))?;

    let version = env!("CARGO_PKG_VERSION");
    let triple = host_triple()?;
    let name = format!("pushonce-{version}-{triple}");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;

    // The plugins as `cargo xtask plugins` copies them, into a fresh directory.
    let built = out.join(format!("{name}.plugins"));
    fresh_dir(&built)?;
    let n = components::copy_members(&plugins, &wasm, &built)?;
    if n == 0 {
        bail!("no plugin component was built in {}", wasm.display());
    }
    let files = files(root, &bin, &built)?;

    let date = source_date(root);
    let archive = archive(&out, &name, &files, profile, date)?;
    let deb = deb(root, &out, (version, &triple), &files, profile, date)?;
    std::fs::remove_dir_all(&built)?;
    let sums = sha256sums(&out, &[file_name(&archive)?, file_name(&deb)?])?;
    std::fs::write(out.join("SHA256SUMS"), sums)?;
    eprintln!(
        "xtask: {}\nxtask: {}\nxtask: {}",
        archive.display(),
        deb.display(),
        out.join("SHA256SUMS").display()
    );
    Ok(())
}

/// Every file of the release, sorted by its archive path.
fn files(root: &Path, bin: &Path, plugins: &Path) -> Result<Vec<File>> {
    let file = |source: PathBuf, archive: String, installed: String, mode, conffile| File {
        source,
        archive,
        installed,
        mode,
        conffile,
    };
    let dist = root.join("dist");
    let mut files = vec![
        file(
            bin.to_path_buf(),
            "bin/pushonce".into(),
            "usr/bin/pushonce".into(),
            0o755,
            false,
        ),
        file(
            dist.join("pushonce.toml"),
            "pushonce.toml".into(),
            "etc/pushonce/pushonce.toml".into(),
            0o644,
            true,
        ),
        // Secrets: readable by root only (systemd reads it for the unit).
        file(
            dist.join("pushonce.env"),
            "pushonce.env".into(),
            "etc/pushonce/pushonce.env".into(),
            0o600,
            true,
        ),
        file(
            dist.join("pushonce.service"),
            "pushonce.service".into(),
            "lib/systemd/system/pushonce.service".into(),
            0o644,
            false,
        ),
    ];
    for wasm in listed(plugins, "wasm")? {
        let name = file_name(&wasm)?;
        files.push(file(
            wasm,
            format!("plugins/{name}"),
            format!("usr/lib/pushonce/plugins/{name}"),
            0o644,
            false,
        ));
    }
    for policy in listed(&root.join("policies"), "toml")? {
        let name = file_name(&policy)?;
        files.push(file(
            policy,
            format!("policies/{name}"),
            format!("etc/pushonce/policies/{name}"),
            0o644,
            true,
        ));
    }
    // The docs keep the repository's layout, so their relative links hold.
    let mut docs = vec![
        PathBuf::from("README.md"),
        PathBuf::from("ARCHITECTURE.md"),
        PathBuf::from("BENCHMARKS.md"),
    ];
    walk(root, Path::new("docs"), &mut docs)?;
    for doc in docs {
        let rel = doc.to_str().context("a doc path is not UTF-8")?.to_string();
        files.push(file(
            root.join(&doc),
            format!("doc/{rel}"),
            format!("usr/share/doc/pushonce/{rel}"),
            0o644,
            false,
        ));
    }
    files.sort_by(|a, b| a.archive.cmp(&b.archive));
    Ok(files)
}

/// The `.ext` files of `dir`, sorted.
fn listed(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Every file below `root/rel`, as paths relative to `root`.
fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(rel))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for name in entries {
        let path = rel.join(name);
        if root.join(&path).is_dir() {
            walk(root, &path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Builds `<out>/<name>.tar.gz`: the files under `<name>/` at their archive
/// paths, plus `SHA256SUMS` of them.
fn archive(out: &Path, name: &str, files: &[File], profile: Profile, date: u64) -> Result<PathBuf> {
    let stage = out.join(format!("{name}.stage"));
    fresh_dir(&stage)?;
    let top = stage.join(name);
    for f in files {
        place(&f.source, &top.join(&f.archive), f.mode)?;
    }
    let listed: Vec<String> = files.iter().map(|f| f.archive.clone()).collect();
    let sums = sha256sums(&top, &listed)?;
    let sums_file = top.join("SHA256SUMS");
    std::fs::write(&sums_file, sums)?;
    set_mode(&sums_file, 0o644)?;
    let archive = out.join(format!("{name}.tar.gz"));
    let gzip = match profile {
        Profile::Release => "gzip -n -9",
        Profile::Dev => "gzip -n -1",
    };
    run(Command::new("tar")
        .arg("-C")
        .arg(&stage)
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            &format!("--mtime=@{date}"),
            &format!("--use-compress-program={gzip}"),
            "-cf",
        ])
        .arg(&archive)
        .arg(name))?;
    std::fs::remove_dir_all(&stage)?;
    Ok(archive)
}

/// Builds `<out>/pushonce_<version>_<arch>.deb` with `dpkg-deb --build`
/// from the files at their installed paths.
fn deb(
    root: &Path,
    out: &Path,
    (version, triple): (&str, &str),
    files: &[File],
    profile: Profile,
    date: u64,
) -> Result<PathBuf> {
    let arch = match triple.split('-').next() {
        Some("x86_64") => "amd64",
        Some("aarch64") => "arm64",
        _ => bail!("no Debian architecture known for {triple}"),
    };
    let stage = out.join(format!("pushonce_{version}_{arch}.stage"));
    fresh_dir(&stage)?;
    let mut bytes = 0;
    for f in files {
        place(&f.source, &stage.join(&f.installed), f.mode)?;
        bytes += std::fs::metadata(&f.source)?.len();
    }
    let debian = stage.join("DEBIAN");
    std::fs::create_dir_all(&debian)?;
    set_mode(&debian, 0o755)?;
    let control = format!(
        "Package: pushonce\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: pushonce maintainers <maintainers@pushonce.invalid>\n\
         Installed-Size: {}\n\
         Depends: libc6, libgcc-s1\n\
         Suggests: redis-server, postgresql\n\
         Section: net\n\
         Priority: optional\n\
         Description: push delivery exactly once per channel\n \
         pushonce takes business events over HTTP, derives an idempotency key per\n \
         channel with WebAssembly key-policy plugins, takes a permit in Redis,\n \
         claims each send in a SQL delivery ledger and delivers through provider\n \
         plugins (Aliyun SMS, WeChat, FCM, APNs, Standard Webhooks, an inbox).\n \
         .\n \
         Configuration: /etc/pushonce/pushonce.toml, secrets in\n \
         /etc/pushonce/pushonce.env; the unit: pushonce.service (not started on\n \
         install). Guide: /usr/share/doc/pushonce/docs/operations.md.\n",
        bytes.div_ceil(1024)
    );
    write_mode(&debian.join("control"), &control, 0o644)?;
    let conffiles: String = files
        .iter()
        .filter(|f| f.conffile)
        .map(|f| format!("/{}\n", f.installed))
        .collect();
    write_mode(&debian.join("conffiles"), &conffiles, 0o644)?;
    let installed: Vec<String> = files.iter().map(|f| f.installed.clone()).collect();
    let md5 = Command::new("md5sum")
        .current_dir(&stage)
        .arg("--")
        .args(&installed)
        .output()
        .context("running md5sum")?;
    if !md5.status.success() {
        bail!("md5sum failed: {}", String::from_utf8_lossy(&md5.stderr));
    }
    write_mode(
        &debian.join("md5sums"),
        &String::from_utf8(md5.stdout)?,
        0o644,
    )?;
    let scripts = root.join("dist/debian");
    for script in ["postinst", "prerm", "postrm"] {
        place(&scripts.join(script), &debian.join(script), 0o755)?;
    }
    let deb = out.join(format!("pushonce_{version}_{arch}.deb"));
    let compression: &[&str] = match profile {
        Profile::Release => &["-Zxz"],
        Profile::Dev => &["-Zgzip", "-z1"],
    };
    run(Command::new("dpkg-deb")
        .env("SOURCE_DATE_EPOCH", date.to_string())
        .args(["--root-owner-group", "--build"])
        .args(compression)
        .arg(&stage)
        .arg(&deb))?;
    std::fs::remove_dir_all(&stage)?;
    Ok(deb)
}

/// `sha256sum` lines of `names` (paths relative to `dir`).
fn sha256sums(dir: &Path, names: &[String]) -> Result<String> {
    let out = Command::new("sha256sum")
        .current_dir(dir)
        .arg("--")
        .args(names)
        .output()
        .context("running sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Copies `from` to `to` (making its directories, mode 0755) with `mode`.
fn place(from: &Path, to: &Path, mode: u32) -> Result<()> {
    let parent = to.parent().context("a staged file has a directory")?;
    std::fs::create_dir_all(parent)?;
    let mut dir = Some(parent);
    // The directories made here are world-readable whatever the umask.
    while let Some(d) = dir {
        if d.file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with(".stage"))
        {
            break;
        }
        set_mode(d, 0o755)?;
        dir = d.parent();
    }
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    set_mode(to, mode)
}

fn write_mode(path: &Path, text: &str, mode: u32) -> Result<()> {
    std::fs::write(path, text)?;
    set_mode(path, mode)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

/// An empty directory at `dir`.
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    set_mode(dir, 0o755)
}

fn file_name(path: &Path) -> Result<String> {
    Ok(path
        .file_name()
        .and_then(|n| n.to_str())
        .context("a file name that is not UTF-8")?
        .to_string())
}

/// The target triple `rustc` builds for by default (the host's).
fn host_triple() -> Result<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .with_context(|| format!("running {rustc} -vV"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("rustc -vV named no host")
}

/// The files' time in both artifacts: `SOURCE_DATE_EPOCH` when set (a
/// reproducible build), else the last commit's time, else now.
fn source_date(root: &Path) -> u64 {
    if let Some(t) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return t;
    }
    let commit = Command::new("git")
        .args(["log", "-1", "--format=%ct"])
        .current_dir(root)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok());
    commit.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    })
}
