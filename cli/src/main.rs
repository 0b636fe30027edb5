//! `mesos-gpu`: NVIDIA GPU isolation for Mesos agents.
//!
//! Exit codes, one rule for every command (the operator guide's "Exit codes"): 0 success; 1 a
//! well-formed command failed (the error is printed once on stderr, `mesos-gpu: error: …`); 2 bad
//! usage, refused by clap before anything is done: unknown commands or flags, missing
//! arguments, and values of the wrong form, which every flag with a fixed form checks in its
//! clap value parser (`--gpus`, GPU names, container ids, volume holders, versions).
#![forbid(unsafe_code)]

mod cmd;
mod ctx;
mod numa;
mod simulate;

use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _};

use crate::ctx::{Ctx, GlobalArgs};

#[derive(clap::Parser)]
#[command(
    name = "mesos-gpu",
    version,
    about = "NVIDIA GPU isolation for Mesos agents",
    long_about = "NVIDIA GPU isolation for Mesos agents: discover GPUs, allocate them to containers \
                  with device cgroups (v1 and v2), build the driver volume and bridge the Docker \
                  containerizer. Every command runs on a simulated node with --simulate."
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    let mut command = Cli::command();
    if let Some(spec) = simulate::spec_in_args(std::env::args_os()) {
        command = simulate::with_scratch_defaults(command, &simulate::scratch_state(&spec));
    }
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    if let Err(err) = ctx::init_logging(&cli.global, cli.command.is_daemon()) {
        eprintln!("mesos-gpu: {err:#}");
        return ExitCode::FAILURE;
    }
    let ctx = Ctx::new(cli.global, cli.command.handles_signals());
    let outcome = cmd::run(cli.command, &ctx);
    simulate::yield_to_signal_exit();
    match outcome {
        Ok(code) => code,
        Err(err) if ctx::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            ctx::print_error(&err, ctx.global.log_format);
            ExitCode::FAILURE
        }
    }
}
