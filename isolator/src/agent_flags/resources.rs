//! A parser for the Mesos agent's `--resources` flag, enough to find and rewrite its `gpus`.
//!
//! Mesos accepts two forms (`Resources::parse` in `src/common/resources.cpp`):
//! - text: `name(role):value;name:value;…`, tokens split on `;` (empty tokens skipped), each
//!   split on `:` into exactly a name (optionally followed by `(role)`) and a value. A value is
//!   a scalar (`4`, `0.5`), ranges (`[31000-32000,33000-33010]`) or a set (`{a,b}`). Negative,
//!   NaN and infinite scalars are invalid resources.
//! - JSON: an array of `Resource` objects, e.g.
//!   `[{"name":"gpus","type":"SCALAR","scalar":{"value":2},"role":"*"}]`.
//!
//! Mesos drops zero-valued scalars while parsing, which is why upstream detects an explicit
//! `gpus:0` with a substring test. This parser keeps every entry, so `gpus:0` is seen as given
//! and `mygpus:0` is not mistaken for it (`docs/reference/mesos-gpu-isolator.md` §2 step 5).

use std::fmt;

/// The resource name Mesos gives GPUs.
pub const GPUS: &str = "gpus";

/// Why a `--resources` value is malformed.
#[derive(Debug, thiserror::Error)]
pub enum ResourcesError {
    /// A `;`-separated token is not `name:value`.
    #[error("--resources entry {token:?}: expected name:value or name(role):value")]
    NotNameValue {
        /// The offending token.
        token: String,
    },
    /// A `(role)` is unbalanced or empty.
    #[error(
        "--resources entry {token:?}: bad role, expected name(role):value with a non-empty role"
    )]
    BadRole {
        /// The offending token.
        token: String,
    },
    /// The name is empty.
    #[error("--resources entry {token:?}: empty resource name")]
    EmptyName {
        /// The offending token.
        token: String,
    },
    /// A value is neither a scalar, ranges nor a set.
    #[error(
        "--resources {name}={value:?}: expected a number (4, 0.5), ranges ([31000-32000]) or a set ({{a,b}})"
    )]
    BadValue {
        /// Resource name.
        name: String,
        /// The value as written.
        value: String,
    },
    /// A scalar is negative, NaN or infinite.
    #[error("--resources {name}={value}: a scalar resource must be a finite number of at least 0")]
    BadScalar {
        /// Resource name.
        name: String,
        /// The value as written.
        value: String,
    },
    /// The JSON form did not parse.
    #[error("--resources is not a valid JSON array of Resource objects")]
    Json {
        /// The JSON parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// A JSON entry lacks a field this parser needs.
    #[error("--resources JSON entry {position}: {problem}")]
    JsonEntry {
        /// 0-based position in the array.
        position: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// `gpus` is given as ranges or a set.
    #[error("--resources {GPUS}={value}: the '{GPUS}' resource must be a scalar (e.g. gpus:2)")]
    GpusNotScalar {
        /// The value as written.
        value: String,
    },
}

/// The value of one resource entry.
#[derive(Debug, Clone, PartialEq)]
pub enum ResourceValue {
    /// A non-negative finite number.
    Scalar(f64),
    /// Ranges or a set, kept as written (spaces removed); only `gpus` is interpreted here.
    Other(String),
}

impl fmt::Display for ResourceValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResourceValue::Scalar(v) => write!(f, "{v}"),
            ResourceValue::Other(s) => f.write_str(s),
        }
    }
}

/// One entry of `--resources`.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// Resource name, e.g. `cpus`, `gpus`.
    pub name: String,
    /// The role in `name(role):value`; `None` means the default role.
    pub role: Option<String>,
    /// The value.
    pub value: ResourceValue,
    raw: Raw,
}

#[derive(Debug, Clone, PartialEq)]
enum Raw {
    Text,
    Json(serde_json::Value),
}

impl Resource {
    fn render_text(&self) -> String {
        match &self.role {
            Some(role) => format!("{}({role}):{}", self.name, self.value),
            None => format!("{}:{}", self.name, self.value),
        }
    }
}

/// A parsed `--resources` value, in the form it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    json: bool,
    entries: Vec<Resource>,
}

/// The total of the `gpus` entries of `--resources`, when there is at least one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpusGiven {
    /// Sum over every `gpus` entry (all roles), as Mesos's `Resources::gpus()` adds them.
    pub total: f64,
}

impl Resources {
    /// Parses the text or JSON form of `--resources`.
    pub fn parse(text: &str) -> Result<Self, ResourcesError> {
        let trimmed = text.trim();
        let resources = if trimmed.starts_with('[') {
            parse_json(trimmed)?
        } else {
            parse_text(trimmed)?
        };
        for r in &resources.entries {
            if r.name == GPUS
                && let ResourceValue::Other(value) = &r.value
            {
                return Err(ResourcesError::GpusNotScalar {
                    value: value.clone(),
                });
            }
        }
        Ok(resources)
    }

    /// Text-form resources holding only `gpus:n` (nothing when `n` is `None`).
    pub(crate) fn only_gpus(n: Option<u32>) -> Resources {
        Resources {
            json: false,
            entries: n
                .map(|n| Resource {
                    name: GPUS.to_owned(),
                    role: None,
                    value: ResourceValue::Scalar(f64::from(n)),
                    raw: Raw::Text,
                })
                .into_iter()
                .collect(),
        }
    }

    /// Every entry, in the order given.
    pub fn entries(&self) -> &[Resource] {
        &self.entries
    }

    /// The `gpus` total, or `None` when no entry is named `gpus`.
    pub fn gpus(&self) -> Option<GpusGiven> {
        let mut total = None;
        for r in self.entries.iter().filter(|r| r.name == GPUS) {
            if let ResourceValue::Scalar(v) = r.value {
                total = Some(total.unwrap_or(0.0) + v);
            }
        }
        total.map(|total| GpusGiven { total })
    }

    /// Renders the entries in the form they were given, with every `gpus` entry removed and, when
    /// `gpus` is `Some(n)`, one `gpus:n` in the default role appended.
    pub(crate) fn render_with_gpus(&self, gpus: Option<u32>) -> String {
        let kept = self.entries.iter().filter(|r| r.name != GPUS);
        if self.json {
            let mut items: Vec<serde_json::Value> = kept.map(json_of).collect();
            if let Some(n) = gpus {
                items.push(
                    serde_json::json!({"name": GPUS, "type": "SCALAR", "scalar": {"value": n}}),
                );
            }
            serde_json::Value::Array(items).to_string()
        } else {
            let mut items: Vec<String> = kept.map(Resource::render_text).collect();
            if let Some(n) = gpus {
                items.push(format!("{GPUS}:{n}"));
            }
            items.join(";")
        }
    }

    /// Renders the entries in the form they were given, with every `gpus` entry and every entry
    /// named in `scalars` removed, then each of `scalars` appended as `name:value` in the
    /// default role.
    pub fn render_with_scalars(&self, scalars: &[(String, u32)]) -> String {
        let kept = self
            .entries
            .iter()
            .filter(|r| r.name != GPUS && !scalars.iter().any(|(name, _)| *name == r.name));
        if self.json {
            let mut items: Vec<serde_json::Value> = kept.map(json_of).collect();
            items.extend(scalars.iter().map(|(name, n)| {
                serde_json::json!({"name": name, "type": "SCALAR", "scalar": {"value": n}})
            }));
            serde_json::Value::Array(items).to_string()
        } else {
            let mut items: Vec<String> = kept.map(Resource::render_text).collect();
            items.extend(scalars.iter().map(|(name, n)| format!("{name}:{n}")));
            items.join(";")
        }
    }

    /// Renders every entry as given (normalised spacing), in the form it was written.
    pub fn render(&self) -> String {
        if self.json {
            serde_json::Value::Array(self.entries.iter().map(json_of).collect()).to_string()
        } else {
            self.entries
                .iter()
                .map(Resource::render_text)
                .collect::<Vec<_>>()
                .join(";")
        }
    }
}

fn json_of(r: &Resource) -> serde_json::Value {
    match &r.raw {
        Raw::Json(v) => v.clone(),
        Raw::Text => serde_json::Value::String(r.render_text()),
    }
}

fn parse_text(text: &str) -> Result<Resources, ResourcesError> {
    let mut entries = Vec::new();
    for token in text.split(';').map(str::trim).filter(|t| !t.is_empty()) {
        let parts: Vec<&str> = token.split(':').collect();
        let [head, value] = parts.as_slice() else {
            return Err(ResourcesError::NotNameValue {
                token: token.to_owned(),
            });
        };
        let (name, role) = match head.find('(') {
            None => {
                if head.contains(')') {
                    return Err(ResourcesError::BadRole {
                        token: token.to_owned(),
                    });
                }
                (head.trim(), None)
            }
            Some(open) => {
                let close = head
                    .rfind(')')
                    .filter(|&c| c > open && head[c + 1..].trim().is_empty());
                let Some(close) = close else {
                    return Err(ResourcesError::BadRole {
                        token: token.to_owned(),
                    });
                };
                let role = head[open + 1..close].trim();
                if role.is_empty() || role.contains(['(', ')']) {
                    return Err(ResourcesError::BadRole {
                        token: token.to_owned(),
                    });
                }
                (head[..open].trim(), Some(role.to_owned()))
            }
        };
        if name.is_empty() {
            return Err(ResourcesError::EmptyName {
                token: token.to_owned(),
            });
        }
        let value = parse_value(name, value)?;
        entries.push(Resource {
            name: name.to_owned(),
            role,
            value,
            raw: Raw::Text,
        });
    }
    Ok(Resources {
        json: false,
        entries,
    })
}

/// Parses one value as Mesos's `values::parse` does: spaces removed, then ranges, set or scalar.
fn parse_value(name: &str, value: &str) -> Result<ResourceValue, ResourcesError> {
    let compact: String = value.chars().filter(|c| !c.is_whitespace()).collect();
    let bad = || ResourcesError::BadValue {
        name: name.to_owned(),
        value: value.trim().to_owned(),
    };
    if let Some(inner) = compact.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or_else(bad)?;
        for range in inner.split(',') {
            let (lo, hi) = range.split_once('-').ok_or_else(bad)?;
            let (lo, hi): (u64, u64) = (
                lo.parse().map_err(|_| bad())?,
                hi.parse().map_err(|_| bad())?,
            );
            if lo > hi {
                return Err(bad());
            }
        }
        return Ok(ResourceValue::Other(compact));
    }
    if let Some(inner) = compact.strip_prefix('{') {
        let inner = inner.strip_suffix('}').ok_or_else(bad)?;
        if inner.split(',').any(str::is_empty) {
            return Err(bad());
        }
        return Ok(ResourceValue::Other(compact));
    }
    if compact.is_empty() || compact.contains(['[', ']', '{', '}', ',']) {
        return Err(bad());
    }
    let v: f64 = compact.parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(ResourcesError::BadScalar {
            name: name.to_owned(),
            value: compact,
        });
    }
    // `-0` parses to -0.0, which compares equal to 0; normalise so it prints as `0`.
    Ok(ResourceValue::Scalar(v + 0.0))
}

fn parse_json(text: &str) -> Result<Resources, ResourcesError> {
    let items: Vec<serde_json::Value> =
        serde_json::from_str(text).map_err(|source| ResourcesError::Json { source })?;
    let mut entries = Vec::with_capacity(items.len());
    for (position, item) in items.into_iter().enumerate() {
        let problem = |problem: &str| ResourcesError::JsonEntry {
            position,
            problem: problem.to_owned(),
        };
        let name = item
            .get("name")
            .and_then(serde_json::Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| problem("expected a non-empty string \"name\""))?
            .to_owned();
        let role = item
            .get("reservations")
            .and_then(serde_json::Value::as_array)
            .and_then(|r| r.last())
            .or(Some(&item))
            .and_then(|r| r.get("role"))
            .and_then(serde_json::Value::as_str)
            .filter(|r| *r != "*")
            .map(str::to_owned);
        let kind = item
            .get("type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("SCALAR");
        let value = match kind {
            "SCALAR" => {
                let v = item
                    .get("scalar")
                    .and_then(|s| s.get("value"))
                    .and_then(serde_json::Value::as_f64)
                    .ok_or_else(|| problem("a SCALAR needs \"scalar\": {\"value\": <number>}"))?;
                if !v.is_finite() || v < 0.0 {
                    return Err(ResourcesError::BadScalar {
                        name,
                        value: v.to_string(),
                    });
                }
                ResourceValue::Scalar(v + 0.0)
            }
            "RANGES" | "SET" => ResourceValue::Other(
                item.get(kind.to_ascii_lowercase().as_str())
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            ),
            other => {
                return Err(problem(&format!(
                    "unknown type {other:?}: expected SCALAR, RANGES or SET"
                )));
            }
        };
        entries.push(Resource {
            name,
            role,
            value,
            raw: Raw::Json(item),
        });
    }
    Ok(Resources {
        json: true,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(text: &str) -> Resources {
        Resources::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    #[test]
    fn text_form_with_roles_ranges_and_sets() {
        let r = parse("cpus:4; mem(ops):1024 ;ports:[31000-32000, 33000-33010];zones:{a,b};");
        let names: Vec<_> = r
            .entries()
            .iter()
            .map(|e| (e.name.as_str(), e.role.as_deref()))
            .collect();
        assert_eq!(
            names,
            [
                ("cpus", None),
                ("mem", Some("ops")),
                ("ports", None),
                ("zones", None)
            ]
        );
        assert_eq!(
            r.entries()[2].value,
            ResourceValue::Other("[31000-32000,33000-33010]".into())
        );
        assert_eq!(r.gpus(), None);
        assert_eq!(
            r.render(),
            "cpus:4;mem(ops):1024;ports:[31000-32000,33000-33010];zones:{a,b}"
        );
    }

    #[test]
    fn gpus_are_summed_over_roles() {
        let r = parse("gpus(ml):2;cpus:1;gpus:1");
        assert_eq!(r.gpus(), Some(GpusGiven { total: 3.0 }));
        assert_eq!(r.render_with_gpus(Some(4)), "cpus:1;gpus:4");
        assert_eq!(r.render_with_gpus(None), "cpus:1");
    }

    #[test]
    fn explicit_zero_is_kept_and_lookalikes_are_not_gpus() {
        assert_eq!(
            parse("cpus:1;gpus:0").gpus(),
            Some(GpusGiven { total: 0.0 })
        );
        assert_eq!(parse("cpus:1;mygpus:0;gpus_x:0").gpus(), None);
        assert_eq!(parse("gpus:-0").gpus(), Some(GpusGiven { total: 0.0 }));
    }

    #[test]
    fn bad_values_name_the_value() {
        for (text, needle) in [
            (
                "gpus:-1",
                "gpus=-1: a scalar resource must be a finite number of at least 0",
            ),
            ("gpus:NaN", "gpus=NaN"),
            ("gpus:inf", "gpus=inf"),
            ("cpus:four", "cpus=\"four\": expected a number"),
            ("cpus", "\"cpus\": expected name:value"),
            ("cpus:1:2", "\"cpus:1:2\": expected name:value"),
            ("cpus(:1", "bad role"),
            ("cpus():1", "bad role"),
            ("cpus)x(:1", "bad role"),
            (":1", "empty resource name"),
            ("ports:[5-1]", "ports=\"[5-1]\""),
            ("ports:[1-2", "ports=\"[1-2\""),
            ("s:{a,,b}", "s=\"{a,,b}\""),
            ("gpus:[0-1]", "'gpus' resource must be a scalar"),
            ("gpus:{a}", "'gpus' resource must be a scalar"),
        ] {
            let err = Resources::parse(text).expect_err(text).to_string();
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
        }
    }

    #[test]
    fn json_form() {
        let text = r#"[{"name":"cpus","type":"SCALAR","scalar":{"value":4}},
                       {"name":"gpus","type":"SCALAR","scalar":{"value":2},"role":"ml"},
                       {"name":"ports","type":"RANGES","ranges":{"range":[{"begin":1,"end":2}]}}]"#;
        let r = parse(text);
        assert_eq!(r.gpus(), Some(GpusGiven { total: 2.0 }));
        assert_eq!(r.entries()[1].role.as_deref(), Some("ml"));
        let out: serde_json::Value =
            serde_json::from_str(&r.render_with_gpus(Some(8))).expect("json");
        let names: Vec<_> = out
            .as_array()
            .expect("array")
            .iter()
            .map(|e| e["name"].clone())
            .collect();
        assert_eq!(names, ["cpus", "ports", "gpus"]);
        assert_eq!(out[2]["scalar"]["value"], 8);

        let err =
            Resources::parse(r#"[{"name":"gpus","scalar":{"value":-1}}]"#).expect_err("negative");
        assert!(err.to_string().contains("gpus=-1"), "{err}");
        let err = Resources::parse(r#"[{"type":"SCALAR"}]"#).expect_err("no name");
        assert!(err.to_string().contains("entry 0"), "{err}");
        assert!(matches!(
            Resources::parse("[1,"),
            Err(ResourcesError::Json { .. })
        ));
    }

    #[test]
    fn reservations_give_the_role() {
        let r = parse(
            r#"[{"name":"gpus","scalar":{"value":1},"reservations":[{"role":"a"},{"role":"a/b"}]}]"#,
        );
        assert_eq!(r.entries()[0].role.as_deref(), Some("a/b"));
    }

    fn entry() -> impl Strategy<Value = (String, Option<String>, u32)> {
        (
            "[a-z_]{1,8}",
            proptest::option::of("[a-z*][a-z0-9/_-]{0,6}"),
            0u32..100_000,
        )
    }

    proptest! {
        #[test]
        fn text_round_trip(entries in proptest::collection::vec(entry(), 0..8)) {
            let text = entries
                .iter()
                .map(|(n, r, v)| {
                    let v = f64::from(*v) / 1000.0;
                    match r { Some(r) => format!("{n}({r}):{v}"), None => format!("{n}:{v}") }
                })
                .collect::<Vec<_>>()
                .join(";");
            let parsed = Resources::parse(&text).expect("generated text parses");
            prop_assert_eq!(parsed.entries().len(), entries.len());
            prop_assert_eq!(Resources::parse(&parsed.render()).expect("re-parse"), parsed.clone());
            let gpus: Vec<f64> = entries.iter().filter(|e| e.0 == GPUS).map(|e| f64::from(e.2) / 1000.0).collect();
            prop_assert_eq!(parsed.gpus().is_some(), !gpus.is_empty());
        }

        #[test]
        fn never_panics(text in "\\PC{0,40}") {
            let _ = Resources::parse(&text);
        }
    }
}
