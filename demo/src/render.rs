//! The demo's text output: plain text in at most 80 columns, colours only when asked (a TTY
//! without `NO_COLOR`), the scratch directory shown as `$DEMO`.

use std::collections::BTreeSet;
use std::io::{self, Write};

use mesos_gpu_enforce::cgroup::default_whitelist;
use mesos_gpu_placement::allocator::Policy;
use mesos_gpu_volume::plan::SkipReason;

use crate::Report;
use crate::engine::{Launch, Outcome, RunReport, TaskReport};
use crate::stream::{ContainerType, Stream};

/// Output width.
const WIDTH: usize = 80;
/// Indent of a task's detail lines.
const DETAIL: usize = 10;

struct Style {
    color: bool,
    scratch: String,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
    fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }
    fn green(&self, text: &str) -> String {
        self.paint("32", text)
    }
    fn red(&self, text: &str) -> String {
        self.paint("31", text)
    }
    fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }
    /// `text` with the scratch directory written `$DEMO`.
    fn short(&self, text: &str) -> String {
        text.replace(&self.scratch, "$DEMO")
    }
}

/// Writes the whole report.
pub(crate) fn text(
    out: &mut impl Write,
    report: &Report,
    stream: &Stream,
    color: bool,
) -> io::Result<()> {
    let style = Style {
        color,
        scratch: report.scratch.clone(),
    };
    header(out, report, stream, &style)?;
    volume(out, report, &style)?;
    tasks(out, &report.run, &style)?;
    timeline(
        out,
        &report.run,
        report.gpus.iter().map(|g| g.index).collect(),
        &style,
    )?;
    summary(out, report, &style)
}

fn header(out: &mut impl Write, report: &Report, stream: &Stream, style: &Style) -> io::Result<()> {
    let names: BTreeSet<&str> = report.gpus.iter().map(|g| g.name.as_str()).collect();
    let names: Vec<&str> = names.into_iter().collect();
    writeln!(
        out,
        "{}",
        style.bold(&format!("mesos-gpu demo: simulated agent {}", report.node))
    )?;
    writeln!(
        out,
        "  {} GPUs ({}), driver {}",
        report.gpus.len(),
        names.join(", "),
        report.driver.as_deref().unwrap_or("none")
    )?;
    let tasks = report.run.tasks.len();
    writeln!(
        out,
        "  policy {}; {} arrivals ({tasks} tasks)",
        report.run.policy,
        stream.arrivals.len()
    )?;
    writeln!(out, "  stream {}", style.short(&stream.source))?;
    for line in wrap(&stream.description, WIDTH - 2) {
        writeln!(out, "  {}", style.dim(&line))?;
    }
    let mode = if report.mode == "live" {
        "LIVE: cgroups are created and removed"
    } else {
        "dry run: nothing on this host is changed"
    };
    writeln!(out, "  {mode}")?;
    writeln!(
        out,
        "  scratch files in $DEMO={} (removed at exit)",
        report.scratch
    )?;
    for note in &report.notes {
        for (n, line) in wrap(note, WIDTH - 4).iter().enumerate() {
            writeln!(
                out,
                "  {} {}",
                if n == 0 { "*" } else { " " },
                style.dim(line)
            )?;
        }
    }
    writeln!(out)
}

fn volume(out: &mut impl Write, report: &Report, style: &Style) -> io::Result<()> {
    let v = &report.volume;
    writeln!(
        out,
        "{}",
        style.bold("Driver volume (the real planner, on a generated driver tree)")
    )?;
    writeln!(
        out,
        "  driver root {}: {} files and links",
        style.short(&v.driver_root),
        v.generated.len()
    )?;
    if !v.cache.is_empty() {
        writeln!(out, "  ld.so.cache {}", v.cache)?;
    }
    let Some(plan) = &v.plan else {
        writeln!(
            out,
            "  {} {}",
            style.red("no plan:"),
            v.unavailable.as_deref().unwrap_or("unknown reason")
        )?;
        return writeln!(out);
    };
    for file in &plan.files {
        let links: Vec<&str> = plan
            .links
            .iter()
            .filter(|l| l.dir == file.dir && l.target == file.name)
            .map(|l| l.name.as_str())
            .collect();
        let extra = if links.is_empty() {
            String::new()
        } else {
            format!(" <- {}", links.join(", "))
        };
        writeln!(
            out,
            "  {:<6}{}{}",
            format!("{}/", file.dir.as_str()),
            file.name,
            style.dim(&extra)
        )?;
    }
    let (absent, other): (Vec<_>, Vec<_>) = plan
        .skipped
        .iter()
        .partition(|s| matches!(s.reason, SkipReason::NotInCache | SkipReason::NotFound));
    if !absent.is_empty() {
        writeln!(
            out,
            "  {}",
            style.dim(&format!(
                "{} other library families and binaries are not installed here",
                absent.len()
            ))
        )?;
    }
    for skipped in other {
        let what = skipped.path.as_ref().map_or_else(
            || skipped.name.clone(),
            |p| style.short(&p.display().to_string()),
        );
        writeln!(out, "  {} {what}", style.dim("skipped"))?;
        writeln!(
            out,
            "{:8}{}",
            "",
            style.dim(&format!("({})", skipped.reason))
        )?;
    }
    if let Some(path) = &v.path {
        writeln!(
            out,
            "  volume {} built: {} files, {} links",
            style.short(path),
            plan.files.len(),
            plan.links.len()
        )?;
    }
    writeln!(out)
}

/// What the allocator did for a single GPU (`docs/allocator.md`, "Order of preference"):
/// first-fit takes the lowest free index (Mesos's rule); topology takes the free GPU least
/// joined to the other free ones, so that strong sets stay whole, the lowest index only among
/// equals.
fn single_gpu_label(policy: &str, chosen: &[u32], first_fit: &[u32]) -> String {
    if policy == Policy::FirstFit.name() {
        return "single GPU: lowest free index (first-fit, Mesos's rule)".to_owned();
    }
    if chosen == first_fit {
        "single GPU: the free GPU least joined to the other free ones (breaks the fewest strong \
         pairs); here also the lowest free index"
            .to_owned()
    } else {
        format!(
            "single GPU: the free GPU least joined to the other free ones (breaks the fewest \
             strong pairs), not the lowest free index {} that first-fit takes",
            list(first_fit)
        )
    }
}

/// One line of the task log.
enum Event<'a> {
    Arrive(&'a TaskReport),
    Finish(&'a TaskReport, char, &'a [u32]),
}

fn tasks(out: &mut impl Write, run: &RunReport, style: &Style) -> io::Result<()> {
    writeln!(
        out,
        "{}",
        style.bold(&format!("Tasks (simulated time; policy {})", run.policy))
    )?;
    let mut events: Vec<(u64, u8, usize, Event<'_>)> = Vec::new();
    for (n, task) in run.tasks.iter().enumerate() {
        events.push((task.arrival, 1, n, Event::Arrive(task)));
        if let Outcome::Granted {
            label,
            chosen,
            ends,
            ..
        } = &task.outcome
        {
            events.push((*ends, 0, n, Event::Finish(task, *label, &chosen.gpus)));
        }
    }
    events.sort_by_key(|(at, kind, n, _)| (*at, *kind, *n));
    for (at, _, _, event) in &events {
        match event {
            Event::Finish(task, label, gpus) => writeln!(
                out,
                "{}",
                style.dim(&format!(
                    "{:>6}s  {label}  {} finished, GPUs {} free again",
                    at,
                    task.task,
                    list(gpus)
                ))
            )?,
            Event::Arrive(task) => arrival(out, task, &run.policy, style)?,
        }
    }
    writeln!(out)
}

fn arrival(out: &mut impl Write, task: &TaskReport, policy: &str, style: &Style) -> io::Result<()> {
    let kind = match task.container {
        ContainerType::Mesos if task.image.is_none() => "MESOS (host fs)",
        ContainerType::Mesos => "MESOS",
        ContainerType::Docker => "DOCKER",
    };
    let pad = " ".repeat(DETAIL);
    match &task.outcome {
        Outcome::Refused { reason, error } => {
            writeln!(
                out,
                "{:>6}s  -  {}  {kind}  gpus={}  {}",
                task.arrival,
                task.task,
                task.requested,
                style.red(&format!("REFUSED ({})", reason.replace('_', " ")))
            )?;
            for line in wrap(error, WIDTH - DETAIL) {
                writeln!(out, "{pad}{line}")?;
            }
        }
        Outcome::Granted {
            label,
            chosen,
            first_fit,
            free_after,
            nvlink_set_after,
            launch,
            ..
        } => {
            let got = style.green(&format!("-> GPUs {}", list(&chosen.gpus)));
            writeln!(
                out,
                "{:>6}s  {label}  {}  {kind}  gpus={}  {got}",
                task.arrival, task.task, task.requested
            )?;
            if chosen.gpus.len() > 1 {
                let verdict = match chosen.score.cmp(&first_fit.score) {
                    std::cmp::Ordering::Greater => "better than",
                    std::cmp::Ordering::Equal => "same as",
                    std::cmp::Ordering::Less => "worse than",
                };
                writeln!(
                    out,
                    "{pad}score {} [{}], {verdict} first-fit's",
                    chosen.score,
                    chosen.links.join(" ")
                )?;
                writeln!(
                    out,
                    "{pad}  {} = {} [{}]",
                    list(&first_fit.gpus),
                    first_fit.score,
                    first_fit.links.join(" ")
                )?;
            } else {
                let label = single_gpu_label(policy, &chosen.gpus, &first_fit.gpus);
                for line in wrap(&label, WIDTH - DETAIL) {
                    writeln!(out, "{pad}{line}")?;
                }
            }
            writeln!(
                out,
                "{pad}{}",
                style.dim(&format!(
                    "free after: {free_after} GPU(s), largest all-NVLink set {nvlink_set_after}"
                ))
            )?;
            launch_lines(out, launch, task, style)?;
        }
    }
    Ok(())
}

fn launch_lines(
    out: &mut impl Write,
    launch: &Launch,
    task: &TaskReport,
    style: &Style,
) -> io::Result<()> {
    let pad = " ".repeat(DETAIL);
    match launch {
        Launch::Mesos {
            cgroup,
            device_rules,
            base_rules,
            mounts,
            environment,
        } => {
            if let Some(cgroup) = cgroup {
                writeln!(out, "{pad}cgroup  {}", style.short(cgroup))?;
            }
            let base: BTreeSet<String> = default_whitelist()
                .iter()
                .map(ToString::to_string)
                .collect();
            let own: Vec<&str> = device_rules
                .iter()
                .filter(|r| !base.contains(*r))
                .map(String::as_str)
                .collect();
            let lines = pack(
                &own.join(", ")
                    .split(' ')
                    .map(str::to_owned)
                    .collect::<Vec<_>>(),
                WIDTH - DETAIL - 8,
            );
            for (n, line) in lines.iter().enumerate() {
                writeln!(
                    out,
                    "{pad}{}{line}",
                    if n == 0 { "allow   " } else { "        " }
                )?;
            }
            writeln!(
                out,
                "{pad}        {}",
                style.dim(&format!(
                    "+ {base_rules} rules of Mesos's default whitelist"
                ))
            )?;
            let devices: Vec<&str> = mounts
                .iter()
                .filter(|m| m.kind == "device")
                .map(|m| m.source.as_str())
                .collect();
            if devices.is_empty() {
                writeln!(
                    out,
                    "{pad}mounts  none: host filesystem, the device cgroup alone restricts it"
                )?;
            } else {
                let words: Vec<String> = devices
                    .iter()
                    .map(|d| style.short(d))
                    .chain(["-> <rootfs>/dev".to_owned()])
                    .collect();
                for (n, line) in pack(&words, WIDTH - DETAIL - 8).iter().enumerate() {
                    writeln!(
                        out,
                        "{pad}{}{line}",
                        if n == 0 { "mounts  " } else { "        " }
                    )?;
                }
                for m in mounts.iter().filter(|m| m.kind == "driver_volume") {
                    let words = [
                        style.short(&m.source),
                        "-> <rootfs>/usr/local/nvidia".to_owned(),
                        "(read-only)".to_owned(),
                    ];
                    for line in pack(&words, WIDTH - DETAIL - 8) {
                        writeln!(out, "{pad}        {line}")?;
                    }
                }
            }
            let keys: Vec<&str> = environment
                .iter()
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
                .collect();
            let words: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
            for (n, line) in pack(&words, WIDTH - DETAIL - 8).iter().enumerate() {
                writeln!(
                    out,
                    "{pad}{}{line}",
                    if n == 0 { "env     " } else { "        " }
                )?;
            }
        }
        Launch::Docker { docker_args } => {
            // Wrapped between arguments, never inside one, with shell continuations: the lines
            // paste as one command. An argument longer than a line gets a line of its own.
            let mut words: Vec<String> = docker_args.iter().map(|a| style.short(a)).collect();
            words.push(task.image.clone().unwrap_or_default());
            let lines = pack(&words, WIDTH - DETAIL - 11 - 2);
            for (n, line) in lines.iter().enumerate() {
                writeln!(
                    out,
                    "{pad}{}{line}{}",
                    if n == 0 { "docker run " } else { "           " },
                    if n + 1 < lines.len() { " \\" } else { "" }
                )?;
            }
        }
    }
    Ok(())
}

fn timeline(
    out: &mut impl Write,
    run: &RunReport,
    gpus: Vec<u32>,
    style: &Style,
) -> io::Result<()> {
    const LEFT: usize = 9;
    let columns = WIDTH - LEFT - 1;
    let end = run.end.max(1);
    let step = end.div_ceil(columns as u64).max(1);
    let columns = usize::try_from(end.div_ceil(step))
        .unwrap_or(columns)
        .min(columns);
    writeln!(
        out,
        "{}",
        style.bold(&format!("GPU timeline (0 to {end}s; one column = {step}s)"))
    )?;
    let granted: Vec<(u64, u64, char, &[u32])> = run
        .tasks
        .iter()
        .filter_map(|t| match &t.outcome {
            Outcome::Granted {
                label,
                chosen,
                ends,
                ..
            } => Some((t.arrival, *ends, *label, chosen.gpus.as_slice())),
            Outcome::Refused { .. } => None,
        })
        .collect();
    let mid = |col: usize| col as u64 * step + step / 2;
    for &gpu in &gpus {
        let row: String = (0..columns)
            .map(|c| {
                let t = mid(c);
                granted
                    .iter()
                    .find(|(from, to, _, set)| *from <= t && t < *to && set.contains(&gpu))
                    .map_or('.', |g| g.2)
            })
            .collect();
        writeln!(out, "{:<LEFT$}|{row}", format!("  GPU {gpu}"))?;
    }
    let bars = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let total = gpus.len().max(1);
    let busy: String = (0..columns)
        .map(|c| {
            let t = mid(c);
            let n: usize = granted
                .iter()
                .filter(|(from, to, _, _)| *from <= t && t < *to)
                .map(|g| g.3.len())
                .sum();
            bars[(n * 8).div_ceil(total).min(8)]
        })
        .collect();
    writeln!(out, "{:<LEFT$}|{busy}", "  busy")?;
    let nvlink: String = (0..columns)
        .map(|c| {
            let t = mid(c);
            let set = run
                .samples
                .iter()
                .rev()
                .find(|s| s.at <= t)
                .map_or(0, |s| s.nvlink_set);
            char::from_digit(set, 36).unwrap_or('+')
        })
        .collect();
    writeln!(out, "{:<LEFT$}|{nvlink}", "  NVLink")?;
    writeln!(
        out,
        "  {}",
        style.dim("busy: share of GPUs held; NVLink: largest all-NVLink set still free")
    )?;
    let legend: Vec<String> = run
        .tasks
        .iter()
        .filter_map(|t| match &t.outcome {
            Outcome::Granted { label, .. } => Some(format!("{label}={}", t.task)),
            Outcome::Refused { .. } => None,
        })
        .collect();
    for line in pack(&legend, WIDTH - 2) {
        writeln!(out, "  {}", style.dim(&line))?;
    }
    writeln!(out)
}

fn summary(out: &mut impl Write, report: &Report, style: &Style) -> io::Result<()> {
    let run = &report.run;
    writeln!(out, "{}", style.bold("Summary"))?;
    let refused: Vec<&TaskReport> = run
        .tasks
        .iter()
        .filter(|t| matches!(t.outcome, Outcome::Refused { .. }))
        .collect();
    writeln!(
        out,
        "  tasks        {}: {} granted, {} refused",
        run.tasks.len(),
        run.tasks.len() - refused.len(),
        refused.len()
    )?;
    for task in &refused {
        if let Outcome::Refused { reason, error } = &task.outcome {
            writeln!(
                out,
                "  {} {}  {}",
                style.red("refused"),
                task.task,
                reason.replace('_', " ")
            )?;
            for line in wrap(error, WIDTH - 4) {
                writeln!(out, "    {}", style.dim(&line))?;
            }
        }
    }
    let capacity = report.gpus.len() as u64 * run.end.max(1);
    writeln!(
        out,
        "  utilization  {}% of {} GPUs over {}s",
        run.busy_gpu_seconds * 100 / capacity.max(1),
        report.gpus.len(),
        run.end
    )?;
    let c = &run.comparison;
    writeln!(
        out,
        "  vs first-fit {} multi-GPU grants: total score {} against first-fit's {}",
        c.multi_gpu_grants, c.chosen_score, c.first_fit_score
    )?;
    writeln!(
        out,
        "               (better {}, same {}, worse {}; same free GPUs each time)",
        c.better, c.same, c.worse
    )?;
    let other = &report.other_policy;
    let other_refused = other
        .tasks
        .iter()
        .filter(|t| matches!(t.outcome, Outcome::Refused { .. }))
        .count();
    writeln!(
        out,
        "  {:<12} the whole stream with {}: {} granted, {} refused, score {}",
        "rerun",
        other.policy,
        other.tasks.len() - other_refused,
        other_refused,
        other.comparison.chosen_score
    )?;
    let counters = &run.counters;
    writeln!(
        out,
        "  allocator    {} calls, {} GPUs granted, {} released",
        counters.requests, counters.granted, counters.released
    )?;
    writeln!(
        out,
        "               refused: {} bad request, {} not enough",
        counters.refused.bad_request, counters.refused.not_enough
    )?;
    writeln!(
        out,
        "  {}",
        style.dim("--json prints all of this, with every rule, mount and argument")
    )
}

/// `0,3` for `[0, 3]`.
fn list(gpus: &[u32]) -> String {
    gpus.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Words packed into lines of at most `width` characters (a longer word gets its own line).
fn pack(words: &[String], width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in words.iter().filter(|w| !w.is_empty()) {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// Text wrapped at spaces to `width`.
fn wrap(text: &str, width: usize) -> Vec<String> {
    pack(
        &text
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>(),
        width,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_keeps_lines_within_the_width() {
        let words: Vec<String> = "a bb ccc dddd eeeee"
            .split(' ')
            .map(str::to_owned)
            .collect();
        assert_eq!(pack(&words, 7), ["a bb", "ccc", "dddd", "eeeee"]);
        let long = "--env=X=GPU-aaaaaaaa,GPU-bbbbbbbb,GPU-cccccccc".to_owned();
        let words = ["-a".to_owned(), long.clone(), "img".to_owned()];
        assert_eq!(pack(&words, 22), ["-a", long.as_str(), "img"], "never cut");
    }
}
