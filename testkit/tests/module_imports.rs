//! Within each crate of the workspace, module imports form no cycle (issue 35 item 5).
//!
//! A crate's modules are found from its roots (`src/lib.rs`, `src/main.rs`, each
//! `src/bin/*.rs` and `src/bin/*/main.rs`) by following `mod name;`. Module `a` depends on
//! module `b` when `a` holds `b` (declares it) or when one of `a`'s own `use` items at module
//! level (`use crate::…`, `use super::…`, `use self::…`, or a path starting with a child module)
//! names `b` or an item of `b`: the path is read up to the deepest module it names. A use of an
//! ancestor's items (`use super::Error`) is no dependency: a module's children are part of it.
//! A cycle of such dependencies fails the test, naming each step.
//!
//! The parse is textual and relies on rustfmt's layout: items at module level start in column
//! 0, those of inline modules (`mod tests { … }`) are indented and so left out.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A module's path below its crate root (`["config", "validate"]` for `crate::config::validate`).
type ModPath = Vec<String>;

/// Why module `from` depends on module `to`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Link {
    /// `from` declares `to` (`mod to;`).
    Holds,
    /// `from` has `use <path>` naming `to`.
    Uses(String),
}

/// A crate's modules, each with its file, and the dependencies between them.
struct Crate {
    root: PathBuf,
    modules: BTreeMap<ModPath, PathBuf>,
    links: BTreeMap<ModPath, BTreeMap<ModPath, Link>>,
}

/// A cycle: each module with the link to the next, the last linking back to the first.
struct Cycle {
    root: PathBuf,
    steps: Vec<(ModPath, Link)>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}:", self.root.display())?;
        for (n, (from, link)) in self.steps.iter().enumerate() {
            let to = &self.steps[(n + 1) % self.steps.len()].0;
            match link {
                Link::Holds => writeln!(f, "  {} holds {}", name(from), name(to))?,
                Link::Uses(path) => {
                    writeln!(f, "  {} imports {} (use {path})", name(from), name(to))?
                }
            }
        }
        Ok(())
    }
}

fn name(path: &ModPath) -> String {
    std::iter::once("crate")
        .chain(path.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

/// `src` without comments (string literals are not told apart: a `//` in one only cuts a line
/// that is no `use` or `mod` item anyway).
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i + 2..]
            .split_once("*/")
            .map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The item at the start of `line` after any visibility (`pub`, `pub(crate)`, …).
fn after_visibility(line: &str) -> &str {
    let Some(rest) = line.strip_prefix("pub") else {
        return line;
    };
    let rest = match rest.strip_prefix('(') {
        Some(r) => r.split_once(')').map_or(r, |(_, after)| after),
        None => rest,
    };
    rest.trim_start()
}

/// The modules `src` declares at module level (`mod name;`).
fn declared_modules(src: &str) -> Vec<String> {
    src.lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .filter_map(|l| after_visibility(l).strip_prefix("mod "))
        .filter_map(|l| l.trim().strip_suffix(';'))
        .map(|n| n.trim().to_owned())
        .collect()
}

/// The trees of the `use` items of `src` at module level (`crate::a::{b, c}`).
fn use_trees(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = src.lines();
    while let Some(line) = lines.next() {
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let Some(start) = after_visibility(line).strip_prefix("use ") else {
            continue;
        };
        let mut item = start.to_owned();
        while !item.contains(';') {
            let Some(next) = lines.next() else { break };
            item.push_str(next);
        }
        out.push(item.split(';').next().unwrap_or_default().to_owned());
    }
    out
}

/// Every path of a use tree: `a::{b, c::{d, e}}` gives `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<Vec<String>> {
    let tree = tree.trim();
    let segments = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|seg| {
                seg.split(" as ")
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            })
            .filter(|seg| !seg.is_empty())
            .collect()
    };
    let (Some(open), Some(close)) = (tree.find('{'), tree.rfind('}')) else {
        return vec![segments(tree)];
    };
    let prefix = segments(&tree[..open]);
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, open + 1);
    for (i, c) in tree.char_indices().take(close).skip(open + 1) {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&tree[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..close]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|rest| prefix.iter().cloned().chain(rest).collect())
        .collect()
}

/// The deepest module of `modules` that `path`, used in module `from`, names; `None` for a
/// path outside the crate.
fn resolve(
    modules: &BTreeMap<ModPath, PathBuf>,
    from: &ModPath,
    path: &[String],
) -> Option<ModPath> {
    let (mut at, rest): (ModPath, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (from.clone(), &path[1..]),
        Some("super") => {
            let mut at = from.clone();
            let supers = path.iter().take_while(|s| *s == "super").count();
            at.truncate(at.len().saturating_sub(supers));
            (at, &path[supers..])
        }
        Some(first) => {
            let child: ModPath = from.iter().cloned().chain([first.to_owned()]).collect();
            if !modules.contains_key(&child) {
                return None;
            }
            (from.clone(), path)
        }
        None => return None,
    };
    for segment in rest {
        at.push(segment.clone());
        if !modules.contains_key(&at) {
            at.pop();
            break;
        }
    }
    Some(at)
}

/// The file of module `name` declared in `file` (`name.rs` or `name/mod.rs`, beside `file`
/// when it owns its directory, else in the directory named for it).
fn child_file(file: &Path, name: &str) -> Option<PathBuf> {
    let dir = file.parent()?;
    let owns_dir = matches!(
        file.file_name().and_then(|n| n.to_str()),
        Some("lib.rs" | "main.rs" | "mod.rs")
    );
    let dir = if owns_dir {
        dir.to_owned()
    } else {
        dir.join(file.file_stem()?)
    };
    [
        dir.join(format!("{name}.rs")),
        dir.join(name).join("mod.rs"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

impl Crate {
    /// Reads the crate rooted at `root`: its modules and the links between them.
    fn read(root: &Path) -> Crate {
        let mut modules = BTreeMap::new();
        let mut sources = BTreeMap::new();
        let mut todo = vec![(ModPath::new(), root.to_owned())];
        while let Some((path, file)) = todo.pop() {
            let src = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
            let src = strip_comments(&src);
            for child in declared_modules(&src) {
                if let Some(f) = child_file(&file, &child) {
                    todo.push((path.iter().cloned().chain([child]).collect(), f));
                }
            }
            modules.insert(path.clone(), file);
            sources.insert(path, src);
        }
        let mut links: BTreeMap<ModPath, BTreeMap<ModPath, Link>> = BTreeMap::new();
        for path in modules.keys() {
            if let Some((_, parent)) = path.split_last() {
                links
                    .entry(parent.to_vec())
                    .or_default()
                    .insert(path.clone(), Link::Holds);
            }
        }
        for (from, src) in &sources {
            for tree in use_trees(src) {
                for path in expand(&tree) {
                    let Some(to) = resolve(&modules, from, &path) else {
                        continue;
                    };
                    // A module's own items, or an ancestor's: no dependency.
                    if from.starts_with(&to) {
                        continue;
                    }
                    links
                        .entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_insert_with(|| Link::Uses(path.join("::")));
                }
            }
        }
        Crate {
            root: root.to_owned(),
            modules,
            links,
        }
    }

    /// The first cycle a depth-first walk meets, in module order.
    fn cycle(&self) -> Option<Cycle> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            Open,
            Done,
        }
        let mut marks: BTreeMap<&ModPath, Mark> = BTreeMap::new();
        for start in self.modules.keys() {
            if marks.contains_key(start) {
                continue;
            }
            // The walk's stack: each module with the links still to follow.
            let mut stack: Vec<(&ModPath, Vec<(&ModPath, &Link)>)> =
                vec![(start, self.next(start))];
            marks.insert(start, Mark::Open);
            while let Some((at, todo)) = stack.last_mut() {
                let at = *at;
                let Some((to, _)) = todo.pop() else {
                    marks.insert(at, Mark::Done);
                    stack.pop();
                    continue;
                };
                match marks.get(to) {
                    Some(Mark::Done) => {}
                    Some(Mark::Open) => {
                        let from = stack.iter().position(|(m, _)| *m == to).unwrap_or(0);
                        let mods: Vec<&ModPath> = stack[from..].iter().map(|(m, _)| *m).collect();
                        let steps = mods
                            .iter()
                            .enumerate()
                            .map(|(n, m)| {
                                let next = mods[(n + 1) % mods.len()];
                                ((*m).clone(), self.links[*m][next].clone())
                            })
                            .collect();
                        return Some(Cycle {
                            root: self.root.clone(),
                            steps,
                        });
                    }
                    None => {
                        marks.insert(to, Mark::Open);
                        stack.push((to, self.next(to)));
                    }
                }
            }
        }
        None
    }

    /// The links out of `module`, the first in module order last (walked first).
    fn next(&self, module: &ModPath) -> Vec<(&ModPath, &Link)> {
        self.links
            .get(module)
            .map(|l| l.iter().rev().collect())
            .unwrap_or_default()
    }
}

/// Every crate root of every workspace member under `workspace`.
fn crate_roots(workspace: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let mut members: Vec<PathBuf> = std::fs::read_dir(workspace)
        .expect("the workspace directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .collect();
    members.sort();
    for member in members {
        let src = member.join("src");
        roots.extend(
            ["lib.rs", "main.rs"]
                .into_iter()
                .map(|f| src.join(f))
                .filter(|p| p.is_file()),
        );
        let Ok(bins) = std::fs::read_dir(src.join("bin")) else {
            continue;
        };
        let mut bins: Vec<PathBuf> = bins.flatten().map(|e| e.path()).collect();
        bins.sort();
        for bin in bins {
            if bin.extension().is_some_and(|e| e == "rs") {
                roots.push(bin);
            } else if bin.join("main.rs").is_file() {
                roots.push(bin.join("main.rs"));
            }
        }
    }
    roots
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit sits in the workspace");
    let roots = crate_roots(workspace);
    assert!(roots.len() > 10, "too few crate roots found: {roots:?}");
    let cycles: Vec<String> = roots
        .iter()
        .filter_map(|root| Crate::read(root).cycle())
        .map(|c| {
            c.to_string()
                .replace(&format!("{}/", workspace.display()), "")
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "module imports form a cycle:\n{}",
        cycles.concat()
    );
}

/// Writes `files` (path, text) under a fresh directory and reads the crate rooted at its
/// `lib.rs`.
fn crate_of(files: &[(&str, &str)]) -> (tempfile::TempDir, Crate) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a directory");
        std::fs::write(&path, text).expect("a file");
    }
    let krate = Crate::read(&dir.path().join("lib.rs"));
    (dir, krate)
}

#[test]
fn a_cycle_through_a_child_module_is_named_step_by_step() {
    let (_dir, krate) = crate_of(&[
        ("lib.rs", "mod api;\nmod config;\nmod state;\n"),
        (
            "api/mod.rs",
            "use crate::state::{self, Sim};\npub(crate) const NAMES: &[&str] = &[];\n",
        ),
        ("state.rs", "use crate::config;\n"),
        ("config/mod.rs", "mod validate;\n"),
        (
            "config/validate.rs",
            "use super::ConfigError;\nuse crate::api::{\n    NAMES,\n};\n",
        ),
    ]);
    let cycle = krate.cycle().expect("a cycle").to_string();
    assert!(
        cycle.ends_with(
            "  crate::api imports crate::state (use crate::state::self)\n  \
             crate::state imports crate::config (use crate::config)\n  \
             crate::config holds crate::config::validate\n  \
             crate::config::validate imports crate::api (use crate::api::NAMES)\n"
        ),
        "{cycle}"
    );
}

#[test]
fn children_using_their_parent_and_tests_modules_are_no_cycle() {
    let (_dir, krate) = crate_of(&[
        ("lib.rs", "pub mod a;\nmod b;\npub use a::Thing;\n"),
        (
            "a/mod.rs",
            "mod inner;\npub use inner::Thing;\npub struct Error;\n",
        ),
        (
            "a/inner.rs",
            "use super::Error;\nuse crate::b;\npub struct Thing;\n",
        ),
        (
            "b.rs",
            "// use crate::a;\n/* use crate::a::inner; */\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n",
        ),
    ]);
    assert!(
        krate.cycle().is_none(),
        "{}",
        krate.cycle().map(|c| c.to_string()).unwrap_or_default()
    );
}
