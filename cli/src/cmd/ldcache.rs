//! `mesos-gpu ldcache`: the entries of an ld.so.cache, printed exactly as `ldconfig -p` prints
//! them (old, new and compat layouts), or as JSON.
//!
//! `--json` prints one object: `layout` (`old`, `new` or `compat`), `generator` (the ldconfig
//! that wrote it, or null) and `entries`, each `{name, path, flags, flags_raw, hwcap}` where
//! `flags` is ldconfig's text (`libc6,x86-64`) and `hwcap` is null, `{"legacy": mask}` or
//! `{"subdirectory": name-or-null, "isa_level": n}`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use mesos_gpu_volume::LdCache;
use mesos_gpu_volume::ldcache::Hwcap;
use serde_json::json;

use crate::ctx::Ctx;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu ldcache\n  \
    mesos-gpu ldcache | grep nvidia\n  \
    mesos-gpu ldcache --cache /mnt/driver/etc/ld.so.cache --json")]
pub(crate) struct Args {
    /// The cache file to read.
    #[arg(long, value_name = "FILE", default_value = "/etc/ld.so.cache")]
    cache: PathBuf,

    /// Print JSON (fields documented in the module) instead of the `ldconfig -p` listing.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &Args, _ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let cache = LdCache::read(&args.cache)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let entries: Vec<_> = cache
            .entries()
            .map(|e| {
                let hwcap = match e.hwcap {
                    Hwcap::None => serde_json::Value::Null,
                    Hwcap::Legacy(mask) => json!({ "legacy": mask }),
                    Hwcap::Subdirectory {
                        name, isa_level, ..
                    } => json!({
                        "subdirectory": name.map(|n| n.to_string_lossy()),
                        "isa_level": isa_level,
                    }),
                };
                json!({
                    "name": e.name.to_string_lossy(),
                    "path": e.path.to_string_lossy(),
                    "flags": e.flags.to_string(),
                    "flags_raw": e.flags.0,
                    "hwcap": hwcap,
                })
            })
            .collect();
        let report = json!({
            "layout": cache.layout(),
            "generator": cache.generator().map(String::from_utf8_lossy),
            "entries": entries,
        });
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        cache
            .write_listing(&mut out, &args.cache)
            .context("cannot write the listing")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
