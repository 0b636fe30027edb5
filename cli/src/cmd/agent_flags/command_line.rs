//! The rest of the agent's command line (`agent-flags -- FLAG…`), read as `mesos-agent` reads
//! it, so that the flags `agent-flags` prints and the operator's own reach the agent once each.
//!
//! `mesos-agent` refuses a flag given twice on its command line (`Flag 'attributes' is already
//! loaded via name 'attributes'`), and takes a flag missing from the command line from the
//! environment (`MESOS_<NAME>`), the command line winning (stout `flags/flags.hpp`). So the flags
//! `agent-flags` derives from the agent's own values are read here, command line first, then
//! environment, and printed once, merged: `--resources`, `--attributes`, `--isolation`,
//! `--nvidia_gpu_devices` (Mesos's `gpu/nvidia`), `--work_dir` (the module's `work_dir`, not
//! printed), `--modules` (the operator's libraries kept, the module's added) and
//! `--agent_subsystems` (the operator's kept). Every other flag passes through unchanged.

use std::collections::BTreeSet;

use anyhow::bail;

/// Where an agent flag's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// `--name=value` on the command line after `--`.
    CommandLine,
    /// `MESOS_<NAME>` in the environment.
    Environment,
}

/// The flags `agent-flags` reads instead of passing them through.
const MERGED: &[&str] = &[
    "resources",
    "attributes",
    "isolation",
    "nvidia_gpu_devices",
    "work_dir",
    "modules",
    "agent_subsystems",
];

/// The agent's command line after `--`, with the merged flags taken out as they are read.
#[derive(Debug)]
pub(super) struct AgentCommandLine {
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// The flag name of `arg` (`--name=value`, `--name`, `--no-name`), when it is a flag.
fn name(arg: &str) -> Option<&str> {
    let flag = arg.strip_prefix("--").filter(|f| !f.is_empty())?;
    let name = flag.split_once('=').map_or(flag, |(n, _)| n);
    Some(if flag.contains('=') {
        name
    } else {
        name.strip_prefix("no-").unwrap_or(name)
    })
}

impl AgentCommandLine {
    /// Reads `args` (the agent's flags after `--`) and the agent's environment `env`: a flag
    /// given twice is refused, as `mesos-agent` refuses it, and so is a merged flag without a
    /// value (Mesos takes values only as `--name=value`).
    pub(super) fn parse(args: &[String], env: Vec<(String, String)>) -> anyhow::Result<Self> {
        let mut seen = BTreeSet::new();
        for arg in args.iter().take_while(|a| *a != "--") {
            let Some(name) = name(arg) else { continue };
            if MERGED.contains(&name) && !arg.contains('=') {
                bail!(
                    "the agent's {arg}: mesos-agent takes a value only as --{name}=VALUE (one word)"
                );
            }
            if !seen.insert(name.to_owned()) {
                bail!(
                    "the agent's --{name} is given twice; mesos-agent refuses that (\"Flag \
                     '{name}' is already loaded\"): give it once"
                );
            }
        }
        Ok(AgentCommandLine {
            args: args.to_vec(),
            env,
        })
    }

    /// Takes `--name=value` out of the command line, or reads `MESOS_<NAME>`, as the agent would
    /// see it.
    pub(super) fn take(&mut self, flag: &str) -> Option<(String, Source)> {
        debug_assert!(MERGED.contains(&flag));
        let end = self
            .args
            .iter()
            .position(|a| a == "--")
            .unwrap_or(self.args.len());
        let found = self.args[..end]
            .iter()
            .position(|a| name(a) == Some(flag) && a.contains('='));
        if let Some(i) = found {
            let arg = self.args.remove(i);
            let value = arg.split_once('=').map(|(_, v)| v.to_owned());
            return value.map(|v| (v, Source::CommandLine));
        }
        let key = format!("MESOS_{}", flag.to_ascii_uppercase());
        self.env
            .iter()
            .find(|(k, _)| *k == key || k.strip_prefix("MESOS_") == Some(flag))
            .map(|(_, v)| (v.clone(), Source::Environment))
    }

    /// Reads `--name=value` as [`Self::take`] does, leaving it on the command line (a flag the
    /// agent needs that `agent-flags` only reads, such as `--work_dir`).
    pub(super) fn peek(&self, flag: &str) -> Option<(String, Source)> {
        let mut copy = AgentCommandLine {
            args: self.args.clone(),
            env: self.env.clone(),
        };
        copy.take(flag)
    }

    /// Puts `--flag=value` back (a merged flag `agent-flags` has nothing to add to).
    pub(super) fn put_back(&mut self, flag: &str, value: &str) {
        self.args.insert(0, format!("--{flag}={value}"));
    }

    /// The flags left, refusing one that `ours` (the printed `--name=value` lines) also sets.
    pub(super) fn rest(self, ours: &[String]) -> anyhow::Result<Vec<String>> {
        let printed: BTreeSet<&str> = ours.iter().filter_map(|f| name(f)).collect();
        for arg in self.args.iter().take_while(|a| *a != "--") {
            if let Some(name) = name(arg).filter(|n| printed.contains(n)) {
                bail!(
                    "the agent's {arg} would reach mesos-agent twice: agent-flags prints --{name} \
                     itself; leave it out of the agent's flags"
                );
            }
        }
        Ok(self.args)
    }
}

/// One value from this command's option and the agent's own flag: the option when given (it
/// must agree with a flag on the agent's command line), else the agent's.
pub(super) fn one_value(
    option: &str,
    given: Option<&str>,
    flag: &str,
    agent: Option<(String, Source)>,
) -> anyhow::Result<Option<String>> {
    match (given, agent) {
        (Some(given), Some((value, Source::CommandLine))) if given != value => bail!(
            "{option} {given:?} and the agent's --{flag}={value:?} disagree: give it once \
             (agent.sh passes the agent's flags to agent-flags, which merges them)"
        ),
        (Some(given), _) => Ok(Some(given.to_owned())),
        (None, agent) => Ok(agent.map(|(v, _)| v)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn line(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<AgentCommandLine> {
        AgentCommandLine::parse(
            &args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>(),
            env.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn a_flag_given_twice_is_refused_as_mesos_refuses_it() {
        let err = line(&["--attributes=a:1", "--attributes=b:2"], &[]).unwrap_err();
        assert!(err.to_string().contains("given twice"), "{err}");
        let err = line(&["--hostname=a", "--hostname=b"], &[]).unwrap_err();
        assert!(err.to_string().contains("--hostname"), "{err}");
        line(&["--hostname=a", "--", "--hostname=b"], &[]).unwrap();
        let err = line(&["--resources", "cpus:1"], &[]).unwrap_err();
        assert!(err.to_string().contains("--resources=VALUE"), "{err}");
    }

    #[test]
    fn the_command_line_wins_over_the_environment() {
        let mut l = line(
            &["--attributes=rack:r7", "--hostname=h"],
            &[("MESOS_ATTRIBUTES", "x:1"), ("MESOS_RESOURCES", "cpus:2")],
        )
        .unwrap();
        assert_eq!(
            l.take("attributes"),
            Some(("rack:r7".to_owned(), Source::CommandLine))
        );
        assert_eq!(
            l.take("resources"),
            Some(("cpus:2".to_owned(), Source::Environment))
        );
        assert_eq!(l.take("isolation"), None);
        let mut l = line(&["--work_dir=/w", "--hostname=h"], &[]).unwrap();
        assert_eq!(
            l.peek("work_dir"),
            Some(("/w".to_owned(), Source::CommandLine))
        );
        l.put_back("isolation", "posix/cpu");
        assert_eq!(
            l.rest(&[]).unwrap(),
            ["--isolation=posix/cpu", "--work_dir=/w", "--hostname=h"]
        );
    }

    #[test]
    fn a_printed_flag_left_on_the_command_line_is_refused() {
        let l = line(&["--hooks=h", "--no-systemd_enable_support"], &[]).unwrap();
        let err = l.rest(&["--hooks=x".to_owned()]).unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
    }

    #[test]
    fn an_option_and_the_agents_flag_must_agree() {
        let agent = Some(("cpus:1".to_owned(), Source::CommandLine));
        assert!(one_value("--resources", Some("cpus:2"), "resources", agent.clone()).is_err());
        assert_eq!(
            one_value("--resources", Some("cpus:1"), "resources", agent.clone()).unwrap(),
            Some("cpus:1".to_owned())
        );
        let env = Some(("cpus:3".to_owned(), Source::Environment));
        assert_eq!(
            one_value("--resources", Some("cpus:2"), "resources", env.clone()).unwrap(),
            Some("cpus:2".to_owned()),
            "the printed flag overrides the environment, as on the agent's command line"
        );
        assert_eq!(
            one_value("--resources", None, "resources", env).unwrap(),
            Some("cpus:3".to_owned())
        );
    }
}
