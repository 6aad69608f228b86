//! Progress of long commands on standard error, one helper for all of them (`validate`,
//! `plan`, `replay`): on a terminal an indicatif bar; elsewhere (a CI log, a batch job, a
//! pipe) a plain line every period (5 s, or `PARASIM_PROGRESS_PERIOD_MS`):
//!
//! ```text
//! validate: 120/350 cases, 11.2 s elapsed, ETA 21 s (last: nccl-tests/allreduce-8)
//! plan: final 3/14 flow simulations, 25.0 s elapsed, ETA 58 s (the best 14 screened ...)
//! replay: reading 41/98 MB, 10.0 s elapsed, ETA 14 s (2/8 files, 1234567 events)
//! ```
//!
//! Nothing is printed by a run shorter than one period, nothing with `--quiet`, and never
//! anything on standard output: reports are compared byte for byte. A write error (standard
//! error closed) is ignored, never a panic, never a changed exit status.

use std::io::{IsTerminal, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// The environment variable that sets the period of the plain lines, in milliseconds (tests
/// shorten it).
pub const PERIOD_ENV: &str = "PARASIM_PROGRESS_PERIOD_MS";

/// The period of the plain lines when `PARASIM_PROGRESS_PERIOD_MS` is not set.
const DEFAULT_PERIOD: Duration = Duration::from_secs(5);

/// What the command is doing now.
#[derive(Debug, Clone)]
struct State {
    /// The stage's name (empty for a one-stage command).
    stage: String,
    /// What is counted ("cases", "configurations"); empty when nothing is.
    unit: String,
    /// How many there are, when known.
    total: Option<u64>,
    /// How many are done.
    position: u64,
    /// A note after the counts (the last case, the best so far).
    message: String,
    /// When the stage began (its rate gives the ETA).
    stage_started: Instant,
}

/// Progress of one command; finished (the bar cleared, the ticker stopped) when dropped.
pub struct Progress {
    state: Arc<Mutex<State>>,
    bar: Option<ProgressBar>,
    ticker: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

impl Progress {
    /// Progress of `command` (the prefix of its lines): a bar when standard error is a
    /// terminal, plain lines otherwise, nothing when `quiet`.
    pub fn new(command: &'static str, quiet: bool) -> Progress {
        let state = Arc::new(Mutex::new(State {
            stage: String::new(),
            unit: String::new(),
            total: None,
            position: 0,
            message: String::new(),
            stage_started: Instant::now(),
        }));
        let started = Instant::now();
        let mut progress = Progress { state, bar: None, ticker: None };
        if quiet {
            return progress;
        }
        if std::io::stderr().is_terminal() {
            progress.bar = Some(ProgressBar::new_spinner());
            return progress;
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let state = Arc::clone(&progress.state);
        let handle = std::thread::Builder::new().name("progress".into()).spawn(move || {
            let period = period();
            // The first line comes one period in: a short run prints none.
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                let line = match state.lock() {
                    Ok(state) => line(command, started.elapsed(), &state),
                    Err(_) => return,
                };
                let _ = writeln!(std::io::stderr().lock(), "{line}");
            }
        });
        if let Ok(handle) = handle {
            progress.ticker = Some((stop, handle));
        }
        progress
    }

    /// Enters (or stays in) `stage`, counting `unit` out of `total`: resets the count when
    /// the stage or its unit changes; a new total of the same stage keeps the count.
    pub fn stage(&self, stage: &str, unit: &str, total: Option<u64>) {
        let Ok(mut state) = self.state.lock() else { return };
        if state.stage == stage && state.unit == unit {
            // A new total in the same stage (plan's final learns how many could still win):
            // the count and the rate, so the ETA, go on.
            if state.total != total {
                state.total = total;
                if let (Some(bar), Some(total)) = (&self.bar, total) {
                    bar.set_length(total);
                }
            }
            return;
        }
        *state = State {
            stage: stage.to_string(),
            unit: unit.to_string(),
            total,
            position: 0,
            message: String::new(),
            stage_started: Instant::now(),
        };
        if let Some(bar) = &self.bar {
            let stage = if stage.is_empty() { String::new() } else { format!("{stage} ") };
            let template = match total {
                Some(total) => {
                    bar.set_length(total);
                    format!(
                        "{stage}{{bar:40}} {{pos}}/{{len}} {unit}, {{elapsed}} elapsed, ETA {{eta}}  {{msg}}"
                    )
                }
                None => {
                    bar.enable_steady_tick(Duration::from_millis(200));
                    let count = if unit.is_empty() { String::new() } else { format!("{{pos}} {unit}, ") };
                    format!("{{spinner}} {stage}{count}{{elapsed}} elapsed  {{msg}}")
                }
            };
            if let Ok(style) = ProgressStyle::with_template(&template) {
                bar.set_style(style);
            }
            bar.set_position(0);
            bar.set_message("");
        }
    }

    /// Sets how many are done.
    pub fn set_position(&self, position: u64) {
        if let Ok(mut state) = self.state.lock() {
            state.position = position;
        }
        if let Some(bar) = &self.bar {
            bar.set_position(position);
        }
    }

    /// Counts one more done, with a note (the case just finished).
    pub fn inc(&self, message: &str) {
        if let Ok(mut state) = self.state.lock() {
            state.position += 1;
            state.message = message.to_string();
        }
        if let Some(bar) = &self.bar {
            bar.set_message(message.to_string());
            bar.inc(1);
        }
    }

    /// Sets the note after the counts.
    pub fn set_message(&self, message: &str) {
        if let Ok(mut state) = self.state.lock() {
            state.message = message.to_string();
        }
        if let Some(bar) = &self.bar {
            bar.set_message(message.to_string());
        }
    }

    /// Clears the bar and stops the lines (what dropping it does).
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some((stop, handle)) = self.ticker.take() {
            let _ = stop.send(());
            let _ = handle.join();
        }
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// The period of the plain lines: `PARASIM_PROGRESS_PERIOD_MS`, else 5 s.
fn period() -> Duration {
    std::env::var(PERIOD_ENV)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(DEFAULT_PERIOD, Duration::from_millis)
}

/// A duration as the lines print it: `9.4 s`, `3 min 20 s`.
fn duration(d: Duration) -> String {
    let seconds = d.as_secs_f64();
    if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else if seconds < 3600.0 {
        format!("{} min {} s", (seconds / 60.0) as u64, (seconds % 60.0) as u64)
    } else {
        format!("{} h {} min", (seconds / 3600.0) as u64, ((seconds % 3600.0) / 60.0) as u64)
    }
}

/// One plain line: `command: [stage ][done/total unit], elapsed[, ETA] [(note)]`.
fn line(command: &str, elapsed: Duration, state: &State) -> String {
    let mut head = Vec::new();
    if !state.stage.is_empty() {
        head.push(state.stage.clone());
    }
    let mut eta = None;
    match state.total {
        Some(total) => {
            let unit = if state.unit.is_empty() { String::new() } else { format!(" {}", state.unit) };
            head.push(format!("{}/{total}{unit}", state.position));
            if state.position > 0 && state.position < total {
                let per = state.stage_started.elapsed().as_secs_f64() / state.position as f64;
                eta = Some(Duration::from_secs_f64(per * (total - state.position) as f64));
            }
        }
        None if !state.unit.is_empty() => head.push(format!("{} {}", state.position, state.unit)),
        None => {}
    }
    let mut text = format!("{command}: ");
    if !head.is_empty() {
        text += &head.join(" ");
        text += ", ";
    }
    text += &format!("{} elapsed", duration(elapsed));
    if let Some(eta) = eta {
        text += &format!(", ETA {}", duration(eta));
    }
    if !state.message.is_empty() {
        text += &format!(" ({})", state.message);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(stage: &str, unit: &str, total: Option<u64>, position: u64, message: &str) -> State {
        State {
            stage: stage.into(),
            unit: unit.into(),
            total,
            position,
            message: message.into(),
            stage_started: Instant::now(),
        }
    }

    #[test]
    fn lines_name_the_command_the_stage_the_counts_and_the_time() {
        let elapsed = Duration::from_millis(11_200);
        assert_eq!(
            line("validate", elapsed, &state("", "cases", Some(350), 0, "")),
            "validate: 0/350 cases, 11.2 s elapsed"
        );
        let text = line("validate", elapsed, &state("", "cases", Some(350), 120, "last: a/b"));
        assert!(text.starts_with("validate: 120/350 cases, 11.2 s elapsed, ETA "), "{text}");
        assert!(text.ends_with(" (last: a/b)"), "{text}");
        assert_eq!(
            line(
                "replay",
                Duration::from_secs(125),
                &state("reading and simulating 2 traces", "", None, 0, "")
            ),
            "replay: reading and simulating 2 traces, 2 min 5 s elapsed"
        );
        assert_eq!(
            line("plan", elapsed, &state("final", "flow simulations", Some(14), 14, "")),
            "plan: final 14/14 flow simulations, 11.2 s elapsed"
        );
        assert_eq!(line("validate", elapsed, &state("", "", None, 0, "")), "validate: 11.2 s elapsed");
    }
}
