//! Docs that cannot go stale: what README.md, ARCHITECTURE.md and docs/*.md
//! show is checked against the repository and the real binary.
//!
//! - every repository path they name (in backticks or as a link) exists;
//! - every `pushonce` command in them (code blocks, and inline code that
//!   starts with `pushonce `) names subcommands and flags the binary accepts
//!   (`<target>/debug/pushonce <subcommand…> --help`);
//! - every TOML block parses through the real configuration types
//!   (`HostConfig`, or `PolicyFile` for a policy), which refuse unknown keys;
//! - no tracked file cites anything outside the repository.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use pushonce::config::HostConfig;
use pushonce::route::policy::PolicyFile;
use pushonce_tests::host::repo_root;
use pushonce_tests::process::pushonce_bin;

/// The documents checked, relative to the root.
fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(&root).unwrap().to_path_buf())
        .collect();
    docs.sort();
    let mut all = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    all.extend(docs);
    all
}

/// A fenced code block: its language, text and first line.
struct Block {
    lang: String,
    text: String,
    line: usize,
}

/// The fenced blocks of a Markdown text, and the text outside them (the
/// lines inside replaced by empty ones, so line numbers stay).
fn split_blocks(text: &str) -> (Vec<Block>, String) {
    let mut blocks = Vec::new();
    let mut prose = String::new();
    let mut open: Option<Block> = None;
    for (n, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                open = Some(Block {
                    lang: line.trim_start().trim_start_matches('`').trim().to_string(),
                    text: String::new(),
                    line: n + 2,
                });
                prose.push('\n');
            }
            (Some(_), true) => {
                blocks.extend(open.take());
                prose.push('\n');
            }
            (Some(block), false) => {
                block.text.push_str(line);
                block.text.push('\n');
                prose.push('\n');
            }
            (None, false) => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    (blocks, prose)
}

/// Inline code spans of `prose`, with their line.
fn inline_spans(prose: &str) -> Vec<(String, usize)> {
    let mut spans = Vec::new();
    for (n, line) in prose.lines().enumerate() {
        let mut parts = line.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            spans.push((code.to_string(), n + 1));
        }
        // An odd trailing part (a span across lines) is not followed.
    }
    spans
}

/// Link targets `[text](target)` of `prose`, with their line.
fn links(prose: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (n, line) in prose.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((after[..end].to_string(), n + 1));
            rest = &after[end..];
        }
    }
    out
}

/// The top-level entries a path must start with to be taken for a
/// repository path (generated directories excluded).
fn top_level() -> Vec<String> {
    std::fs::read_dir(repo_root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !["target", "data", ".git"].contains(&n.as_str()))
        .collect()
}

/// `span` as a repository path to check, if it is one: a relative path
/// starting with a top-level entry, without placeholders or globs; a line
/// number (`:12`) or an item (`::f`, `#anchor`) after it is dropped.
fn repo_path(span: &str, top: &[String]) -> Option<String> {
    let span = span.trim();
    if span.is_empty()
        || span.contains(char::is_whitespace)
        || span.contains(['*', '<', '>', '{', '}', '$', '…', '|', '[', '(', '='])
        || span.contains("...")
    {
        return None;
    }
    let mut path = span.split("::").next()?.split('#').next()?;
    if let Some((head, tail)) = path.rsplit_once(':')
        && tail.chars().all(|c| c.is_ascii_digit() || c == '-')
    {
        path = head;
    }
    let first = path.split('/').next()?;
    if !top.iter().any(|t| t == first) || (!path.contains('/') && !path.contains('.')) {
        return None;
    }
    Some(path.trim_end_matches('/').to_string())
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let root = repo_root();
    let top = top_level();
    let mut missing = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        let (_, prose) = split_blocks(&text);
        for (span, line) in inline_spans(&prose) {
            if let Some(path) = repo_path(&span, &top)
                && !root.join(&path).exists()
            {
                missing.push(format!("{}:{line}: `{path}`", doc.display()));
            }
        }
        for (target, line) in links(&prose) {
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let target = target.split('#').next().unwrap_or_default();
            let dir = root.join(&doc).parent().unwrap().to_path_buf();
            let resolved = normalize(&dir.join(target));
            if !resolved.starts_with(&root) {
                missing.push(format!(
                    "{}:{line}: link ({target}) leads outside the repository",
                    doc.display()
                ));
            } else if !resolved.exists() {
                missing.push(format!(
                    "{}:{line}: link ({target}) is missing",
                    doc.display()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths named in the docs that do not exist:\n{}",
        missing.join("\n")
    );
}

/// `path` with `.` and `..` resolved lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn no_tracked_file_cites_anything_outside_the_repository() {
    let root = repo_root();
    let files = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files");
    assert!(files.status.success(), "git ls-files failed");
    // Spelt in pieces so this file does not cite them.
    let needles = [concat!("../", "shared"), concat!("FACTS", ".md")];
    let mut cited = Vec::new();
    for file in files.stdout.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let file = String::from_utf8_lossy(file).into_owned();
        let Ok(text) = std::fs::read_to_string(root.join(&file)) else {
            continue; // binary, or deleted in the work tree
        };
        for (n, line) in text.lines().enumerate() {
            for needle in needles {
                if line.contains(needle) {
                    cited.push(format!("{file}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        cited.is_empty(),
        "files citing what is outside the repository:\n{}",
        cited.join("\n")
    );
}

/// `pushonce <chain> --help`, cached: the subcommands and the flags it lists.
struct Cli {
    bin: PathBuf,
    helps: HashMap<Vec<String>, Option<(Vec<String>, String)>>,
}

impl Cli {
    /// The subcommand names and the help text of `chain`; `None` when the
    /// binary refuses the chain.
    fn help(&mut self, chain: &[String]) -> Option<(Vec<String>, String)> {
        if let Some(known) = self.helps.get(chain) {
            return known.clone();
        }
        let out = Command::new(&self.bin)
            .args(chain)
            .arg("--help")
            .output()
            .expect("running pushonce");
        let answer = out.status.success().then(|| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut subs = Vec::new();
            let mut in_commands = false;
            for line in text.lines() {
                if line.starts_with("Commands:") {
                    in_commands = true;
                } else if !line.starts_with(' ') {
                    in_commands = false;
                } else if in_commands && let Some(word) = line.split_whitespace().next() {
                    subs.push(word.trim_end_matches(',').to_string());
                }
            }
            (subs, text)
        });
        self.helps.insert(chain.to_vec(), answer.clone());
        answer
    }

    /// Why the binary would not accept `args` (what follows `pushonce`).
    fn refusal(&mut self, args: &[String]) -> Option<String> {
        let mut chain: Vec<String> = Vec::new();
        let shown = |chain: &[String]| {
            std::iter::once("pushonce")
                .chain(chain.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut rest = args;
        loop {
            let (subs, _) = self.help(&chain)?;
            match rest.first() {
                Some(word) if subs.contains(word) => {
                    chain.push(word.clone());
                    rest = &rest[1..];
                }
                Some(word) if !subs.is_empty() && !word.starts_with('-') => {
                    return Some(format!(
                        "`{word}` is not a subcommand of `{}`",
                        shown(&chain)
                    ));
                }
                None if !subs.is_empty() => {
                    return Some(format!("`{}` needs a subcommand", shown(&chain)));
                }
                _ => break,
            }
        }
        let (_, text) = self.help(&chain)?;
        for arg in rest.iter().filter(|a| a.starts_with("--") && a.len() > 2) {
            let flag = arg.split('=').next().unwrap_or(arg);
            let known = text
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .any(|word| word == flag);
            if !known {
                return Some(format!("`{}` has no flag {flag}", shown(&chain)));
            }
        }
        None
    }
}

/// The arguments after `pushonce` of each command in `line`: segments
/// split at `&&`, `||`, `;` and `|`, each either `[VAR=x …] [sudo]
/// [path/]pushonce args…` or `cargo run … --bin pushonce -- args…`.
fn pushonce_commands(line: &str) -> Vec<Vec<String>> {
    let line = line.split(" #").next().unwrap_or_default();
    let mut commands = Vec::new();
    for segment in line
        .split("&&")
        .flat_map(|s| s.split("||"))
        .flat_map(|s| s.split(';'))
        .flat_map(|s| s.split('|'))
    {
        let words: Vec<&str> = segment.split_whitespace().collect();
        let mut i = 0;
        while i < words.len()
            && (words[i] == "$"
                || words[i] == "sudo"
                || (words[i].contains('=') && !words[i].starts_with('-')))
        {
            i += 1;
        }
        let start = if words
            .get(i)
            .is_some_and(|w| *w == "pushonce" || w.ends_with("/pushonce"))
        {
            i + 1
        } else if let Some(bin) = words.windows(2).position(|w| w == ["--bin", "pushonce"]) {
            match words[bin..].iter().position(|w| *w == "--") {
                Some(dash) => bin + dash + 1,
                None => continue,
            }
        } else {
            continue;
        };
        let args: Vec<String> = words[start..]
            .iter()
            .take_while(|w| {
                !w.starts_with('>') && !w.starts_with("2>") && !w.starts_with('<') && **w != "&"
            })
            .map(|w| w.trim_matches(['"', '\'']).to_string())
            .collect();
        commands.push(args);
    }
    commands
}

/// Inline code starting with `pushonce ` that is what the binary prints,
/// not a command.
const OUTPUTS: &[&str] = &["pushonce listening on"];

#[test]
fn every_pushonce_command_the_docs_show_is_accepted_by_the_binary() {
    let root = repo_root();
    let mut cli = Cli {
        bin: pushonce_bin().unwrap(),
        helps: HashMap::new(),
    };
    let mut refused = Vec::new();
    let mut seen = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        let (blocks, prose) = split_blocks(&text);
        let mut lines: Vec<(String, usize)> = Vec::new();
        for block in blocks
            .iter()
            .filter(|b| ["", "sh", "bash", "shell", "console"].contains(&b.lang.as_str()))
        {
            let mut joined = String::new();
            let mut first = block.line;
            for (n, line) in block.text.lines().enumerate() {
                if joined.is_empty() {
                    first = block.line + n;
                }
                match line.strip_suffix('\\') {
                    Some(part) => joined.push_str(part),
                    None => {
                        joined.push_str(line);
                        lines.push((std::mem::take(&mut joined), first));
                    }
                }
            }
        }
        lines.extend(inline_spans(&prose).into_iter().filter(|(span, _)| {
            span.starts_with("pushonce ") && !OUTPUTS.iter().any(|o| span.starts_with(o))
        }));
        for (line, n) in lines {
            for args in pushonce_commands(&line) {
                seen += 1;
                if let Some(why) = cli.refusal(&args) {
                    refused.push(format!("{}:{n}: `{}`: {why}", doc.display(), line.trim()));
                }
            }
        }
    }
    assert!(
        seen >= 10,
        "only {seen} pushonce commands found in the docs"
    );
    assert!(
        refused.is_empty(),
        "commands in the docs the binary does not accept:\n{}",
        refused.join("\n")
    );
}

/// The sections of a TOML block, split at comment lines naming a file
/// (`# pushonce.toml`, `# policies/x.toml`, `# plugins/…/Cargo.toml`):
/// (the file named, or `None`, text).
fn toml_sections(text: &str) -> Vec<(Option<String>, String)> {
    let mut sections = vec![(None, String::new())];
    for line in text.lines() {
        let named = line
            .strip_prefix("# ")
            .and_then(|rest| rest.split_whitespace().next())
            .filter(|w| w.ends_with(".toml"));
        match named {
            Some(file) => sections.push((Some(file.to_string()), String::new())),
            None => {
                let last = sections.last_mut().expect("one section at least");
                last.1.push_str(line);
                last.1.push('\n');
            }
        }
    }
    sections.retain(|(_, text)| !text.trim().is_empty());
    sections
}

/// What a TOML section is.
#[derive(Debug, PartialEq)]
enum Kind {
    Host,
    Policy,
    /// A Cargo manifest, a plugin's test cases or a channel script.
    Other,
}

fn kind(file: Option<&str>, text: &str) -> Kind {
    let top_key = |key: &str| {
        text.lines()
            .any(|l| l.starts_with(key) && l[key.len()..].trim_start().starts_with('='))
    };
    match file {
        Some("pushonce.toml") => Kind::Host,
        Some(f) if f.starts_with("policies/") => Kind::Policy,
        Some(_) => Kind::Other,
        None if text.contains("[[case]]") || text.contains("[package]") => Kind::Other,
        None if top_key("biz_type") || top_key("key_policy") => Kind::Policy,
        None => Kind::Host,
    }
}

#[test]
fn every_toml_block_the_docs_show_parses_as_its_file() {
    let root = repo_root();
    let mut refused = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        let (blocks, _) = split_blocks(&text);
        for block in blocks.iter().filter(|b| b.lang == "toml") {
            for (file, section) in toml_sections(&block.text) {
                let at = PathBuf::from(format!("{}:{}", doc.display(), block.line));
                let error = match kind(file.as_deref(), &section) {
                    Kind::Host => HostConfig::parse(&at, &section)
                        .err()
                        .map(|e| e.to_string()),
                    Kind::Policy => {
                        // A fragment: the required keys it leaves out, first.
                        let mut full = String::new();
                        for (key, value) in [
                            ("biz_type", "\"DOC_EXAMPLE\""),
                            ("key_policy", "\"per-event@^1\""),
                            (
                                "channels",
                                "[\"sms\", \"wechat\", \"app-push\", \"apns\", \"webhook\", \"inbox\"]",
                            ),
                            ("window", "\"24h\""),
                        ] {
                            if !section.lines().any(|l| l.starts_with(key)) {
                                full.push_str(&format!("{key} = {value}\n"));
                            }
                        }
                        full.push_str(&section);
                        PolicyFile::parse(&at, &full).err().map(|e| e.to_string())
                    }
                    Kind::Other => continue,
                };
                checked += 1;
                if let Some(e) = error {
                    refused.push(format!("{}: {e}", at.display()));
                }
            }
        }
    }
    assert!(checked >= 5, "only {checked} TOML blocks checked");
    assert!(
        refused.is_empty(),
        "TOML blocks in the docs the configuration types refuse:\n{}",
        refused.join("\n")
    );
}

#[test]
fn the_readers_of_the_docs_find_what_they_look_for() {
    // The helpers themselves, on small inputs.
    let top = vec!["host".to_string(), "README.md".to_string()];
    assert_eq!(
        repo_path("host/src/config.rs:12", &top).as_deref(),
        Some("host/src/config.rs")
    );
    assert_eq!(
        repo_path("host/src/permit/lua/", &top).as_deref(),
        Some("host/src/permit/lua")
    );
    assert_eq!(
        repo_path("README.md#status", &top).as_deref(),
        Some("README.md")
    );
    assert_eq!(repo_path("host/migrations/{sqlite,postgres}/", &top), None);
    assert_eq!(repo_path("permit/held.rs", &top), None);
    assert_eq!(
        pushonce_commands("PUSHONCE_X=1 ./target/debug/pushonce keys --event e.json | jq . # x"),
        vec![vec!["keys".to_string(), "--event".into(), "e.json".into()]]
    );
    assert_eq!(
        pushonce_commands("cargo run --bin pushonce -- serve > log"),
        vec![vec!["serve".to_string()]]
    );
    assert!(pushonce_commands("pushonce.toml is read").is_empty());
    let sections =
        toml_sections("# policies/a.toml\ntz = \"+08:00\"\n\n# pushonce.toml\n[caps.m]\nmax = 2\n");
    assert_eq!(sections.len(), 2);
    assert_eq!(kind(sections[0].0.as_deref(), &sections[0].1), Kind::Policy);
    assert_eq!(kind(sections[1].0.as_deref(), &sections[1].1), Kind::Host);
}
