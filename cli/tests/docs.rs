//! The documentation in `docs/` against the code, so that it cannot go stale:
//! - every `mesos-gpu …` command line in a code span or block names subcommands that exist and
//!   flags that the subcommand's `--help` lists, and every subcommand is documented;
//! - every message quoted in a `Message` column of a table occurs in the source, as a string
//!   literal of a workspace crate (its `{…}` placeholders standing for any value, and `…` in the
//!   quote for any text).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (the parent of `cli/`).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli has a parent")
        .to_path_buf()
}

/// `(file name, text)` of every `docs/*.md`.
fn docs() -> Vec<(String, String)> {
    let dir = workspace().join("docs");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("docs/ exists") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            out.push((name, std::fs::read_to_string(&path).expect("read doc")));
        }
    }
    out.sort();
    assert!(
        out.iter().any(|(n, _)| n == "operator-guide.md"),
        "docs/operator-guide.md is missing"
    );
    out
}

/// The code in `line`: the whole line inside a fenced block, else its inline code spans
/// (`` `x` `` and ``` ``x`` ```).
fn code_segments(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            out.push((n + 1, line.to_owned()));
            continue;
        }
        out.extend(inline_spans(line).into_iter().map(|s| (n + 1, s)));
    }
    out
}

/// Inline code spans of one Markdown line.
fn inline_spans(line: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let after = &rest[start..];
        let ticks = after.len() - after.trim_start_matches('`').len();
        let fence = &after[..ticks];
        let body = &after[ticks..];
        let Some(end) = body.find(fence) else { break };
        spans.push(body[..end].trim().to_owned());
        rest = &body[end + ticks..];
    }
    spans
}

/// What `--help` says about one command path.
struct Help {
    subcommands: BTreeSet<String>,
    /// Long flags, with whether each takes a value.
    flags: BTreeMap<String, bool>,
}

/// The `--help` of `mesos-gpu <path>`, run once per path.
fn help<'a>(path: &[String], cache: &'a mut BTreeMap<Vec<String>, Help>) -> &'a Help {
    cache.entry(path.to_vec()).or_insert_with(|| {
        let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(path)
            .arg("--help")
            .env("MESOS_GPU_LOG", "error")
            .output()
            .expect("run mesos-gpu --help");
        assert!(
            out.status.success(),
            "mesos-gpu {} --help failed: {}",
            path.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        parse_help(&String::from_utf8(out.stdout).expect("utf-8 help"))
    })
}

fn parse_help(text: &str) -> Help {
    let mut subcommands = BTreeSet::new();
    let mut flags = BTreeMap::new();
    let mut in_commands = false;
    for line in text.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if !line.starts_with(' ') {
            in_commands = false;
        }
        let trimmed = line.trim_start();
        if in_commands
            && line.starts_with("  ")
            && !line.starts_with("   ")
            && let Some(name) = trimmed.split_whitespace().next()
        {
            subcommands.insert(name.to_owned());
        }
        // Option lines: `  -h, --help`, `      --listen <ADDR>`, `      --json`.
        let spec = trimmed.strip_prefix("-h, ").unwrap_or(trimmed);
        let spec = spec
            .split_once(", ")
            .filter(|(short, _)| short.len() == 2 && short.starts_with('-'))
            .map_or(spec, |(_, long)| long);
        if let Some(flag) = spec.strip_prefix("--") {
            let mut words = flag.split_whitespace();
            let name = words.next().unwrap_or("");
            let takes_value = words.next().is_some_and(|w| w.starts_with('<'));
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                flags.insert(format!("--{name}"), takes_value);
            }
        }
    }
    Help { subcommands, flags }
}

/// The arguments of each `mesos-gpu` invocation in `segment`: the words after a `mesos-gpu`
/// that starts a command (at the start, after `$(`, `|`, `&&`, `;`, `sudo`, env assignments,
/// or as `/usr/bin/mesos-gpu`), up to the end of that command.
fn invocations(segment: &str) -> Vec<Vec<String>> {
    let words: Vec<&str> = segment.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let word = word.trim_start_matches("$(");
        if word != "mesos-gpu" && word != "/usr/bin/mesos-gpu" {
            continue;
        }
        let starts_command = words[..i]
            .iter()
            .rev()
            .find(|w| !is_env_assignment(w))
            .is_none_or(|prev| {
                matches!(*prev, "$" | "#" | "|" | "&&" | ";" | "sudo" | "exec")
                    || prev.ends_with("$(")
                    || words[i].starts_with("$(")
            });
        if !starts_command {
            continue;
        }
        let mut args = Vec::new();
        for w in &words[i + 1..] {
            if matches!(*w, "|" | "&&" | ";" | "#" | "\\" | ">" | "2>") || w.starts_with('#') {
                break;
            }
            let ends = w.ends_with(')') && !w.contains('(');
            let w = w.trim_end_matches(')');
            if !w.is_empty() {
                args.push(w.to_owned());
            }
            if ends {
                break;
            }
        }
        out.push(args);
    }
    out
}

fn is_env_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    })
}

/// Checks one invocation against `--help`; returns the subcommand path it reached.
fn check_invocation(
    args: &[String],
    cache: &mut BTreeMap<Vec<String>, Help>,
) -> Result<Vec<String>, String> {
    let mut path: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            break; // the rest is the command run by `exec`
        }
        let h = help(&path, cache);
        if let Some(flag) = arg.strip_prefix("--") {
            let name = format!("--{}", flag.split('=').next().unwrap_or(""));
            match h.flags.get(&name) {
                None => {
                    return Err(format!("`mesos-gpu {}` has no flag {name}", path.join(" ")));
                }
                Some(true) if !arg.contains('=') => i += 1,
                Some(_) => {}
            }
        } else if !arg.starts_with('-') && !h.subcommands.is_empty() {
            // A command with subcommands takes no positional argument here.
            if !h.subcommands.contains(arg.as_str()) {
                return Err(format!(
                    "`mesos-gpu {}` has no subcommand {arg:?}",
                    path.join(" ")
                ));
            }
            path.push(arg.clone());
        }
        i += 1;
    }
    Ok(path)
}

#[test]
fn every_documented_command_and_flag_exists() {
    let mut cache = BTreeMap::new();
    let mut problems = Vec::new();
    let mut reached = BTreeSet::new();
    let mut checked = 0;
    for (name, text) in docs() {
        for (line, segment) in code_segments(&text) {
            for args in invocations(&segment) {
                checked += 1;
                match check_invocation(&args, &mut cache) {
                    Ok(path) => {
                        reached.insert(path.first().cloned().unwrap_or_default());
                    }
                    Err(why) => {
                        problems.push(format!("docs/{name}:{line}: {why} (in {segment:?})"))
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "stale commands in docs:\n{}",
        problems.join("\n")
    );
    assert!(
        checked >= 20,
        "only {checked} mesos-gpu command lines found in docs/"
    );
    let undocumented: Vec<_> = help(&[], &mut cache)
        .subcommands
        .iter()
        .filter(|s| *s != "help" && !reached.contains(*s))
        .collect();
    assert!(
        undocumented.is_empty(),
        "subcommands never shown in docs/ as `mesos-gpu <subcommand> …`: {undocumented:?}"
    );
}

/// Every string literal of the workspace's Rust sources (not tests), with continuation lines
/// joined and `{…}` placeholders replaced by [`HOLE`].
fn source_literals() -> Vec<String> {
    let root = workspace();
    let mut files = Vec::new();
    for krate in members() {
        if krate != "testkit" && krate != "examples" {
            collect_rs(&root.join(krate).join("src"), &mut files);
        }
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    files
        .iter()
        .flat_map(|f| string_literals(&std::fs::read_to_string(f).expect("read source")))
        .map(|lit| placeholders_to_holes(&lit))
        .collect()
}

/// The workspace's member directories, as the root `Cargo.toml` lists them.
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("Cargo.toml");
    let list = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("a members list");
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The contents of the `"…"` literals in Rust source, escapes resolved (`\n` and friends kept as
/// a space), `\` line continuations removed; comments and char literals skipped.
fn string_literals(src: &str) -> Vec<String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '/' if chars.get(i + 1) == Some(&'/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\'' => {
                // A char literal ('x', '\'', '"'); otherwise a lifetime.
                if chars.get(i + 1) == Some(&'\\') {
                    while i + 1 < chars.len() && chars[i + 1] != '\'' {
                        i += 1;
                    }
                    i += 2;
                    continue;
                } else if chars.get(i + 2) == Some(&'\'') {
                    i += 3;
                    continue;
                }
                i += 1;
            }
            '"' => {
                let mut lit = String::new();
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        match chars.get(i + 1) {
                            Some('\n') => {
                                i += 2;
                                while i < chars.len() && chars[i].is_whitespace() {
                                    i += 1;
                                }
                                continue;
                            }
                            Some(c @ ('"' | '\\' | '\'')) => lit.push(*c),
                            Some(_) => lit.push(' '),
                            None => {}
                        }
                        i += 2;
                    } else {
                        lit.push(chars[i]);
                        i += 1;
                    }
                }
                out.push(lit);
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// Stands for a `{…}` placeholder of a format string: any text.
const HOLE: char = '\u{1}';
/// Stands for `…` in a quoted message: any part of the literal.
const GAP: char = '\u{2}';

fn placeholders_to_holes(lit: &str) -> String {
    let mut out = String::new();
    let mut chars = lit.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                for inner in chars.by_ref() {
                    if inner == '}' {
                        break;
                    }
                }
                out.push(HOLE);
            }
            _ => out.push(c),
        }
    }
    out
}

/// Whether `quote` (with [`GAP`]s) is a rendering of the whole `pattern` (with [`HOLE`]s).
fn renders(pattern: &[char], quote: &[char]) -> bool {
    // reach[i][j]: pattern[..i] can produce quote[..j].
    let (p, q) = (pattern.len(), quote.len());
    let mut reach = vec![vec![false; q + 1]; p + 1];
    reach[0][0] = true;
    for i in 0..=p {
        for j in 0..=q {
            if !reach[i][j] {
                continue;
            }
            if i < p && pattern[i] == HOLE {
                reach[i + 1][j] = true; // the hole ends here
                if j < q {
                    reach[i][j + 1] = true; // the hole takes quote[j]
                }
            }
            if j < q && quote[j] == GAP {
                reach[i][j + 1] = true; // the gap ends here
                if i < p {
                    reach[i + 1][j] = true; // the gap takes pattern[i]
                }
            }
            if i < p && j < q && pattern[i] == quote[j] && pattern[i] != HOLE {
                reach[i + 1][j + 1] = true;
            }
        }
    }
    reach[p][q]
}

/// The code spans in the `Message` column of every table of `text`, with their line.
fn quoted_messages(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut column: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let Some(row) = line.trim().strip_prefix('|') else {
            column = None;
            continue;
        };
        let cells: Vec<&str> = row.split(" | ").map(str::trim).collect();
        if let Some(c) = cells
            .iter()
            .position(|c| c.trim_end_matches('|').trim() == "Message")
        {
            column = Some(c);
            continue;
        }
        let Some(c) = column else { continue };
        if row.starts_with("---") {
            continue;
        }
        let cell = cells.get(c).copied().unwrap_or("");
        out.extend(inline_spans(cell).into_iter().map(|s| (n + 1, s)));
    }
    out
}

#[test]
fn every_quoted_message_occurs_in_the_source() {
    let literals: Vec<Vec<char>> = source_literals()
        .into_iter()
        // A literal of placeholders only ("{}", "{path}: {e}") would match anything.
        .filter(|l| l.chars().filter(|&c| c != HOLE).count() >= 12)
        .map(|l| l.chars().collect())
        .collect();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (name, text) in docs() {
        for (line, message) in quoted_messages(&text) {
            checked += 1;
            let quote: Vec<char> = message.replace('…', &GAP.to_string()).chars().collect();
            let fixed = quote.iter().filter(|&&c| c != GAP).count();
            if fixed < 12 {
                problems.push(format!(
                    "docs/{name}:{line}: {message:?} is too short to check"
                ));
            } else if !literals.iter().any(|l| renders(l, &quote)) {
                problems.push(format!(
                    "docs/{name}:{line}: no source string produces {message:?}"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "stale messages in docs:\n{}",
        problems.join("\n")
    );
    assert!(
        checked >= 30,
        "only {checked} quoted messages found in docs/"
    );
}

#[test]
fn the_checkers_reject_what_they_should() {
    let pattern: Vec<char> =
        placeholders_to_holes("cannot allocate {requested} GPUs to {owner}: {free} free")
            .chars()
            .collect();
    let q = |s: &str| -> Vec<char> { s.replace('…', &GAP.to_string()).chars().collect() };
    assert!(renders(
        &pattern,
        &q("cannot allocate 4 GPUs to c1: 2 free")
    ));
    assert!(renders(&pattern, &q("cannot allocate … GPUs to …: … free")));
    assert!(renders(&pattern, &q("… GPUs to …")));
    assert!(!renders(
        &pattern,
        &q("cannot allocate 4 GPU to c1: 2 free")
    ));
    assert!(!renders(
        &pattern,
        &q("cannot allocate 4 GPUs to c1: 2 free, 1 unhealthy")
    ));

    let lits =
        string_literals("let c = '\"'; // a \"comment\"\nlet s = \"a \\\"b\\\" \\\n      c\";");
    assert_eq!(lits, ["a \"b\" c"]);
    assert_eq!(
        placeholders_to_holes("{{x}} {y:?}"),
        format!("{{x}} {HOLE}")
    );

    assert_eq!(
        invocations("docker run $(mesos-gpu docker-args --gpus 2) img"),
        [["docker-args", "--gpus", "2"]]
    );
    assert_eq!(
        invocations("MESOS_GPU_LOG=debug mesos-gpu info --json | jq ."),
        [["info", "--json"]]
    );
    assert!(invocations("systemctl status mesos-gpu").is_empty());
    assert!(invocations("journalctl -u mesos-gpu").is_empty());

    let mut cache = BTreeMap::new();
    let args = |s: &str| -> Vec<String> { s.split_whitespace().map(str::to_owned).collect() };
    assert!(
        check_invocation(
            &args("serve --listen 127.0.0.1:1 --volume-mode bind"),
            &mut cache
        )
        .is_ok()
    );
    assert!(check_invocation(&args("serve --no-such-flag"), &mut cache).is_err());
    assert!(check_invocation(&args("no-such-command"), &mut cache).is_err());
    assert_eq!(
        check_invocation(&args("--simulate dgx1-v100 volume gc --all"), &mut cache),
        Ok(vec!["volume".to_owned(), "gc".to_owned()])
    );
    assert!(check_invocation(&args("volume gc --copy"), &mut cache).is_err());
}

/// The text of `rel` in the workspace.
fn read(rel: &str) -> String {
    std::fs::read_to_string(workspace().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The body of the `## <title>` section of a Markdown text, up to the next `## `.
fn section<'a>(text: &'a str, title: &str) -> Option<&'a str> {
    let start = text.find(&format!("\n## {title}\n"))? + title.len() + 5;
    let rest = &text[start..];
    Some(rest.find("\n## ").map_or(rest, |end| &rest[..end]))
}

/// The rows of the first table whose header row starts with `| first |`, as trimmed cells.
fn table_rows(text: &str, first: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if !inside {
            inside = line.starts_with(&format!("| {first} |"));
            continue;
        }
        let Some(row) = line.strip_prefix('|') else {
            break;
        };
        if row.starts_with("---") {
            continue;
        }
        rows.push(
            row.trim_end_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect(),
        );
    }
    rows
}

/// Every document the project ships to operators.
fn shipped_docs() -> Vec<(String, String)> {
    let mut all = docs();
    for rel in ["README.md", "ffi/README.md"] {
        all.push((rel.to_owned(), read(rel)));
    }
    all
}

/// A sentence that sends the reader to a "Not done" list must name (in a code span) something
/// that list still holds: when the work is done and the list shrinks, the sentence goes stale
/// (as "the module does not start the health monitor yet" did).
#[test]
fn claims_of_unfinished_work_match_the_not_done_list() {
    let ffi = read("ffi/README.md");
    let not_done = section(&ffi, "Not done").expect("ffi/README.md has a Not done section");
    let mut problems = Vec::new();
    for (name, text) in shipped_docs() {
        if name == "ffi/README.md" {
            continue;
        }
        for sentence in text.split(". ") {
            if !sentence.contains("Not done") {
                continue;
            }
            let spans = inline_spans(&sentence.replace('\n', " "));
            let named = spans
                .iter()
                .filter(|s| !s.ends_with(".md"))
                .any(|s| not_done.contains(s.as_str()));
            if !named {
                problems.push(format!("{name}: {sentence:?}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "sentences citing \"Not done\" for work that list no longer holds:\n{}",
        problems.join("\n")
    );
}

/// The operator guide's module parameter table and `ffi/README.md`'s list the keys the module
/// accepts (`MODULE_KEYS` in `isolator/src/agent_flags/module_config.rs`, the one parser of
/// them), with the same defaults.
#[test]
fn module_parameter_tables_agree_with_the_code() {
    let rel = "isolator/src/agent_flags/module_config.rs";
    let params = read(rel);
    let keys_start = params
        .find("pub const MODULE_KEYS")
        .unwrap_or_else(|| panic!("MODULE_KEYS in {rel}"));
    let keys_end = keys_start + params[keys_start..].find("];").expect("end of MODULE_KEYS");
    let code: BTreeSet<String> = params[keys_start..keys_end]
        .lines()
        .flat_map(string_literals)
        .collect();
    let table = |rel: &str, text: &str| -> BTreeMap<String, String> {
        let rows = table_rows(text, "Key");
        assert!(!rows.is_empty(), "{rel}: no `| Key |` table");
        rows.into_iter()
            .map(|r| (r[0].trim_matches('`').to_owned(), r[1].clone()))
            .collect()
    };
    let guide = table("docs/operator-guide.md", &read("docs/operator-guide.md"));
    let ffi = table("ffi/README.md", &read("ffi/README.md"));
    let keys = |t: &BTreeMap<String, String>| t.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(keys(&guide), code, "operator guide vs MODULE_KEYS");
    assert_eq!(keys(&ffi), code, "ffi/README.md vs MODULE_KEYS");
    for (key, default) in &guide {
        assert_eq!(
            Some(default),
            ffi.get(key),
            "default of {key}: the operator guide and ffi/README.md differ"
        );
    }
}

/// Every `mesos_gpu_*` series the documents name is one the code registers, and the operator
/// guide's Metrics section names every series the code registers.
#[test]
fn documented_metrics_are_the_registered_ones() {
    let registered: BTreeSet<String> = string_literals(&read("docker-bridge/src/metrics.rs"))
        .into_iter()
        .filter(|l| {
            l.starts_with("mesos_gpu_") && l.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .collect();
    assert!(registered.len() >= 20, "{registered:?}");
    let names = |text: &str| -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (at, _) in text.match_indices("mesos_gpu_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // A metric, not a crate (`mesos_gpu_docker::…`) or a library file.
            let after = &text[at + name.len()..];
            if !after.starts_with("::") && !after.starts_with('.') && !name.ends_with('_') {
                out.insert(name.trim_end_matches("_total").to_owned());
            }
        }
        out
    };
    let crates = [
        "mesos_gpu_demo",
        "mesos_gpu_docker",
        "mesos_gpu_enforce",
        "mesos_gpu_grant",
        "mesos_gpu_health",
        "mesos_gpu_isolator",
        "mesos_gpu_module",
        "mesos_gpu_node",
        "mesos_gpu_os",
        "mesos_gpu_placement",
        "mesos_gpu_pool",
        "mesos_gpu_testkit",
        "mesos_gpu_volume",
    ];
    let mut unknown = Vec::new();
    for (name, text) in shipped_docs() {
        for metric in names(&text) {
            if !registered.contains(&metric) && !crates.contains(&metric.as_str()) {
                unknown.push(format!("{name}: {metric}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "documented but never registered:\n{}",
        unknown.join("\n")
    );
    let guide = read("docs/operator-guide.md");
    let metrics = section(&guide, "Metrics").expect("the operator guide has a Metrics section");
    let documented = names(metrics);
    let missing: Vec<&String> = registered.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "registered but not in the guide's Metrics section: {missing:?}"
    );
}

/// The `serve` options the guide quotes are those of `/etc/default/mesos-gpu`, each of them
/// `mesos-gpu serve --help`'s default but the volume root, which every shipped file sets to
/// `/var/lib/mesos-gpu/volumes` (the guide says why; `doctor`'s tests check that they agree).
#[test]
fn documented_serve_defaults_are_the_real_ones() {
    let guide = read("docs/operator-guide.md");
    let quoted = guide
        .lines()
        .find(|l| l.starts_with("mesos-gpu serve --listen"))
        .expect("the guide quotes the service's options");
    let options = read("examples/default/mesos-gpu");
    let shipped = options
        .lines()
        .find_map(|l| l.strip_prefix("MESOS_GPU_SERVE_OPTS=\""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("MESOS_GPU_SERVE_OPTS");
    assert_eq!(
        quoted.strip_prefix("mesos-gpu serve ").unwrap(),
        shipped,
        "the guide and /etc/default/mesos-gpu differ"
    );
    let help = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["serve", "--help"])
        .output()
        .expect("serve --help");
    let help = String::from_utf8(help.stdout).unwrap();
    let words: Vec<&str> = shipped.split_whitespace().collect();
    for pair in words.chunks(2) {
        let [flag, value] = pair else {
            panic!("not --flag value pairs: {shipped}");
        };
        if [*flag, *value] == ["--volume-root", "/var/lib/mesos-gpu/volumes"] {
            continue;
        }
        // clap prints `--flag <VALUE>` … `[default: value]` in the flag's paragraph.
        let at = help
            .find(&format!("{flag} <"))
            .unwrap_or_else(|| panic!("{flag} is not a serve flag"));
        let paragraph = &help[at..];
        let end = paragraph[2..]
            .find("\n  -")
            .map_or(paragraph.len(), |e| e + 2);
        assert!(
            paragraph[..end].contains(&format!("[default: {value}]")),
            "{flag}: the documented default {value} is not serve's:\n{}",
            &paragraph[..end]
        );
    }
}

/// Issue 37: the README's workspace table lists every workspace member, by directory and by
/// package name (it lacked six crates).
#[test]
fn readme_workspace_table_lists_every_member() {
    let readme = read("README.md");
    let workspace_section =
        section(&readme, "Workspace").expect("README.md has a Workspace section");
    let rows = table_rows(workspace_section, "crate");
    assert!(
        !rows.is_empty(),
        "no `| crate |` table:\n{workspace_section}"
    );
    let listed: BTreeMap<String, String> = rows
        .iter()
        .map(|row| {
            let cell = |i: usize| row.get(i).map_or("", |c| c.trim_matches('`')).to_owned();
            (cell(0).trim_end_matches('/').to_owned(), cell(1))
        })
        .collect();
    for member in members() {
        let manifest = read(&format!("{member}/Cargo.toml"));
        let package = manifest
            .lines()
            .find_map(|l| l.strip_prefix("name = "))
            .map(|n| n.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| panic!("{member}/Cargo.toml names no package"));
        assert_eq!(
            listed.get(&member),
            Some(&package),
            "README.md's workspace table: member {member}/ (package {package}) is missing or \
             misnamed"
        );
    }
    assert_eq!(
        listed.len(),
        members().len(),
        "README.md's workspace table lists a directory that is not a member: {listed:?}"
    );
}

/// Issue 37: the `--isolation` the guide's table gives for cgroup v1 and v2 is what
/// `agent-flags` prints for each (the v2 row had `cgroups/devices`-era flags), and the v2 row
/// names the other flag `agent-flags` adds there.
#[test]
fn guides_isolation_rows_are_what_agent_flags_prints() {
    let guide = read("docs/operator-guide.md");
    let rows = table_rows(&guide, "Host");
    for (host, cgroups) in [("cgroup v1 (recommended)", "v1"), ("cgroup v2", "v2")] {
        let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args([
                "--simulate",
                "dgx1-v100",
                "agent-flags",
                "--cgroups",
                cgroups,
            ])
            .env("MESOS_GPU_LOG", "warn")
            .output()
            .expect("agent-flags");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let flags = String::from_utf8(out.stdout).unwrap();
        let isolation = flags
            .lines()
            .find_map(|l| l.strip_prefix("--isolation="))
            .unwrap_or_else(|| panic!("agent-flags --cgroups {cgroups} prints no --isolation"));
        let row = rows
            .iter()
            .find(|r| r[0] == host)
            .unwrap_or_else(|| panic!("the guide's --isolation table has no row {host:?}"));
        let documented = inline_spans(&row[1]);
        assert_eq!(
            documented.first().map(String::as_str),
            Some(isolation),
            "the guide's {host} --isolation is not what agent-flags --cgroups {cgroups} prints"
        );
        for extra in flags
            .lines()
            .filter(|l| l.starts_with("--agent_subsystems"))
        {
            let flag = extra.split('=').next().unwrap_or(extra);
            assert!(
                row[1].contains(&format!("`{flag}=")),
                "agent-flags --cgroups {cgroups} prints {extra}; the guide's {host} row does \
                 not name it: {}",
                row[1]
            );
        }
    }
}

/// Issue 37: every source file of this workspace the shipped documents name in a code span
/// exists (the XID table was said to be in `isolator/src/health/xid.rs` after it moved to
/// `health/src/xid.rs`).
#[test]
fn documented_source_paths_exist() {
    let members = members();
    let mut missing = Vec::new();
    for (name, text) in shipped_docs() {
        for (line, code) in code_segments(&text) {
            for word in code.split(|c: char| c.is_whitespace() || "`(),;:".contains(c)) {
                let word = word.trim_end_matches('.');
                let in_member = members.iter().any(|m| word.starts_with(&format!("{m}/")));
                if in_member && word.ends_with(".rs") && !workspace().join(word).exists() {
                    missing.push(format!("{name}:{line}: {word}"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "documented files that do not exist:\n{}",
        missing.join("\n")
    );
}

/// Issue 37: no shipped document says a GPU is never shared between containers, which the
/// guide's sharing section (`--gpu-replicas`, MPS, time-slicing) contradicts.
#[test]
fn no_document_says_gpus_are_never_shared() {
    let guide = read("docs/operator-guide.md");
    assert!(
        guide.contains("## Sharing a GPU between tasks"),
        "the guide has a sharing section"
    );
    let mut docs = shipped_docs();
    docs.push((
        "examples/mesos-agent/README.md".to_owned(),
        read("examples/mesos-agent/README.md"),
    ));
    for (name, text) in docs {
        let flat = text
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase();
        assert!(
            !flat.contains("never shared") && !flat.contains("never share a gpu"),
            "{name} says a GPU is never shared; the guide's sharing section says how it is"
        );
    }
}
