//! The proto2 `required` check that prost leaves out: libprotobuf's `ParseFromString` refuses a
//! message that lacks a required field anywhere inside it, prost fills in a default.
//!
//! Facts relied on (libprotobuf 3.21, `reflection_ops.cc` `FindInitializationErrors`,
//! `message_lite.cc` `InitializationErrorMessage`; compared with the real library in
//! `ffi/tests/required_libprotobuf.rs`):
//! - The missing fields are listed as paths joined by `", "`: first this message's own required
//!   fields that are absent, in declaration order, then those of each present sub-message, by
//!   field number, with the prefix `name.` (singular) or `name[i].` (repeated; `i` counts the
//!   occurrences of that field).
//! - A singular message field that occurs more than once is *merged*; concatenating the
//!   occurrences' bytes is exactly that merge on the wire.
//! - A map entry always holds its value once parsed, so a value message written without its
//!   required fields is incomplete even when the entry leaves the value out.
//! - A proto2 enum field holding a number the enum does not define is kept as an unknown field:
//!   a required enum is then missing.
//! - Fields outside our `.proto` subset are skipped, so required fields *inside* them are not
//!   checked (prost skips them too; the isolator reads nothing from them).
//!
//! The table of fields comes from the `.proto` files at build time (`build.rs`).

use std::collections::BTreeMap;

/// A message type: its required fields and the fields that hold messages.
pub(crate) struct MessageRule {
    name: &'static str,
    map_entry: bool,
    fields: &'static [FieldRule],
}

/// A field that is required, holds a message, or both.
struct FieldRule {
    number: u32,
    name: &'static str,
    required: bool,
    repeated: bool,
    /// Index into [`MESSAGES`] of the field's message type.
    message: Option<usize>,
    /// The values a required enum field defines, sorted.
    enum_values: Option<&'static [i32]>,
}

include!(concat!(env!("OUT_DIR"), "/required_fields.rs"));

/// The required fields missing from `bytes`, a message of type `message` (a full name such as
/// `mesos.slave.ContainerConfig`) that prost has decoded. Empty when all are present, or when
/// the type is not in the table.
pub(crate) fn missing_required(message: &str, bytes: &[u8]) -> Vec<String> {
    let mut missing = Vec::new();
    if let Ok(index) = MESSAGES.binary_search_by(|m| m.name.cmp(message)) {
        walk(index, bytes, "", &mut missing);
    }
    missing
}

/// As [`missing_required`], for a *carrier*: a message whose own required fields are left unset
/// on purpose (`mgpu_update`'s `ContainerConfig`, which carries only `resources` and `limits`).
/// The messages inside it must still be complete.
pub(crate) fn missing_required_inside(message: &str, bytes: &[u8]) -> Vec<String> {
    let mut missing = missing_required(message, bytes);
    missing.retain(|path| path.contains('.'));
    missing
}

fn walk(index: usize, bytes: &[u8], prefix: &str, missing: &mut Vec<String>) {
    let rule = &MESSAGES[index];
    let mut seen = Vec::new();
    // Occurrences of message-typed fields, by field number.
    let mut subs: BTreeMap<u32, Vec<&[u8]>> = BTreeMap::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some((number, value, after)) = next_field(rest) else {
            // prost has decoded these bytes; a field it could not read is not ours to judge.
            return;
        };
        rest = after;
        let field = rule.fields.iter().find(|f| f.number == number);
        let known_enum = match (field.and_then(|f| f.enum_values), value) {
            // Truncated to int32, as libprotobuf reads an enum (a negative value has 10 bytes).
            #[allow(clippy::cast_possible_truncation)]
            (Some(values), Value::Varint(v)) => values.binary_search(&(v as i32)).is_ok(),
            _ => true,
        };
        if known_enum {
            seen.push(number);
        }
        let payload = match value {
            Value::Bytes(payload) => Some(payload),
            Value::Varint(_) | Value::Fixed => None,
        };
        if let Some(payload) = payload
            && field.is_some_and(|f| f.message.is_some())
        {
            subs.entry(number).or_default().push(payload);
        }
    }
    for field in rule.fields {
        if field.required && !seen.contains(&field.number) {
            missing.push(format!("{prefix}{}", field.name));
        }
    }
    let mut fields: Vec<&FieldRule> = rule.fields.iter().filter(|f| f.message.is_some()).collect();
    fields.sort_by_key(|f| f.number);
    for field in fields {
        let Some(child) = field.message else {
            continue;
        };
        let occurrences = subs.remove(&field.number).unwrap_or_default();
        if field.repeated {
            for (i, payload) in occurrences.iter().enumerate() {
                walk(
                    child,
                    payload,
                    &format!("{prefix}{}[{i}].", field.name),
                    missing,
                );
            }
        } else if !occurrences.is_empty() || (rule.map_entry && field.number == 2) {
            let merged = occurrences.concat();
            walk(child, &merged, &format!("{prefix}{}.", field.name), missing);
        }
    }
}

/// A field's value on the wire, as far as the check needs it.
#[derive(Clone, Copy)]
enum Value<'a> {
    Varint(u64),
    Fixed,
    Bytes(&'a [u8]),
}

/// The next field of `bytes`: its number, its value, and what follows.
fn next_field(bytes: &[u8]) -> Option<(u32, Value<'_>, &[u8])> {
    let (key, rest) = varint(bytes)?;
    let number = u32::try_from(key >> 3).ok()?;
    match key & 7 {
        0 => {
            let (v, rest) = varint(rest)?;
            Some((number, Value::Varint(v), rest))
        }
        1 => Some((number, Value::Fixed, rest.get(8..)?)),
        2 => {
            let (len, rest) = varint(rest)?;
            let len = usize::try_from(len).ok()?;
            Some((number, Value::Bytes(rest.get(..len)?), rest.get(len..)?))
        }
        5 => Some((number, Value::Fixed, rest.get(4..)?)),
        // Groups are not used by any message crossing the ABI; prost refuses them for our types.
        _ => None,
    }
}

fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::mesos::slave::{ContainerConfig, ContainerRecoverInfo, ContainerState};
    use crate::proto::mesos::{CommandInfo, ContainerId, Parameter, Parameters};
    use prost::Message;

    #[test]
    fn the_table_is_sorted_and_knows_the_abi_messages() {
        assert!(MESSAGES.windows(2).all(|w| w[0].name < w[1].name));
        for name in [
            "mesos.ContainerID",
            "mesos.Parameters",
            "mesos.slave.ContainerConfig",
            "mesos.slave.ContainerRecoverInfo",
            "docker.spec.v1.ImageManifest",
        ] {
            assert!(
                MESSAGES.binary_search_by(|m| m.name.cmp(name)).is_ok(),
                "{name}"
            );
        }
    }

    #[test]
    fn empty_and_partial_messages_name_what_is_missing() {
        assert_eq!(
            missing_required("mesos.slave.ContainerConfig", b""),
            ["command_info", "directory"]
        );
        assert_eq!(missing_required("mesos.ContainerID", b""), ["value"]);
        let config = ContainerConfig {
            command_info: CommandInfo::default(),
            directory: "/sandbox".into(),
            ..Default::default()
        };
        assert!(
            missing_required("mesos.slave.ContainerConfig", &config.encode_to_vec()).is_empty()
        );
        // A parameter without its value, inside a list: the path says which one.
        let params = Parameters {
            parameter: vec![
                Parameter {
                    key: "work_dir".into(),
                    value: "/w".into(),
                },
                Parameter::default(),
            ],
        };
        let mut bytes = params.encode_to_vec();
        // Drops the second parameter's `value` (the last two bytes, `12 00`) and fixes its length.
        bytes.truncate(bytes.len() - 2);
        let last = bytes.len() - 3;
        bytes[last] -= 2;
        assert_eq!(
            missing_required("mesos.Parameters", &bytes),
            ["parameter[1].value"]
        );
    }

    #[test]
    fn a_carrier_needs_only_complete_contents() {
        // resources[0] with a name and no type: only that is reported.
        let bytes = [0x6a, 0x03, 0x0a, 0x01, b'g'];
        assert_eq!(
            missing_required("mesos.slave.ContainerConfig", &bytes),
            ["command_info", "directory", "resources[0].type"]
        );
        assert_eq!(
            missing_required_inside("mesos.slave.ContainerConfig", &bytes),
            ["resources[0].type"]
        );
        assert!(missing_required_inside("mesos.slave.ContainerConfig", &[]).is_empty());
    }

    #[test]
    fn nested_required_fields_are_found_in_field_number_order() {
        let info = ContainerRecoverInfo {
            checkpointed_container_states: vec![ContainerState {
                container_id: ContainerId {
                    value: "a".into(),
                    parent: None,
                },
                pid: 1,
                directory: "/d".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let full = info.encode_to_vec();
        assert!(missing_required("mesos.slave.ContainerRecoverInfo", &full).is_empty());
        // A ContainerState with only its pid (field 3, varint 1): container_id and directory missing.
        let bytes = [0x0a, 0x02, 0x18, 0x01];
        assert_eq!(
            missing_required("mesos.slave.ContainerRecoverInfo", &bytes),
            [
                "checkpointed_container_states[0].container_id",
                "checkpointed_container_states[0].directory"
            ]
        );
    }

    #[test]
    fn a_singular_message_given_twice_is_merged() {
        // command_info twice, empty; directory once: complete after the merge.
        let bytes = [0x5a, 0x00, 0x1a, 0x00, 0x5a, 0x00];
        assert!(missing_required("mesos.slave.ContainerConfig", &bytes).is_empty());
        // container_id in two halves of a ContainerState: `value` in the first, nothing else.
        let state = [
            0x12, 0x03, 0x0a, 0x01, b'a', 0x12, 0x00, 0x18, 0x01, 0x22, 0x00,
        ];
        assert!(missing_required("mesos.slave.ContainerState", &state).is_empty());
    }
}
