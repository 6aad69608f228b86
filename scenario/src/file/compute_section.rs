//! The wire form of `[compute]`: a calibrated profile (file or built-in name), the compute
//! model's knobs, whose keys and value types are the model's table
//! ([`workloads::compute::knobs::KNOBS`]), and the section's own settings.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use workloads::compute::knobs::{KNOBS, Knob, KnobValue, knob};

/// `[compute]`: a calibrated profile (file or built-in name) and/or single parameters, which
/// override the profile's. Without either, the documented defaults. Unknown keys are refused.
#[derive(Debug, Clone, Default)]
pub(super) struct ComputeSection {
    pub(super) profile: Option<String>,
    /// The knobs the section sets, in the file's order, each once.
    pub(super) knobs: Vec<(&'static Knob, KnobValue)>,
    pub(super) fusion: Option<String>,
    pub(super) optimizer_passes: Option<String>,
    pub(super) gradient_accumulation: Option<String>,
}

/// The section's keys in the order an unknown key's message lists them: `profile`, the knobs,
/// then the section's own settings.
const KEYS: &[&str] = &{
    let mut keys = [""; KNOBS.len() + 4];
    keys[0] = "profile";
    let mut i = 0;
    while i < KNOBS.len() {
        keys[i + 1] = KNOBS[i].key;
        i += 1;
    }
    keys[i + 1] = "fusion";
    keys[i + 2] = "optimizer-passes";
    keys[i + 3] = "gradient-accumulation";
    keys
};

/// A key of the section.
enum Key {
    Profile,
    Knob(&'static Knob),
    Fusion,
    OptimizerPasses,
    GradientAccumulation,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("field identifier")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
        match key {
            "profile" => Ok(Key::Profile),
            "fusion" => Ok(Key::Fusion),
            "optimizer-passes" => Ok(Key::OptimizerPasses),
            "gradient-accumulation" => Ok(Key::GradientAccumulation),
            _ => knob(key).map(Key::Knob).ok_or_else(|| E::unknown_field(key, KEYS)),
        }
    }
}

impl<'de> Deserialize<'de> for ComputeSection {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ComputeSection, D::Error> {
        deserializer.deserialize_struct("ComputeSection", KEYS, SectionVisitor)
    }
}

struct SectionVisitor;

impl<'de> Visitor<'de> for SectionVisitor {
    type Value = ComputeSection;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("struct ComputeSection")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ComputeSection, A::Error> {
        let mut section = ComputeSection::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Profile => text_once(&mut section.profile, "profile", &mut map)?,
                Key::Fusion => text_once(&mut section.fusion, "fusion", &mut map)?,
                Key::OptimizerPasses => {
                    text_once(&mut section.optimizer_passes, "optimizer-passes", &mut map)?;
                }
                Key::GradientAccumulation => {
                    text_once(&mut section.gradient_accumulation, "gradient-accumulation", &mut map)?;
                }
                Key::Knob(knob) => {
                    if section.knobs.iter().any(|(set, _)| set.key == knob.key) {
                        return Err(de::Error::duplicate_field(knob.key));
                    }
                    let value = map.next_value_seed(knob)?;
                    section.knobs.push((knob, value));
                }
            }
        }
        Ok(section)
    }

    /// The positional form serde gives every struct: the values in [`KEYS`] order
    /// (`compute = [...]`); a shorter array is refused by its length, as serde refuses one for
    /// the scenario's other tables.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ComputeSection, A::Error> {
        let expected = format!("struct ComputeSection with {} elements", KEYS.len());
        let short = |index: usize| de::Error::invalid_length(index, &expected.as_str());
        let mut section = ComputeSection {
            profile: seq.next_element::<Option<String>>()?.ok_or_else(|| short(0))?,
            ..ComputeSection::default()
        };
        for (index, knob) in KNOBS.iter().enumerate() {
            let value = seq.next_element_seed(knob)?.ok_or_else(|| short(index + 1))?;
            section.knobs.push((knob, value));
        }
        let mut text = |index: usize| seq.next_element::<Option<String>>()?.ok_or_else(|| short(index));
        section.fusion = text(KNOBS.len() + 1)?;
        section.optimizer_passes = text(KNOBS.len() + 2)?;
        section.gradient_accumulation = text(KNOBS.len() + 3)?;
        Ok(section)
    }
}

/// Reads the text value of `key` into `slot`, refusing a second one.
fn text_once<'de, A: MapAccess<'de>>(
    slot: &mut Option<String>,
    key: &'static str,
    map: &mut A,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(key));
    }
    *slot = map.next_value::<Option<String>>()?;
    Ok(())
}

impl PartialEq for ComputeSection {
    /// The same profile, the same knobs set to the same values in the same order, and the same
    /// framework choices (what a cache of validated sections compares).
    fn eq(&self, other: &Self) -> bool {
        self.profile == other.profile
            && self.knobs.len() == other.knobs.len()
            && self.knobs.iter().zip(&other.knobs).all(|((a, x), (b, y))| a.key == b.key && x == y)
            && self.fusion == other.fusion
            && self.optimizer_passes == other.optimizer_passes
            && self.gradient_accumulation == other.gradient_accumulation
    }
}
