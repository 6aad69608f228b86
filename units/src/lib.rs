//! Physical quantities with their units in the type: simulated time, durations, byte counts,
//! bandwidths, FLOP counts and FLOP rates.
//!
//! Every quantity parses from and prints to human units (`"1.5 us"`, `"200 Gb/s"`,
//! `"25 GB/s"`, `"80 GiB"`, `"312 TFLOP/s"`), so scenario files and reports speak the same
//! language. Time is an integer number of picoseconds: no float drift, equal times compare
//! equal, and arithmetic that would overflow is an error instead of a wrap.
//!
//! ```
//! use units::{Bandwidth, Bytes, SimDuration};
//! let link: Bandwidth = "200 Gb/s".parse().unwrap();
//! let message: Bytes = "1 MiB".parse().unwrap();
//! let time = link.time_to_send(message).unwrap();
//! assert_eq!(time, SimDuration::from_ps(41_943_040));
//! assert_eq!(time.to_string(), "41.943 us");
//! assert_eq!(link.to_string(), "25 GB/s");
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Picoseconds per nanosecond.
const PS_PER_NS: u64 = 1_000;
/// Picoseconds per microsecond.
const PS_PER_US: u64 = 1_000_000;
/// Picoseconds per millisecond.
const PS_PER_MS: u64 = 1_000_000_000;
/// Picoseconds per second.
const PS_PER_S: u64 = 1_000_000_000_000;

/// A quantity could not be read from text, or an arithmetic result does not fit its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// The text is not `<number> <unit>` with a known unit.
    #[error("cannot read {input:?} as {quantity}: {reason}; write a number and one of: {valid}")]
    Parse {
        /// The text as given.
        input: String,
        /// What was expected ("a duration", "a bandwidth", ...).
        quantity: &'static str,
        /// What is wrong with it.
        reason: String,
        /// The accepted units.
        valid: &'static str,
    },
    /// The value is negative, not a number, or too large for its type.
    #[error("{quantity} {input:?} is out of range: {reason}")]
    OutOfRange {
        /// The text or value as given.
        input: String,
        /// What kind of quantity it is.
        quantity: &'static str,
        /// Why it does not fit.
        reason: &'static str,
    },
}

/// Simulated time went past the largest representable instant (about 213 days).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("simulated time overflow: {base} + {added} is past the largest representable time (~213 days)")]
pub struct TimeOverflow {
    /// The time or duration that was added to.
    pub base: SimDuration,
    /// The amount added.
    pub added: SimDuration,
}

/// An instant of simulated time: picoseconds since the start of the simulation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimTime(u64);

/// A length of simulated time, in picoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimDuration(u64);

impl SimTime {
    /// The start of the simulation.
    pub const ZERO: SimTime = SimTime(0);

    /// The instant `ps` picoseconds after the start.
    pub const fn from_ps(ps: u64) -> Self {
        SimTime(ps)
    }

    /// Picoseconds since the start.
    pub const fn as_ps(self) -> u64 {
        self.0
    }

    /// Time since the start, as a duration.
    pub const fn since_start(self) -> SimDuration {
        SimDuration(self.0)
    }

    /// `self + duration`, or an error if that is past the largest representable instant.
    pub fn checked_add(self, duration: SimDuration) -> Result<SimTime, TimeOverflow> {
        self.0
            .checked_add(duration.0)
            .map(SimTime)
            .ok_or(TimeOverflow { base: SimDuration(self.0), added: duration })
    }

    /// The duration from `earlier` to `self`; zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: SimTime) -> SimDuration {
        SimDuration(self.0.saturating_sub(earlier.0))
    }
}

impl SimDuration {
    /// No time at all.
    pub const ZERO: SimDuration = SimDuration(0);
    /// The longest representable duration.
    pub const MAX: SimDuration = SimDuration(u64::MAX);

    /// A duration of `ps` picoseconds.
    pub const fn from_ps(ps: u64) -> Self {
        SimDuration(ps)
    }
    /// A duration of `ns` nanoseconds; saturates at [`SimDuration::MAX`].
    pub const fn from_ns(ns: u64) -> Self {
        SimDuration(ns.saturating_mul(PS_PER_NS))
    }
    /// A duration of `us` microseconds; saturates at [`SimDuration::MAX`].
    pub const fn from_us(us: u64) -> Self {
        SimDuration(us.saturating_mul(PS_PER_US))
    }
    /// A duration of `ms` milliseconds; saturates at [`SimDuration::MAX`].
    pub const fn from_ms(ms: u64) -> Self {
        SimDuration(ms.saturating_mul(PS_PER_MS))
    }

    /// A duration of `seconds`, rounded to the nearest picosecond.
    pub fn from_secs_f64(seconds: f64) -> Result<Self, UnitError> {
        let ps = seconds * PS_PER_S as f64;
        if !ps.is_finite() || ps < 0.0 {
            return Err(UnitError::OutOfRange {
                input: seconds.to_string(),
                quantity: "duration",
                reason: "must be a finite number of seconds, not negative",
            });
        }
        if ps >= u64::MAX as f64 {
            return Err(UnitError::OutOfRange {
                input: format!("{seconds} s"),
                quantity: "duration",
                reason: "longer than the largest representable duration (~213 days)",
            });
        }
        Ok(SimDuration(ps.round() as u64))
    }

    /// Picoseconds in this duration.
    pub const fn as_ps(self) -> u64 {
        self.0
    }

    /// This duration in seconds (for reports; never feed it back into time arithmetic).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / PS_PER_S as f64
    }

    /// `self + other`, or an error on overflow.
    pub fn checked_add(self, other: SimDuration) -> Result<SimDuration, TimeOverflow> {
        self.0.checked_add(other.0).map(SimDuration).ok_or(TimeOverflow { base: self, added: other })
    }

    /// `self * factor`, or an error on overflow.
    pub fn checked_mul(self, factor: u64) -> Result<SimDuration, TimeOverflow> {
        self.0
            .checked_mul(factor)
            .map(SimDuration)
            .ok_or(TimeOverflow { base: self, added: SimDuration(u64::MAX) })
    }

    /// `self + other`, clamped at [`SimDuration::MAX`] (for statistics, not for scheduling).
    pub const fn saturating_add(self, other: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_add(other.0))
    }

    /// `self - other`, clamped at zero.
    pub const fn saturating_sub(self, other: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_sub(other.0))
    }
}

impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.since_start(), f)
    }
}

impl fmt::Display for SimDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ps = self.0;
        let (scale, unit) = if ps >= PS_PER_S || ps == 0 {
            (PS_PER_S, "s")
        } else if ps >= PS_PER_MS {
            (PS_PER_MS, "ms")
        } else if ps >= PS_PER_US {
            (PS_PER_US, "us")
        } else if ps >= PS_PER_NS {
            (PS_PER_NS, "ns")
        } else {
            (1, "ps")
        };
        write_scaled(f, ps as f64 / scale as f64, unit)
    }
}

/// Prints `value unit` with the formatter's precision (default 3 decimals), trailing zeros
/// trimmed, so `1.500 us` reads `1.5 us`.
fn write_scaled(f: &mut fmt::Formatter<'_>, value: f64, unit: &str) -> fmt::Result {
    let precision = f.precision().unwrap_or(3);
    let mut text = format!("{value:.precision$}");
    if text.contains('.') {
        let trimmed = text.trim_end_matches('0').trim_end_matches('.').len();
        text.truncate(trimmed);
    }
    pad(f, &format!("{text} {unit}"))
}

/// Writes `text` honouring the formatter's width and alignment (`{:>12}`), for tables; the
/// precision, if any, was already used for the number.
fn pad(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    match (f.width(), f.align()) {
        (Some(width), Some(fmt::Alignment::Right)) => write!(f, "{text:>width$}"),
        (Some(width), Some(fmt::Alignment::Center)) => write!(f, "{text:^width$}"),
        (Some(width), _) => write!(f, "{text:<width$}"),
        (None, _) => f.write_str(text),
    }
}

/// Splits `"1.5 us"` into `(1.5, "us")`.
fn split_number(input: &str) -> Option<(f64, &str)> {
    let text = input.trim();
    let end = text
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-' | 'e' | 'E' | '_')))
        .map_or(text.len(), |(i, _)| i);
    // The longest prefix that reads as a number: in "8E" or "2e" the letter is a unit, not
    // an exponent.
    (1..=end).rev().find_map(|end| {
        let number: String = text[..end].chars().filter(|&c| c != '_').collect();
        number.parse::<f64>().ok().map(|value| (value, text[end..].trim()))
    })
}

/// Reads `<number> <unit>` where the unit is looked up in `units` (unit name -> scale).
fn parse_scaled(
    input: &str,
    quantity: &'static str,
    units: &[(&str, f64)],
    valid: &'static str,
) -> Result<f64, UnitError> {
    let error = |reason: String| UnitError::Parse { input: input.to_string(), quantity, reason, valid };
    let (value, unit) = split_number(input).ok_or_else(|| error("no number at the start".into()))?;
    if unit.is_empty() {
        return Err(error("the unit is missing".into()));
    }
    let scale = units
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|&(_, scale)| scale)
        .ok_or_else(|| error(format!("unknown unit {unit:?}")))?;
    if !value.is_finite() || value < 0.0 {
        return Err(UnitError::OutOfRange {
            input: input.to_string(),
            quantity,
            reason: "must be a finite, non-negative number",
        });
    }
    Ok(value * scale)
}

const TIME_UNITS: &[(&str, f64)] = &[
    ("ps", 1.0),
    ("ns", PS_PER_NS as f64),
    ("us", PS_PER_US as f64),
    ("µs", PS_PER_US as f64),
    ("ms", PS_PER_MS as f64),
    ("s", PS_PER_S as f64),
];
const TIME_VALID: &str = "ps, ns, us (or µs), ms, s";

impl FromStr for SimDuration {
    type Err = UnitError;
    fn from_str(input: &str) -> Result<Self, UnitError> {
        let ps = parse_scaled(input, "a duration", TIME_UNITS, TIME_VALID)?;
        if ps >= u64::MAX as f64 {
            return Err(UnitError::OutOfRange {
                input: input.to_string(),
                quantity: "duration",
                reason: "longer than the largest representable duration (~213 days)",
            });
        }
        Ok(SimDuration(ps.round() as u64))
    }
}

/// A number of bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub u64);

const KIB: u64 = 1 << 10;
const BYTE_UNITS: &[(&str, f64)] = &[
    ("B", 1.0),
    ("kB", 1e3),
    ("KB", 1e3),
    ("MB", 1e6),
    ("GB", 1e9),
    ("TB", 1e12),
    ("KiB", KIB as f64),
    ("MiB", (KIB * KIB) as f64),
    ("GiB", (KIB * KIB * KIB) as f64),
    ("TiB", (KIB * KIB * KIB * KIB) as f64),
];
const BYTE_VALID: &str = "B, kB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024)";

impl Bytes {
    /// Zero bytes.
    pub const ZERO: Bytes = Bytes(0);

    /// The count as a float (for rates and reports).
    pub fn as_f64(self) -> f64 {
        self.0 as f64
    }
}

impl FromStr for Bytes {
    type Err = UnitError;
    fn from_str(input: &str) -> Result<Self, UnitError> {
        let bytes = parse_scaled(input, "a size", BYTE_UNITS, BYTE_VALID)?;
        if bytes >= u64::MAX as f64 {
            return Err(UnitError::OutOfRange {
                input: input.to_string(),
                quantity: "size",
                reason: "larger than 16 EiB",
            });
        }
        Ok(Bytes(bytes.round() as u64))
    }
}

impl fmt::Display for Bytes {
    /// Binary units when the count is an exact multiple of one (`80 GiB`), decimal otherwise
    /// (`102.23 MB`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        let binary =
            [(KIB * KIB * KIB * KIB, "TiB"), (KIB * KIB * KIB, "GiB"), (KIB * KIB, "MiB"), (KIB, "KiB")];
        if let Some(&(scale, unit)) = binary.iter().find(|&&(scale, _)| n >= scale && n % scale == 0) {
            return pad(f, &format!("{} {unit}", n / scale));
        }
        let decimal = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")];
        match decimal.iter().find(|&&(scale, _)| n as f64 >= scale) {
            Some(&(scale, unit)) => write_scaled(f, n as f64 / scale, unit),
            None => pad(f, &format!("{n} B")),
        }
    }
}

/// A data rate, stored exactly as bits per second.
///
/// Network links are usually quoted in bits (`"200 Gb/s"`), memories and NVLink in bytes
/// (`"2039 GB/s"`); both parse, and both mean the same stored value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bandwidth {
    bits_per_second: u64,
}

const BANDWIDTH_UNITS: &[(&str, f64)] = &[
    ("b/s", 1.0),
    ("kb/s", 1e3),
    ("Kb/s", 1e3),
    ("Mb/s", 1e6),
    ("Gb/s", 1e9),
    ("Tb/s", 1e12),
    ("bit/s", 1.0),
    ("kbit/s", 1e3),
    ("Mbit/s", 1e6),
    ("Gbit/s", 1e9),
    ("Tbit/s", 1e12),
    ("B/s", 8.0),
    ("kB/s", 8e3),
    ("KB/s", 8e3),
    ("MB/s", 8e6),
    ("GB/s", 8e9),
    ("TB/s", 8e12),
    ("KiB/s", 8.0 * KIB as f64),
    ("MiB/s", 8.0 * (KIB * KIB) as f64),
    ("GiB/s", 8.0 * (KIB * KIB * KIB) as f64),
    ("TiB/s", 8.0 * (KIB * KIB * KIB * KIB) as f64),
];
const BANDWIDTH_VALID: &str =
    "b/s, kb/s, Mb/s, Gb/s, Tb/s (bits), B/s, kB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s (bytes)";

impl Bandwidth {
    /// A rate of `bits_per_second`; `None` if zero (a link that moves nothing never finishes).
    pub const fn from_bits_per_second(bits_per_second: u64) -> Option<Self> {
        if bits_per_second == 0 { None } else { Some(Bandwidth { bits_per_second }) }
    }

    /// A rate of `bytes_per_second`; `None` if zero or too large.
    pub fn from_bytes_per_second(bytes_per_second: u64) -> Option<Self> {
        bytes_per_second.checked_mul(8).and_then(Self::from_bits_per_second)
    }

    /// This rate times `factor`, to the whole byte per second; `None` unless the result is a
    /// positive rate that fits (a what-if scale, or one process's share of a shared device).
    pub fn scaled(self, factor: f64) -> Option<Self> {
        let bytes = (self.bytes_per_second() * factor).round();
        (bytes.is_finite() && bytes >= 1.0 && bytes <= u64::MAX as f64)
            .then(|| Self::from_bytes_per_second(bytes as u64))
            .flatten()
    }

    /// Bits per second.
    pub const fn bits_per_second(self) -> u64 {
        self.bits_per_second
    }

    /// Bytes per second, as a float (for rates in the flow model and reports).
    pub fn bytes_per_second(self) -> f64 {
        self.bits_per_second as f64 / 8.0
    }

    /// Time to push `bytes` through at this rate, rounded up to the next picosecond
    /// (the transfer is not done until its last bit is).
    pub fn time_to_send(self, bytes: Bytes) -> Result<SimDuration, UnitError> {
        self.time_to_send_share(bytes, 1)
    }

    /// Time to push `1/parts` of `bytes` through at this rate (one chunk of a collective),
    /// computed without rounding the chunk to whole bytes first, rounded up to the next
    /// picosecond. `parts == 0` is treated as 1.
    pub fn time_to_send_share(self, bytes: Bytes, parts: u64) -> Result<SimDuration, UnitError> {
        let numerator = u128::from(bytes.0) * 8 * u128::from(PS_PER_S);
        let denominator = u128::from(self.bits_per_second) * u128::from(parts.max(1));
        let ps = numerator.div_ceil(denominator);
        u64::try_from(ps).map(SimDuration).map_err(|_| UnitError::OutOfRange {
            input: format!("{bytes} / {parts} at {self}"),
            quantity: "transfer time",
            reason: "longer than the largest representable duration (~213 days)",
        })
    }

    /// The same rate printed in bits per second (`200 Gb/s`), the way networks are quoted.
    pub fn display_bits(self) -> impl fmt::Display {
        BitsDisplay(self)
    }
}

struct BitsDisplay(Bandwidth);

impl fmt::Display for BitsDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = self.0.bits_per_second as f64;
        let (scale, unit) = [(1e12, "Tb/s"), (1e9, "Gb/s"), (1e6, "Mb/s"), (1e3, "kb/s"), (1.0, "b/s")]
            .into_iter()
            .find(|&(scale, _)| bits >= scale)
            .unwrap_or((1.0, "b/s"));
        write_scaled(f, bits / scale, unit)
    }
}

impl fmt::Display for Bandwidth {
    /// Bytes per second in decimal units (`25 GB/s`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.bytes_per_second();
        let (scale, unit) = [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s")]
            .into_iter()
            .find(|&(scale, _)| bytes >= scale)
            .unwrap_or((1.0, "B/s"));
        write_scaled(f, bytes / scale, unit)
    }
}

impl FromStr for Bandwidth {
    type Err = UnitError;
    fn from_str(input: &str) -> Result<Self, UnitError> {
        let bits = parse_scaled(input, "a bandwidth", BANDWIDTH_UNITS, BANDWIDTH_VALID)?;
        if bits >= u64::MAX as f64 {
            return Err(UnitError::OutOfRange {
                input: input.to_string(),
                quantity: "bandwidth",
                reason: "too large",
            });
        }
        Bandwidth::from_bits_per_second(bits.round() as u64).ok_or_else(|| UnitError::OutOfRange {
            input: input.to_string(),
            quantity: "bandwidth",
            reason: "must be greater than zero",
        })
    }
}

/// A number of floating-point operations (a float: a model's per-iteration count passes 1e18).
#[derive(Debug, Clone, Copy, Default, PartialEq, PartialOrd)]
pub struct Flops(pub f64);

impl fmt::Display for Flops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scale, unit) = flop_scale(self.0);
        write_scaled(f, self.0 / scale, &format!("{unit}FLOP"))
    }
}

fn flop_scale(value: f64) -> (f64, &'static str) {
    [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|&(scale, _)| value >= scale)
        .unwrap_or((1.0, ""))
}

/// A compute rate in floating-point operations per second.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct FlopRate(f64);

const FLOP_RATE_UNITS: &[(&str, f64)] = &[
    ("FLOP/s", 1.0),
    ("kFLOP/s", 1e3),
    ("MFLOP/s", 1e6),
    ("GFLOP/s", 1e9),
    ("TFLOP/s", 1e12),
    ("PFLOP/s", 1e15),
    ("FLOPS", 1.0),
    ("kFLOPS", 1e3),
    ("MFLOPS", 1e6),
    ("GFLOPS", 1e9),
    ("TFLOPS", 1e12),
    ("PFLOPS", 1e15),
];
const FLOP_RATE_VALID: &str = "FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s (or FLOPS, GFLOPS, TFLOPS, PFLOPS)";

impl FlopRate {
    /// A rate of `flops_per_second`; `None` unless finite and positive.
    pub fn new(flops_per_second: f64) -> Option<Self> {
        (flops_per_second.is_finite() && flops_per_second > 0.0).then_some(FlopRate(flops_per_second))
    }

    /// FLOP per second.
    pub fn per_second(self) -> f64 {
        self.0
    }

    /// This rate scaled by `factor` (an efficiency in (0, 1]); `None` if the result is not positive.
    pub fn scaled(self, factor: f64) -> Option<Self> {
        FlopRate::new(self.0 * factor)
    }

    /// Time to execute `flops` at this rate, rounded to the nearest picosecond.
    pub fn time_for(self, flops: Flops) -> Result<SimDuration, UnitError> {
        SimDuration::from_secs_f64(flops.0 / self.0)
    }
}

impl fmt::Display for FlopRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scale, unit) = flop_scale(self.0);
        write_scaled(f, self.0 / scale, &format!("{unit}FLOP/s"))
    }
}

impl FromStr for FlopRate {
    type Err = UnitError;
    fn from_str(input: &str) -> Result<Self, UnitError> {
        let value = parse_scaled(input, "a compute rate", FLOP_RATE_UNITS, FLOP_RATE_VALID)?;
        FlopRate::new(value).ok_or_else(|| UnitError::OutOfRange {
            input: input.to_string(),
            quantity: "compute rate",
            reason: "must be greater than zero",
        })
    }
}

/// Serde support: every quantity is written as its human string (`"200 Gb/s"`), and sizes also
/// accept a bare integer number of bytes.
macro_rules! serde_via_string {
    ($type:ty, $expecting:literal) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Visitor;
                impl serde::de::Visitor<'_> for Visitor {
                    type Value = $type;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<$type, E> {
                        text.parse().map_err(E::custom)
                    }
                    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<$type, E> {
                        <$type>::from_integer(value).map_err(E::custom)
                    }
                    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<$type, E> {
                        let value = u64::try_from(value)
                            .map_err(|_| E::custom(format!("{value} is negative; {}", $expecting)))?;
                        self.visit_u64(value)
                    }
                }
                deserializer.deserialize_any(Visitor)
            }
        }
    };
}

/// How a bare integer in a scenario file is read for each quantity.
trait FromInteger: Sized {
    fn from_integer(value: u64) -> Result<Self, String>;
}

impl FromInteger for Bytes {
    fn from_integer(value: u64) -> Result<Self, String> {
        Ok(Bytes(value))
    }
}

impl FromInteger for SimDuration {
    fn from_integer(value: u64) -> Result<Self, String> {
        if value == 0 {
            Ok(SimDuration::ZERO)
        } else {
            Err(format!("a bare number {value} is ambiguous: write it with a unit, e.g. \"{value} us\""))
        }
    }
}

impl FromInteger for Bandwidth {
    fn from_integer(value: u64) -> Result<Self, String> {
        Err(format!(
            "a bare number {value} is ambiguous: write it with a unit, e.g. \"{value} Gb/s\" or \"{value} GB/s\""
        ))
    }
}

impl FromInteger for FlopRate {
    fn from_integer(value: u64) -> Result<Self, String> {
        Err(format!("a bare number {value} is ambiguous: write it with a unit, e.g. \"{value} TFLOP/s\""))
    }
}

serde_via_string!(SimDuration, "a duration such as \"1.5 us\"");
serde_via_string!(Bytes, "a size such as \"25 MB\" or \"80 GiB\"");
serde_via_string!(Bandwidth, "a bandwidth such as \"200 Gb/s\" or \"25 GB/s\"");
serde_via_string!(FlopRate, "a compute rate such as \"312 TFLOP/s\"");

/// 1234567 -> "1,234,567": a count with thousands separators, as reports print counts.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scaled_bandwidth_is_the_rate_times_the_factor_or_none() {
        let rate: Bandwidth = "256 GB/s".parse().unwrap();
        assert_eq!(rate.scaled(0.25).unwrap().bytes_per_second(), 64e9);
        assert_eq!(rate.scaled(1.0), Some(rate));
        assert_eq!(rate.scaled(0.0), None);
        assert_eq!(rate.scaled(f64::NAN), None);
    }

    #[test]
    fn counts_get_thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn a_letter_after_the_number_is_read_as_a_unit() {
        let error = "8E".parse::<Bandwidth>().unwrap_err().to_string();
        assert!(error.contains("unknown unit \"E\""), "{error}");
        let error = "2e".parse::<Bytes>().unwrap_err().to_string();
        assert!(error.contains("unknown unit \"e\""), "{error}");
        assert_eq!("1e3 B".parse::<Bytes>().unwrap(), Bytes(1000));
        let error = "GB".parse::<Bytes>().unwrap_err().to_string();
        assert!(error.contains("no number at the start"), "{error}");
    }

    #[test]
    fn durations_parse_and_print_round_trip() {
        for (text, ps) in [
            ("1.5 us", 1_500_000),
            ("0.7 us", 700_000),
            ("2 ms", 2_000_000_000),
            ("10ns", 10_000),
            ("1 s", PS_PER_S),
            ("3 ps", 3),
        ] {
            let d: SimDuration = text.parse().unwrap();
            assert_eq!(d.as_ps(), ps, "{text}");
            let again: SimDuration = d.to_string().parse().unwrap();
            assert_eq!(again, d, "{text} printed as {d}");
        }
        assert_eq!(SimDuration::from_us(1).to_string(), "1 us");
        assert_eq!(SimDuration::from_ps(1_234_567).to_string(), "1.235 us");
        assert_eq!(format!("[{:>9.1}]", SimDuration::from_ps(1_234_567)), "[   1.2 us]");
        assert_eq!(format!("[{:<8}]", SimDuration::from_us(2)), "[2 us    ]");
        assert_eq!("1.5 µs".parse::<SimDuration>().unwrap(), SimDuration::from_ps(1_500_000));
    }

    #[test]
    fn bad_units_name_the_input_and_the_valid_units() {
        let error = "200 Gbps".parse::<Bandwidth>().unwrap_err().to_string();
        assert!(
            error.contains("\"200 Gbps\"")
                && error.contains("unknown unit \"Gbps\"")
                && error.contains("Gb/s"),
            "{error}"
        );
        let error = "1.5".parse::<SimDuration>().unwrap_err().to_string();
        assert!(error.contains("unit is missing") && error.contains("us"), "{error}");
        assert!("-3 us".parse::<SimDuration>().is_err());
        assert!("0 Gb/s".parse::<Bandwidth>().is_err());
        assert!("fast".parse::<FlopRate>().is_err());
        assert!("1e30 s".parse::<SimDuration>().is_err());
    }

    #[test]
    fn bandwidth_in_bits_and_bytes_is_one_value() {
        let bits: Bandwidth = "200 Gb/s".parse().unwrap();
        let bytes: Bandwidth = "25 GB/s".parse().unwrap();
        assert_eq!(bits, bytes);
        assert_eq!(bits.to_string(), "25 GB/s");
        assert_eq!(bits.display_bits().to_string(), "200 Gb/s");
        assert_eq!("2039 GB/s".parse::<Bandwidth>().unwrap().to_string(), "2.039 TB/s");
    }

    #[test]
    fn sizes_print_in_the_unit_family_that_is_exact() {
        assert_eq!("80 GiB".parse::<Bytes>().unwrap(), Bytes(80 << 30));
        assert_eq!(Bytes(80 << 30).to_string(), "80 GiB");
        assert_eq!("25 MB".parse::<Bytes>().unwrap(), Bytes(25_000_000));
        assert_eq!(Bytes(25_000_000).to_string(), "25 MB");
        assert_eq!(Bytes(102_228_128).to_string(), "102.228 MB");
        assert_eq!(Bytes(17).to_string(), "17 B");
    }

    #[test]
    fn flop_rates_parse_both_spellings() {
        let a: FlopRate = "312 TFLOP/s".parse().unwrap();
        let b: FlopRate = "312 TFLOPS".parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "312 TFLOP/s");
        assert_eq!(a.time_for(Flops(312e12)).unwrap(), SimDuration::from_ms(1000));
    }

    #[test]
    fn transfer_time_is_exact_and_rounds_up() {
        let link: Bandwidth = "100 Gb/s".parse().unwrap();
        // 12.5e9 B/s: one byte takes exactly 80 ps.
        assert_eq!(link.time_to_send(Bytes(1 << 20)).unwrap().as_ps(), 80 * (1 << 20));
        let odd = Bandwidth::from_bits_per_second(3).unwrap();
        assert_eq!(odd.time_to_send(Bytes(1)).unwrap().as_ps(), 2_666_666_666_667);
    }

    #[test]
    fn time_overflow_is_an_error_not_a_wrap() {
        let late = SimTime::from_ps(u64::MAX - 5);
        assert!(late.checked_add(SimDuration::from_ps(5)).is_ok());
        let error = late.checked_add(SimDuration::from_ps(6)).unwrap_err();
        assert!(error.to_string().contains("overflow"));
        assert!(SimDuration::MAX.checked_mul(2).is_err());
        let slow = Bandwidth::from_bits_per_second(1).unwrap();
        assert!(slow.time_to_send(Bytes(u64::MAX / 8)).is_err());
    }
}
