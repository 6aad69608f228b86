//! The one mutation engine behind parasim's stable fuzz targets (issue 38: fuzzing that runs),
//! and the campaign runner that gives every target the same oracle and the same time budget.
//!
//! A target takes real inputs from the checkout (scenarios, model files, suite families,
//! traces, the hostile catalog's files) as seeds and applies one to eight [`Edit`]s to one of
//! them: replace, delete, insert (random text, or a token of the seeds' own words and of
//! values that are hostile to parsers, such as `1e308`, `-1` or `nan`) or duplicate. The
//! [`Campaign`] runs a property on those mutants for `FUZZ_SECONDS` seconds (unset: 128 cases,
//! as a plain `cargo test` does) and holds every input to the same oracle:
//!
//! - no panic: a panic fails the property, and proptest shrinks the input to a minimal one
//!   (fewer, smaller edits), printed as the text that failed, ready to paste into a test;
//! - no hang: a watchdog aborts the process when one input uses more than
//!   `FUZZ_CASE_SECONDS` (default 10) of CPU time on its thread, or six times that of wall
//!   time, printing that input;
//! - no huge allocation: the same watchdog aborts when the process's resident memory passes
//!   `FUZZ_RSS_MB` (default 2048), printing the input that was running; the documented
//!   commands also run under `ulimit -v` so that an allocation that is never touched aborts;
//! - clean errors: [`names_one_of`] checks that an error message renders and names the file or
//!   key it is about.
//!
//! ```
//! use proptest::prelude::*;
//! let seeds = vec!["[cluster]\nnodes = 2\n".to_string()];
//! let cases = fuzzing::Campaign::new("example", 0).run(fuzzing::mutated_text(seeds), |text| {
//!     let parsed: Result<toml::Table, _> = toml::from_str(&text);
//!     if let Err(error) = parsed {
//!         prop_assert!(!error.to_string().is_empty());
//!     }
//!     Ok(())
//! });
//! assert_eq!(cases, 128);
//! ```

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// One edit of a sequence (the characters of a text, or the bytes of a binary file).
#[derive(Debug, Clone)]
pub enum Edit<T> {
    /// Replace the element at the index.
    Replace(prop::sample::Index, T),
    /// Delete up to this many elements from the index.
    Delete(prop::sample::Index, usize),
    /// Insert these elements at the index.
    Insert(prop::sample::Index, Vec<T>),
    /// Insert the chosen dictionary token (a word of the seeds, or a hostile value) at the index.
    Token(prop::sample::Index, prop::sample::Index),
    /// Copy up to this many elements from the index to just after them.
    Duplicate(prop::sample::Index, usize),
}

/// `seed` with `edits` applied in order; `dictionary` holds the tokens of [`Edit::Token`].
pub fn mutate<T: Clone>(seed: &[T], edits: &[Edit<T>], dictionary: &[Vec<T>]) -> Vec<T> {
    let mut items = seed.to_vec();
    for edit in edits {
        if items.is_empty() {
            break;
        }
        match edit {
            Edit::Replace(i, item) => {
                let at = i.index(items.len());
                items[at] = item.clone();
            }
            Edit::Delete(i, n) => {
                let at = i.index(items.len());
                let end = at.saturating_add(*n).min(items.len());
                items.drain(at..end);
            }
            Edit::Insert(i, new) => {
                let at = i.index(items.len());
                items.splice(at..at, new.iter().cloned());
            }
            Edit::Token(i, token) => {
                if dictionary.is_empty() {
                    continue;
                }
                let at = i.index(items.len());
                items.splice(at..at, dictionary[token.index(dictionary.len())].iter().cloned());
            }
            Edit::Duplicate(i, n) => {
                let at = i.index(items.len());
                let end = at.saturating_add(*n).min(items.len());
                let copy = items[at..end].to_vec();
                items.splice(end..end, copy);
            }
        }
    }
    items
}

/// Values that break careless parsers and validators: extremes, signs, non-numbers, empty
/// containers, units, escapes. Every dictionary has them.
pub const HOSTILE_TOKENS: [&str; 30] = [
    "0",
    "-1",
    "1e308",
    "-1e308",
    "1e-308",
    "nan",
    "inf",
    "-inf",
    "18446744073709551615",
    "9223372036854775807",
    "-9223372036854775808",
    "4294967296",
    "2147483648",
    "0.0",
    "\"\"",
    "[]",
    "{}",
    "[[",
    "= ",
    ".",
    "..",
    "/",
    "../",
    "\\u0000",
    "\"100000 s\"",
    "\"0 B\"",
    "\"1 PiB\"",
    "\"400 Gb/s\"",
    "true",
    "\n[",
];

/// The tokens of a text dictionary: [`HOSTILE_TOKENS`] and every distinct word of `seeds`
/// (runs of letters, digits, `-`, `_` and `.`, so key names such as `link-bandwidth` and
/// values such as `resnet50` are inserted whole).
pub fn words(seeds: &[String]) -> Vec<Vec<char>> {
    let mut found = std::collections::BTreeSet::new();
    for seed in seeds {
        for word in seed.split(|c: char| !(c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
            if (2..=40).contains(&word.len()) {
                found.insert(word.to_string());
            }
        }
    }
    HOSTILE_TOKENS.iter().map(|t| t.to_string()).chain(found).map(|t| t.chars().collect()).collect()
}

/// One to eight edits of a text: any character, deletions of up to 40, insertions of
/// TOML-ish text or of a dictionary token, duplications of up to 200 characters.
pub fn text_edits() -> impl Strategy<Value = Vec<Edit<char>>> {
    let edit = prop_oneof![
        1 => (any::<prop::sample::Index>(), prop::char::any()).prop_map(|(i, c)| Edit::Replace(i, c)),
        1 => (any::<prop::sample::Index>(), 1usize..40).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => (any::<prop::sample::Index>(), "[0-9a-z\\[\\]=\". \\n,{}-]{1,12}")
            .prop_map(|(i, s)| Edit::Insert(i, s.chars().collect())),
        2 => (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(|(i, t)| Edit::Token(i, t)),
        1 => (any::<prop::sample::Index>(), 1usize..200).prop_map(|(i, n)| Edit::Duplicate(i, n)),
    ];
    prop::collection::vec(edit, 1..8)
}

/// One to eight edits of a byte string: any byte, deletions of up to 64, insertions of up to 16
/// random bytes or of a dictionary token, duplications of up to 256 bytes.
pub fn byte_edits() -> impl Strategy<Value = Vec<Edit<u8>>> {
    let edit = prop_oneof![
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Replace(i, b)),
        (any::<prop::sample::Index>(), 1usize..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(|(i, t)| Edit::Token(i, t)),
        (any::<prop::sample::Index>(), 1usize..256).prop_map(|(i, n)| Edit::Duplicate(i, n)),
    ];
    prop::collection::vec(edit, 1..8)
}

/// Mutants of `seeds`: one seed with [`text_edits`] applied (tokens from [`words`] of all
/// seeds), as the seed's index and the mutated text itself, so a failure prints the text.
///
/// # Panics
/// If `seeds` is empty (a target without seeds is a bug in the target).
pub fn text_mutants(seeds: Vec<String>) -> impl Strategy<Value = (usize, String)> {
    assert!(!seeds.is_empty(), "a fuzz target needs at least one seed");
    let dictionary = Arc::new(words(&seeds));
    let seeds: Arc<Vec<Vec<char>>> = Arc::new(seeds.iter().map(|s| s.chars().collect()).collect());
    (0..seeds.len(), text_edits()).prop_map(move |(seed, edits)| {
        (seed, mutate(&seeds[seed], &edits, &dictionary).into_iter().collect())
    })
}

/// The texts of [`text_mutants`] alone.
pub fn mutated_text(seeds: Vec<String>) -> impl Strategy<Value = String> {
    text_mutants(seeds).prop_map(|(_, text)| text)
}

/// Mutants of binary `seeds`: one seed with [`byte_edits`] applied (tokens: the
/// [`HOSTILE_TOKENS`] as bytes), as the seed's index and the mutated bytes.
///
/// # Panics
/// If `seeds` is empty.
pub fn byte_mutants(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = (usize, Vec<u8>)> {
    assert!(!seeds.is_empty(), "a fuzz target needs at least one seed");
    let dictionary: Arc<Vec<Vec<u8>>> =
        Arc::new(HOSTILE_TOKENS.iter().map(|t| t.as_bytes().to_vec()).collect());
    let seeds = Arc::new(seeds);
    (0..seeds.len(), byte_edits())
        .prop_map(move |(seed, edits)| (seed, mutate(&seeds[seed], &edits, &dictionary)))
}

/// Checks the oracle's "clean error": the message renders (not empty, no Rust debug dump) and
/// names one of `names` (the file, the flag, the key or the value it is about), as given or
/// quoted with escapes (a message quotes a bad value `."1K` as `".\"1K"`).
pub fn names_one_of(message: &str, names: &[&str]) -> Result<(), TestCaseError> {
    prop_assert!(!message.trim().is_empty(), "an empty error message");
    prop_assert!(!message.contains("panicked"), "an error that reports a panic: {message}");
    let quoted = |name: &str| format!("{name:?}");
    prop_assert!(
        names.iter().any(|name| message.contains(name) || message.contains(&quoted(name))),
        "the error names none of {names:?}: {message}"
    );
    Ok(())
}

/// The input a campaign is running now and since when, for the watchdog.
type Running = Mutex<Option<(Instant, Option<Duration>, Box<dyn Debug + Send>)>>;

/// The CPU clock of one thread: its user and system time, read from Linux's
/// `/proc/self/task/TID/stat` (in clock ticks, 10 ms each), so that the watchdog on another
/// thread can tell an input that computes from one that waits behind other processes.
#[derive(Debug, Clone)]
struct ThreadClock {
    stat: PathBuf,
}

impl ThreadClock {
    /// The calling thread's clock, or `None` off Linux (or where `/proc` cannot be read).
    fn current() -> Option<ThreadClock> {
        let link = std::fs::read_link("/proc/thread-self").ok()?;
        let tid = link.file_name()?.to_str()?.to_string();
        let clock = ThreadClock { stat: PathBuf::from(format!("/proc/self/task/{tid}/stat")) };
        clock.read().map(|_| clock)
    }

    /// CPU time the thread has used so far.
    fn read(&self) -> Option<Duration> {
        let stat = fs_err::read_to_string(&self.stat).ok()?;
        // The command name (field 2) is in parentheses and may hold spaces: count after it.
        let rest = &stat[stat.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace();
        // Fields 14 and 15 of the line are the 12th and 13th after the name.
        let user: u64 = fields.nth(11)?.parse().ok()?;
        let system: u64 = fields.next()?.parse().ok()?;
        // Linux reports these in USER_HZ, 100 per second on every architecture it exports.
        Some(Duration::from_millis((user + system) * 10))
    }
}

/// How much longer than the CPU limit an input may take in wall time (waiting on the machine,
/// or blocked without computing) before the watchdog calls it a hang all the same.
const WALL_FACTOR: u32 = 6;

/// A time-budgeted fuzzing campaign: one target's property run on fresh batches of mutants
/// until the budget is spent, under the watchdog's time and memory limits.
#[derive(Debug, Clone)]
pub struct Campaign {
    name: String,
    seconds: u64,
    default_cases: u32,
    case_limit: Duration,
    rss_cap_bytes: u64,
    seed: Seed,
}

/// A fresh seed from the operating system (std's randomly keyed hasher, which reads it once
/// per process and then counts up, mixed with the clock).
fn entropy() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    hasher.write_u128(nanos);
    hasher.finish()
}

/// Where a campaign's batches get their random seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seed {
    /// Batch `i` is seeded with `n + i`: the same cases on every run (CI, a plain
    /// `cargo test`, a reproduction), in the same order, so a run that passed passes again.
    Fixed(u64),
    /// Each batch seeded from the operating system: a campaign that explores; a failure prints
    /// its batch's seed, so `FUZZ_SEED` reproduces it.
    Random,
}

impl Campaign {
    /// A campaign named `name` (the test's name, for the report) of `seconds` seconds
    /// (0: one batch of 128 cases), with the default limits: 10 s per input, 2 GiB resident.
    pub fn new(name: &str, seconds: u64) -> Campaign {
        Campaign {
            name: name.into(),
            seconds,
            default_cases: 128,
            case_limit: Duration::from_secs(10),
            rss_cap_bytes: 2 << 30,
            seed: Seed::Fixed(0),
        }
    }

    /// The campaign the environment asks for: `FUZZ_SECONDS` (unset: 128 cases),
    /// `FUZZ_CASE_SECONDS` (default 10), `FUZZ_RSS_MB` (default 2048) and `FUZZ_SEED` (a
    /// number: fixed seeds from it; `random`: fresh seeds per batch; unset: fixed seeds from 0
    /// without a budget, as in a plain `cargo test`, and fresh seeds for a timed campaign).
    ///
    /// # Panics
    /// When `FUZZ_SEED` is neither a whole number nor `random` (a campaign that silently ran
    /// other seeds than asked would not reproduce a finding).
    pub fn from_env(name: &str) -> Campaign {
        let number = |key: &str| std::env::var(key).ok().and_then(|s| s.trim().parse::<u64>().ok());
        let mut campaign = Campaign::new(name, number("FUZZ_SECONDS").unwrap_or(0));
        campaign.seed = match std::env::var("FUZZ_SEED") {
            Ok(text) if text.trim().eq_ignore_ascii_case("random") => Seed::Random,
            Ok(text) => match text.trim().parse::<u64>() {
                Ok(seed) => Seed::Fixed(seed),
                Err(_) => panic!("FUZZ_SEED={text:?}: give a whole number (fixed seeds) or `random`"),
            },
            Err(_) if campaign.seconds == 0 => Seed::Fixed(0),
            Err(_) => Seed::Random,
        };
        if let Some(seconds) = number("FUZZ_CASE_SECONDS") {
            campaign.case_limit = Duration::from_secs(seconds.max(1));
        }
        if let Some(megabytes) = number("FUZZ_RSS_MB") {
            campaign.rss_cap_bytes = megabytes.saturating_mul(1 << 20);
        }
        campaign
    }

    /// The cases run without a budget (`FUZZ_SECONDS` unset, as in a plain `cargo test`):
    /// 128 unless a target whose inputs are slow to check (a trace to import, a benchmark to
    /// run) asks for fewer, to keep the debug test suite fast.
    pub fn with_default_cases(mut self, cases: u32) -> Campaign {
        self.default_cases = cases.max(1);
        self
    }

    /// Where the batches' seeds come from.
    pub fn with_seed(mut self, seed: Seed) -> Campaign {
        self.seed = seed;
        self
    }

    /// The limit of one input's run (a longer one is a hang).
    pub fn with_case_limit(mut self, limit: Duration) -> Campaign {
        self.case_limit = limit;
        self
    }

    /// Runs `property` on mutants drawn from `strategy`: batches of 1,000 freshly seeded cases
    /// until the budget is spent (one batch of the default cases without a budget). Returns the cases run and
    /// prints them, with the rate, on standard error.
    ///
    /// # Panics
    /// When the property fails (a panic inside it, or a `prop_assert!`), with the minimal
    /// failing input; the watchdog aborts the process on a hang or a memory blow-up.
    pub fn run<S>(&self, strategy: S, property: impl Fn(S::Value) -> Result<(), TestCaseError>) -> u64
    where
        S: Strategy,
        S::Value: Clone + Send + 'static,
    {
        let running: Arc<Running> = Arc::new(Mutex::new(None));
        let done = Arc::new(AtomicBool::new(false));
        let clock = ThreadClock::current();
        let watchdog = {
            let (running, done, this, clock) =
                (Arc::clone(&running), Arc::clone(&done), self.clone(), clock.clone());
            std::thread::spawn(move || this.watch(&running, &done, clock.as_ref()))
        };
        let start = Instant::now();
        let deadline = start + Duration::from_secs(self.seconds);
        let mut cases = 0u64;
        let mut index = 0u64;
        loop {
            let batch = if self.seconds == 0 { self.default_cases } else { 1000 };
            let seed = match self.seed {
                Seed::Fixed(first) => first.wrapping_add(index),
                Seed::Random => entropy(),
            };
            index += 1;
            let mut runner = TestRunner::new(Config {
                cases: batch,
                failure_persistence: None,
                // Enough to shrink a finding to a few small edits, without minutes of shrinking.
                max_shrink_iters: 2048,
                rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
                ..Config::default()
            });
            let result = runner.run(&strategy, |value| {
                let cpu = clock.as_ref().and_then(ThreadClock::read);
                set(&running, Some((Instant::now(), cpu, Box::new(value.clone()))));
                let outcome = property(value);
                set(&running, None);
                outcome
            });
            if let Err(error) = result {
                done.store(true, Ordering::Relaxed);
                panic!("{}: {error} (this batch's seed: rerun with FUZZ_SEED={seed})", self.name);
            }
            cases += u64::from(batch);
            if Instant::now() >= deadline {
                break;
            }
        }
        done.store(true, Ordering::Relaxed);
        let _ = watchdog.join();
        let seconds = start.elapsed().as_secs_f64();
        eprintln!(
            "{}: {cases} cases in {seconds:.0} s ({:.0} cases/s), no failure",
            self.name,
            cases as f64 / seconds.max(1e-9)
        );
        cases
    }

    /// The watchdog: every 50 ms, the running input's age and the process's resident memory.
    /// What the watchdog finds in an input that has used `cpu` of its thread's CPU time (if
    /// known) and `wall` of wall time while the process holds `resident` bytes: a hang, a huge
    /// allocation, or nothing.
    fn finding(&self, cpu: Option<Duration>, wall: Duration, resident: Option<u64>) -> Option<String> {
        let wall_limit = if cpu.is_some() { self.case_limit * WALL_FACTOR } else { self.case_limit };
        if cpu.is_some_and(|cpu| cpu > self.case_limit) {
            Some(format!("a hang: one input used more than {:?} of CPU time", self.case_limit))
        } else if wall > wall_limit {
            Some(format!("a hang: one input ran for more than {wall_limit:?} of wall time"))
        } else {
            resident.filter(|&r| r > self.rss_cap_bytes).map(|resident| {
                format!(
                    "a huge allocation: {} MiB resident, over the cap of {} MiB",
                    resident >> 20,
                    self.rss_cap_bytes >> 20
                )
            })
        }
    }

    /// Until `done`: every 50 ms, aborts the process with the running input when it has
    /// used more than the case limit of CPU time on its thread (`clock`), or more than
    /// [`WALL_FACTOR`] times the limit of wall time (an input that blocks, or a machine too
    /// loaded to tell; without a thread clock, the limit itself), or when the process's
    /// resident memory passes the cap. CPU time, not wall time, is what makes an input slow:
    /// on a machine shared with builds a quick input can wait seconds for a core.
    fn watch(&self, running: &Running, done: &AtomicBool, clock: Option<&ThreadClock>) {
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            let resident = resident_bytes();
            let used = clock.and_then(ThreadClock::read);
            let guard = running.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some((since, cpu_at_start, input)) = guard.as_ref() else { continue };
            let cpu = match (used, cpu_at_start) {
                (Some(now), Some(start)) => Some(now.saturating_sub(*start)),
                _ => None,
            };
            let Some(finding) = self.finding(cpu, since.elapsed(), resident) else { continue };
            // Straight to the process's stderr: the test harness captures `eprintln!` of every
            // thread a test spawns, and a capture is lost when the process aborts.
            use std::io::Write;
            let _ = writeln!(std::io::stderr().lock(), "{}: {finding}; the input:\n{input:?}", self.name);
            std::process::abort();
        }
    }
}

fn set(running: &Running, value: Option<(Instant, Option<Duration>, Box<dyn Debug + Send>)>) {
    *running.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = value;
}

/// The process's resident memory (Linux `/proc/self/statm`), or `None` where it cannot be read.
fn resident_bytes() -> Option<u64> {
    let statm = fs_err::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The checkout's root folder (seeds are read from it at run time).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every file under `folder` (relative to the checkout, recursively) whose name ends with
/// `suffix` and that is at most `max_bytes` long, sorted by path: a target's seeds.
pub fn seed_files(folder: &str, suffix: &str, max_bytes: u64) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut pending = vec![root().join(folder)];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs_err::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.to_string_lossy().ends_with(suffix)
                && entry.metadata().is_ok_and(|m| m.len() <= max_bytes)
                && let Ok(bytes) = fs_err::read(&path)
            {
                found.push((path, bytes));
            }
        }
    }
    found.sort();
    found
}

/// The texts of seed files (see [`seed_files`]) that are UTF-8.
pub fn seed_texts(folder: &str, suffix: &str, max_bytes: u64) -> Vec<String> {
    seed_files(folder, suffix, max_bytes)
        .into_iter()
        .filter_map(|(_, bytes)| String::from_utf8(bytes).ok())
        .collect()
}

/// The `text` files of the hostile catalog (`tests/hostile/cases.toml`) whose case attacks
/// `format` (`scenario`, `model`, `suite`, `kineto`...): inputs already known to be hostile.
pub fn hostile_texts(format: &str) -> Vec<String> {
    let Ok(text) = fs_err::read_to_string(root().join("tests/hostile/cases.toml")) else { return Vec::new() };
    let Ok(catalog) = toml::from_str::<toml::Table>(&text) else { return Vec::new() };
    let cases = catalog.get("case").and_then(|c| c.as_array()).map(Vec::as_slice).unwrap_or_default();
    cases
        .iter()
        .filter(|case| case.get("format").and_then(|f| f.as_str()) == Some(format))
        .flat_map(|case| case.get("files").and_then(|f| f.as_array()).cloned().unwrap_or_default())
        .filter_map(|file| file.get("text").and_then(|t| t.as_str()).map(str::to_string))
        .filter(|text| text.len() < 100_000)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_apply_at_their_indices() {
        use proptest::strategy::ValueTree;
        let mut runner = TestRunner::deterministic();
        let seed: Vec<char> = "abcdefgh".chars().collect();
        let dictionary = vec!["XY".chars().collect::<Vec<char>>()];
        for _ in 0..50 {
            let i = any::<prop::sample::Index>().new_tree(&mut runner).expect("an index").current();
            let at = i.index(seed.len());
            let text = |edits: Vec<Edit<char>>| -> String {
                mutate(&seed, &edits, &dictionary).into_iter().collect()
            };
            assert_eq!(text(vec![Edit::Delete(i, usize::MAX)]), "abcdefgh"[..at]);
            assert_eq!(text(vec![Edit::Replace(i, 'z')]).chars().nth(at), Some('z'));
            let inserted = text(vec![Edit::Token(i, i)]);
            assert_eq!(&inserted[at..at + 2], "XY");
            assert_eq!(inserted.len(), 10);
            let doubled = text(vec![Edit::Duplicate(i, 3)]);
            let copied = 3.min(8 - at);
            assert_eq!(doubled.len(), 8 + copied);
            assert_eq!(doubled[at..at + copied], doubled[at + copied..at + 2 * copied]);
        }
    }

    /// The cases one campaign draws, in order.
    fn drawn(seed: Seed) -> Vec<u64> {
        let seen = Mutex::new(Vec::new());
        Campaign::new("seeds", 0).with_default_cases(20).with_seed(seed).run(any::<u64>(), |value| {
            seen.lock().expect("the list").push(value);
            Ok(())
        });
        seen.into_inner().expect("the list")
    }

    #[test]
    fn a_fixed_seed_draws_the_same_cases_and_another_seed_others() {
        let first = drawn(Seed::Fixed(7));
        assert_eq!(first.len(), 20);
        assert_eq!(first, drawn(Seed::Fixed(7)));
        assert_ne!(first, drawn(Seed::Fixed(8)));
        assert_ne!(drawn(Seed::Random), drawn(Seed::Random));
    }

    #[test]
    fn a_failure_names_the_seed_that_reproduces_it() {
        let outcome = std::panic::catch_unwind(|| {
            Campaign::new("fails", 0)
                .with_seed(Seed::Fixed(41))
                .run(any::<u8>(), |_| Err(TestCaseError::fail("always")))
        });
        let payload = outcome.expect_err("the property fails on its first case");
        let message = payload.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("FUZZ_SEED=41"), "{message}");
    }

    #[test]
    fn a_thread_clock_counts_computing_not_waiting() {
        let clock = ThreadClock::current();
        if !cfg!(target_os = "linux") {
            return;
        }
        let clock = clock.expect("Linux has /proc/thread-self");
        let before = clock.read().expect("a reading");
        // Compute until the clock shows 200 ms (however long a loaded machine takes to give
        // them), within a minute of wall time.
        let start = Instant::now();
        let mut x = 0u64;
        while clock.read().expect("a reading") - before < Duration::from_millis(200) {
            assert!(start.elapsed() < Duration::from_secs(60), "the clock did not advance while computing");
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let computed = clock.read().expect("a reading");
        std::thread::sleep(Duration::from_millis(400));
        let waited = clock.read().expect("a reading") - computed;
        // Sleeping does not count (up to a tick or two of rounding).
        assert!(waited <= Duration::from_millis(30), "{waited:?} for 400 ms of sleep");
    }

    #[test]
    fn the_watchdog_judges_cpu_time_and_gives_wall_time_a_margin() {
        let campaign = Campaign::new("w", 0).with_case_limit(Duration::from_secs(10));
        let s = Duration::from_secs;
        // An input waiting for a core: 30 s of wall time, 2 s of CPU: not a hang.
        assert_eq!(campaign.finding(Some(s(2)), s(30), Some(1 << 20)), None);
        // One that computes past the limit is, whatever the wall time.
        let hang = campaign.finding(Some(s(11)), s(12), None).expect("a hang");
        assert!(hang.contains("CPU time"), "{hang}");
        // One that blocks without computing is, past the margin.
        let blocked = campaign.finding(Some(s(0)), s(61), None).expect("a hang");
        assert!(blocked.contains("wall time"), "{blocked}");
        // Without a thread clock, the wall-time limit is the limit.
        assert!(campaign.finding(None, s(11), None).is_some());
        assert_eq!(campaign.finding(None, s(9), None), None);
        // Memory past the cap.
        let huge = campaign.finding(Some(s(0)), s(0), Some(3 << 30)).expect("a finding");
        assert!(huge.contains("huge allocation"), "{huge}");
    }

    #[test]
    fn the_oracle_wants_a_name() {
        assert!(names_one_of("a.toml: bad key", &["a.toml"]).is_ok());
        assert!(names_one_of("bad key", &["a.toml"]).is_err());
        assert!(names_one_of("  ", &[""]).is_err());
        // A value the message quotes with escapes is named.
        assert!(names_one_of("size \".\\\"1K\": no number", &[".\"1K"]).is_ok());
    }

    #[test]
    fn a_failing_property_fails_the_campaign_with_the_input() {
        let result = std::panic::catch_unwind(|| {
            Campaign::new("always-fails", 0).run(mutated_text(vec!["abc".into()]), |text| {
                prop_assert!(text.is_empty(), "not empty");
                Ok(())
            })
        });
        assert!(result.is_err());
    }

    #[test]
    fn dictionaries_hold_the_seeds_words_and_hostile_values() {
        let words: Vec<String> = words(&["link-bandwidth = \"400 Gb/s\"".into()])
            .into_iter()
            .map(|w| w.into_iter().collect())
            .collect();
        assert!(words.contains(&"link-bandwidth".to_string()));
        assert!(words.contains(&"1e308".to_string()));
    }
}
