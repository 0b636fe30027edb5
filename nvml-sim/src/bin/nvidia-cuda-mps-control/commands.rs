//! The control daemon's command language and state: defaults, servers and their limits.
//!
//! Commands and their meaning follow NVIDIA's MPS documentation ("Legacy MPS v2 Interface",
//! `nvidia-cuda-mps-control(1)`): `get_server_list`, `get_server_status <PID>`,
//! `start_server -uid <UID>`, `shutdown_server <PID> [-f]`, `get_client_list <PID>`,
//! `set_default_active_thread_percentage <pct>` (affects servers started later),
//! `get_default_active_thread_percentage`, `set_active_thread_percentage <PID> <pct>`,
//! `get_active_thread_percentage <PID>`, `set_default_device_pinned_mem_limit <dev> <value>`,
//! `get_default_device_pinned_mem_limit <dev>`, `set_device_pinned_mem_limit <PID> <dev> <value>`,
//! `get_device_pinned_mem_limit <PID> <dev>`, `set_default_client_priority <0|1>`,
//! `get_default_client_priority`, `quit [-t <timeout>]`. Percentages print with one decimal
//! (`25.0`, as `get_default_active_thread_percentage` does); memory values are an integer and
//! `G` or `M` and print as given. Starting servers is the daemon's job; this module only decides.

use std::collections::BTreeMap;

/// What executing a command asks the daemon to do besides replying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Nothing more.
    None,
    /// Start a server for this uid with the current defaults.
    StartServer { uid: u32 },
    /// Stop the server with this PID.
    ShutdownServer { pid: u32 },
    /// Stop every server and exit.
    Quit,
}

/// The reply to one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    /// False when the command was rejected.
    pub(crate) ok: bool,
    /// What the client prints (no trailing newline).
    pub(crate) text: String,
    pub(crate) effect: Effect,
}

impl Reply {
    fn ok(text: impl Into<String>) -> Reply {
        Reply {
            ok: true,
            text: text.into(),
            effect: Effect::None,
        }
    }

    fn err(text: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            text: text.into(),
            effect: Effect::None,
        }
    }

    fn effect(effect: Effect) -> Reply {
        Reply {
            ok: true,
            text: String::new(),
            effect,
        }
    }
}

/// One MPS server and the limits it started with (or was given since).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Server {
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    pub(crate) active_thread_percentage: f64,
    /// Pinned device memory limit by device (ordinal or UUID as given).
    pub(crate) pinned_mem_limits: BTreeMap<String, String>,
}

/// The daemon's settable state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Control {
    pub(crate) default_active_thread_percentage: f64,
    pub(crate) default_pinned_mem_limits: BTreeMap<String, String>,
    pub(crate) default_client_priority: u32,
    pub(crate) servers: Vec<Server>,
}

/// Every command, for error messages.
pub(crate) const COMMANDS: &str = "get_server_list, get_server_status, start_server, \
shutdown_server, get_client_list, set_default_active_thread_percentage, \
get_default_active_thread_percentage, set_active_thread_percentage, get_active_thread_percentage, \
set_default_device_pinned_mem_limit, get_default_device_pinned_mem_limit, \
set_device_pinned_mem_limit, get_device_pinned_mem_limit, set_default_client_priority, \
get_default_client_priority, quit";

impl Default for Control {
    fn default() -> Control {
        Control {
            default_active_thread_percentage: 100.0,
            default_pinned_mem_limits: BTreeMap::new(),
            default_client_priority: 0,
            servers: Vec::new(),
        }
    }
}

/// Checks that the command line has `n` words; the error shows `usage`.
fn arity(words: &[&str], n: usize, usage: &str) -> Result<(), String> {
    if words.len() == n {
        Ok(())
    } else {
        Err(format!("usage: {usage}"))
    }
}

fn percentage(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(p),
        _ => Err(format!(
            "active thread percentage {text:?}: expected a number above 0 and at most 100"
        )),
    }
}

fn device(text: &str) -> Result<String, String> {
    let uuid = |prefix: &str| {
        text.strip_prefix(prefix).is_some_and(|rest| {
            !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        })
    };
    if text.parse::<u32>().is_ok() || uuid("GPU-") || uuid("MIG-") {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "device {text:?}: expected a device ordinal such as 0 or a GPU-/MIG- UUID"
        ))
    }
}

fn memory(text: &str) -> Result<String, String> {
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    if matches!(unit, "G" | "M") && !digits.is_empty() && digits.parse::<u64>().is_ok() {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "pinned memory limit {text:?}: expected an integer followed by G or M, such as 4096M"
        ))
    }
}

fn pid(text: &str) -> Result<u32, String> {
    text.parse()
        .map_err(|_| format!("PID {text:?}: expected a process id"))
}

impl Control {
    fn server(&mut self, text: &str) -> Result<&mut Server, String> {
        let pid = pid(text)?;
        self.servers
            .iter_mut()
            .find(|s| s.pid == pid)
            .ok_or_else(|| format!("no MPS server with PID {pid}"))
    }

    /// Executes one command line.
    pub(crate) fn execute(&mut self, line: &str) -> Reply {
        let words: Vec<&str> = line.split_whitespace().collect();
        match self.run(&words) {
            Ok(reply) => reply,
            Err(why) => Reply::err(why),
        }
    }

    fn run(&mut self, words: &[&str]) -> Result<Reply, String> {
        let Some(&command) = words.first() else {
            return Ok(Reply::ok(""));
        };
        let reply = match self.server_command(command, words)? {
            Some(reply) => Some(reply),
            None => self.limit_command(command, words)?,
        };
        reply.ok_or_else(|| format!("unknown command {command:?}; accepted: {COMMANDS}"))
    }

    /// Runs `command` when it lists, starts, checks or stops servers, or quits; `None` for
    /// another command.
    fn server_command(&mut self, command: &str, words: &[&str]) -> Result<Option<Reply>, String> {
        Ok(Some(match command {
            "get_server_list" => {
                arity(words, 1, "get_server_list")?;
                let pids: Vec<String> = self.servers.iter().map(|s| s.pid.to_string()).collect();
                Reply::ok(pids.join("\n"))
            }
            "get_server_status" => {
                arity(words, 2, "get_server_status <PID>")?;
                self.server(words[1])?;
                Reply::ok("ACTIVE")
            }
            "start_server" => {
                if words.len() != 3 || words[1] != "-uid" {
                    return Err("usage: start_server -uid <user id>".to_owned());
                }
                let uid = words[2]
                    .parse()
                    .map_err(|_| format!("user id {:?}: expected a number", words[2]))?;
                Reply::effect(Effect::StartServer { uid })
            }
            "shutdown_server" => {
                if !(words.len() == 2 || (words.len() == 3 && words[2] == "-f")) {
                    return Err("usage: shutdown_server <PID> [-f]".to_owned());
                }
                let pid = self.server(words[1])?.pid;
                Reply::effect(Effect::ShutdownServer { pid })
            }
            "get_client_list" => {
                arity(words, 2, "get_client_list <PID>")?;
                self.server(words[1])?;
                Reply::ok("")
            }
            "quit" => {
                let ok = words.len() == 1
                    || (words.len() == 3 && words[1] == "-t" && words[2].parse::<u64>().is_ok());
                if !ok {
                    return Err("usage: quit [-t <timeout in seconds>]".to_owned());
                }
                Reply::effect(Effect::Quit)
            }
            _ => return Ok(None),
        }))
    }

    /// Runs `command` when it sets or gets a limit (active thread percentage, pinned memory,
    /// client priority), by default or of one server; `None` for another command.
    fn limit_command(&mut self, command: &str, words: &[&str]) -> Result<Option<Reply>, String> {
        Ok(Some(match command {
            "set_default_active_thread_percentage" => {
                arity(
                    words,
                    2,
                    "set_default_active_thread_percentage <percentage>",
                )?;
                self.default_active_thread_percentage = percentage(words[1])?;
                Reply::ok(format!("{:.1}", self.default_active_thread_percentage))
            }
            "get_default_active_thread_percentage" => {
                arity(words, 1, "get_default_active_thread_percentage")?;
                Reply::ok(format!("{:.1}", self.default_active_thread_percentage))
            }
            "set_active_thread_percentage" => {
                arity(words, 3, "set_active_thread_percentage <PID> <percentage>")?;
                let p = percentage(words[2])?;
                let s = self.server(words[1])?;
                s.active_thread_percentage = p;
                Reply::ok(format!("{p:.1}"))
            }
            "get_active_thread_percentage" => {
                arity(words, 2, "get_active_thread_percentage <PID>")?;
                Reply::ok(format!(
                    "{:.1}",
                    self.server(words[1])?.active_thread_percentage
                ))
            }
            "set_default_device_pinned_mem_limit" => {
                arity(
                    words,
                    3,
                    "set_default_device_pinned_mem_limit <dev> <value>",
                )?;
                let (dev, value) = (device(words[1])?, memory(words[2])?);
                self.default_pinned_mem_limits.insert(dev, value);
                Reply::ok("")
            }
            "get_default_device_pinned_mem_limit" => {
                arity(words, 2, "get_default_device_pinned_mem_limit <dev>")?;
                let dev = device(words[1])?;
                Reply::ok(
                    self.default_pinned_mem_limits
                        .get(&dev)
                        .cloned()
                        .unwrap_or_default(),
                )
            }
            "set_device_pinned_mem_limit" => {
                arity(words, 4, "set_device_pinned_mem_limit <PID> <dev> <value>")?;
                let (dev, value) = (device(words[2])?, memory(words[3])?);
                self.server(words[1])?.pinned_mem_limits.insert(dev, value);
                Reply::ok("")
            }
            "get_device_pinned_mem_limit" => {
                arity(words, 3, "get_device_pinned_mem_limit <PID> <dev>")?;
                let dev = device(words[2])?;
                let s = self.server(words[1])?;
                Reply::ok(s.pinned_mem_limits.get(&dev).cloned().unwrap_or_default())
            }
            "set_default_client_priority" => {
                arity(words, 2, "set_default_client_priority <0|1>")?;
                self.default_client_priority = match words[1] {
                    "0" => 0,
                    "1" => 1,
                    other => {
                        return Err(format!(
                            "client priority {other:?}: expected 0 (normal) or 1 (below normal)"
                        ));
                    }
                };
                Reply::ok("")
            }
            "get_default_client_priority" => {
                arity(words, 1, "get_default_client_priority")?;
                Reply::ok(self.default_client_priority.to_string())
            }
            _ => return Ok(None),
        }))
    }

    /// Records a server the daemon started, with the current defaults.
    pub(crate) fn add_server(&mut self, pid: u32, uid: u32) -> &Server {
        self.servers.push(Server {
            pid,
            uid,
            active_thread_percentage: self.default_active_thread_percentage,
            pinned_mem_limits: self.default_pinned_mem_limits.clone(),
        });
        let last = self.servers.len() - 1;
        &self.servers[last]
    }

    /// Forgets a server the daemon stopped.
    pub(crate) fn remove_server(&mut self, pid: u32) {
        self.servers.retain(|s| s.pid != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_their_formats() {
        let mut c = Control::default();
        assert_eq!(
            c.execute("get_default_active_thread_percentage").text,
            "100.0"
        );
        assert_eq!(
            c.execute("set_default_active_thread_percentage 25").text,
            "25.0"
        );
        assert_eq!(
            c.execute("get_default_active_thread_percentage").text,
            "25.0"
        );
        assert!(c.execute("set_default_device_pinned_mem_limit 0 4096M").ok);
        assert!(
            c.execute("set_default_device_pinned_mem_limit GPU-1a2b 2G")
                .ok
        );
        assert_eq!(
            c.execute("get_default_device_pinned_mem_limit 0").text,
            "4096M"
        );
        assert_eq!(
            c.execute("get_default_device_pinned_mem_limit GPU-1a2b")
                .text,
            "2G"
        );
        assert_eq!(c.execute("get_default_device_pinned_mem_limit 1").text, "");
        assert_eq!(c.execute("get_server_list").text, "");
        assert_eq!(c.execute("quit").effect, Effect::Quit);
        assert_eq!(c.execute("").text, "");
    }

    #[test]
    fn servers_take_the_defaults_of_their_start() {
        let mut c = Control::default();
        c.execute("set_default_active_thread_percentage 50");
        assert_eq!(
            c.execute("start_server -uid 1000").effect,
            Effect::StartServer { uid: 1000 }
        );
        c.add_server(77, 1000);
        c.execute("set_default_active_thread_percentage 10");
        assert_eq!(c.execute("get_active_thread_percentage 77").text, "50.0");
        assert_eq!(c.execute("set_active_thread_percentage 77 30").text, "30.0");
        assert!(c.execute("set_device_pinned_mem_limit 77 0 1G").ok);
        assert_eq!(c.execute("get_device_pinned_mem_limit 77 0").text, "1G");
        assert_eq!(c.execute("get_server_list").text, "77");
        assert_eq!(
            c.execute("shutdown_server 77 -f").effect,
            Effect::ShutdownServer { pid: 77 }
        );
        c.remove_server(77);
        assert!(!c.execute("get_server_status 77").ok);
    }

    #[test]
    fn bad_commands_say_what_is_accepted() {
        let mut c = Control::default();
        for (line, needle) in [
            (
                "set_default_active_thread_percentage 0",
                "above 0 and at most 100",
            ),
            ("set_default_active_thread_percentage 101", "at most 100"),
            (
                "set_default_device_pinned_mem_limit 0 4096",
                "integer followed by G or M",
            ),
            (
                "set_default_device_pinned_mem_limit gpu0 1G",
                "device ordinal",
            ),
            (
                "set_default_active_thread_percentage",
                "usage: set_default_active_thread_percentage",
            ),
            ("get_active_thread_percentage 9", "no MPS server with PID 9"),
            ("start_server 1000", "usage: start_server -uid"),
            (
                "frobnicate",
                "unknown command \"frobnicate\"; accepted: get_server_list",
            ),
            ("quit now", "usage: quit"),
        ] {
            let r = c.execute(line);
            assert!(!r.ok && r.text.contains(needle), "{line}: {r:?}");
        }
        assert_eq!(c, Control::default(), "rejected commands change nothing");
    }
}
