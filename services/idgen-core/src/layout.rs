//! ID layouts: how the 22 bits below the timestamp split into region, machine and sequence.
//!
//! Every layout keeps bit 63 zero and the 41-bit timestamp in bits 62–22, so a reader finds an
//! ID's timestamp before it knows the layout. A layout is data, not code: v3 is one more value.

use thiserror::Error;

use crate::time::Timestamp;

/// Bits shared by the region, machine and sequence fields in every layout.
pub const LOW_BITS: u8 = 22;
/// The widest region field a layout can have: the machine and sequence fields take a bit each.
pub const MAX_REGION_BITS: u8 = LOW_BITS - 2;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    name: String,
    region_bits: u8,
    machine_bits: u8,
    sequence_bits: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FieldError {
    #[error("layout name {0:?} must be 1–16 characters of a–z, 0–9, '-' or '_'")]
    BadName(String),
    #[error("layout bits must sum to 22 (region {region} + machine {machine} + sequence {sequence} = {sum})")]
    BadBitSum { region: u8, machine: u8, sequence: u8, sum: u32 },
    #[error("layout needs at least one machine bit and one sequence bit")]
    EmptyField,
    #[error("{field} {value} does not fit in {bits} bits (0…{max}) of layout {layout}")]
    Overflow { field: &'static str, value: u64, bits: u8, max: u64, layout: String },
    #[error("{field} was validated for a {got}-bit field, but layout {layout} has {want} bits")]
    WrongLayout { field: &'static str, got: u8, want: u8, layout: String },
}

macro_rules! field_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name {
            value: u32,
            bits: u8,
        }

        impl $name {
            pub fn value(self) -> u32 {
                self.value
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.value.fmt(f)
            }
        }
    };
}

field_type!(
    /// A machine number known to fit the machine field of the layout that made it.
    MachineNumber
);
field_type!(
    /// A region number known to fit the region field of the layout that made it.
    RegionNumber
);
field_type!(
    /// A sequence number known to fit the sequence field of the layout that made it.
    Sequence
);

impl Layout {
    pub fn new(
        name: impl Into<String>,
        region_bits: u8,
        machine_bits: u8,
        sequence_bits: u8,
    ) -> Result<Self, FieldError> {
        let name = name.into();
        let name_ok = (1..=16).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(FieldError::BadName(name));
        }
        let sum = u32::from(region_bits) + u32::from(machine_bits) + u32::from(sequence_bits);
        if sum != u32::from(LOW_BITS) {
            return Err(FieldError::BadBitSum {
                region: region_bits,
                machine: machine_bits,
                sequence: sequence_bits,
                sum,
            });
        }
        if machine_bits == 0 || sequence_bits == 0 {
            return Err(FieldError::EmptyField);
        }
        Ok(Layout { name, region_bits, machine_bits, sequence_bits })
    }

    /// v1: 41-bit timestamp, 10-bit machine, 12-bit sequence; no region field.
    pub fn v1() -> Self {
        Layout { name: "v1".into(), region_bits: 0, machine_bits: 10, sequence_bits: 12 }
    }

    /// v2: 41-bit timestamp, 3-bit region, 9-bit machine, 10-bit sequence.
    pub fn v2() -> Self {
        Layout { name: "v2".into(), region_bits: 3, machine_bits: 9, sequence_bits: 10 }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn region_bits(&self) -> u8 {
        self.region_bits
    }
    pub fn machine_bits(&self) -> u8 {
        self.machine_bits
    }
    pub fn sequence_bits(&self) -> u8 {
        self.sequence_bits
    }
    /// The largest machine number, e.g. 1023 for v1.
    pub fn max_machine(&self) -> u32 {
        max_of(self.machine_bits) as u32
    }
    /// The largest region number; 0 when the layout has no region field.
    pub fn max_region(&self) -> u32 {
        max_of(self.region_bits) as u32
    }
    /// IDs per millisecond per machine: 4,096 for v1, 1,024 for v2.
    pub fn sequences_per_ms(&self) -> u32 {
        1 << self.sequence_bits
    }

    pub fn machine_number(&self, value: u32) -> Result<MachineNumber, FieldError> {
        self.check("machine", value, self.machine_bits).map(|value| MachineNumber { value, bits: self.machine_bits })
    }

    pub fn region_number(&self, value: u32) -> Result<RegionNumber, FieldError> {
        self.check("region", value, self.region_bits).map(|value| RegionNumber { value, bits: self.region_bits })
    }

    pub fn sequence(&self, value: u32) -> Result<Sequence, FieldError> {
        self.check("sequence", value, self.sequence_bits).map(|value| Sequence { value, bits: self.sequence_bits })
    }

    fn check(&self, field: &'static str, value: u32, bits: u8) -> Result<u32, FieldError> {
        if u64::from(value) > max_of(bits) {
            return Err(FieldError::Overflow {
                field,
                value: value.into(),
                bits,
                max: max_of(bits),
                layout: self.name.clone(),
            });
        }
        Ok(value)
    }

    fn same_width(&self, field: &'static str, got: u8, want: u8) -> Result<(), FieldError> {
        if got != want {
            return Err(FieldError::WrongLayout { field, got, want, layout: self.name.clone() });
        }
        Ok(())
    }

    /// Puts the fields together. Every field was validated against a layout of the same widths,
    /// so no field can spill into its neighbour.
    pub fn encode(
        &self,
        timestamp: Timestamp,
        region: RegionNumber,
        machine: MachineNumber,
        sequence: Sequence,
    ) -> Result<u64, FieldError> {
        self.same_width("region", region.bits, self.region_bits)?;
        self.same_width("machine", machine.bits, self.machine_bits)?;
        self.same_width("sequence", sequence.bits, self.sequence_bits)?;
        Ok((timestamp.millis() << LOW_BITS)
            | (u64::from(region.value) << (self.machine_bits + self.sequence_bits))
            | (u64::from(machine.value) << self.sequence_bits)
            | u64::from(sequence.value))
    }

    /// Splits an ID's low 22 bits by this layout. The caller has chosen the layout by timestamp.
    pub fn decode_fields(&self, id: u64) -> (u32, u32, u32) {
        let sequence = id & max_of(self.sequence_bits);
        let machine = (id >> self.sequence_bits) & max_of(self.machine_bits);
        let region = (id >> (self.sequence_bits + self.machine_bits)) & max_of(self.region_bits);
        (region as u32, machine as u32, sequence as u32)
    }
}

fn max_of(bits: u8) -> u64 {
    (1u64 << bits) - 1
}

/// An ID taken apart: what `GET /v1/ids/{id}/decode` and `idgen decode` show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedId {
    pub id: u64,
    pub layout: Layout,
    pub timestamp: Timestamp,
    /// `None` for layouts without a region field.
    pub region_number: Option<u32>,
    pub machine: u32,
    pub sequence: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_worked_example() {
        let v1 = Layout::v1();
        let ts = Timestamp::from_millis(23_198_400_000).unwrap();
        let id = v1
            .encode(ts, v1.region_number(0).unwrap(), v1.machine_number(37).unwrap(), v1.sequence(5).unwrap())
            .unwrap();
        assert_eq!(id, 97_301_141_913_751_557);
    }

    #[test]
    fn v2_worked_example() {
        let v2 = Layout::v2();
        let ts = Timestamp::from_millis(162_898_200_000).unwrap();
        let id = v2
            .encode(ts, v2.region_number(2).unwrap(), v2.machine_number(170).unwrap(), v2.sequence(3).unwrap())
            .unwrap();
        assert_eq!(id, 683_244_571_854_022_659);
        assert_eq!(v2.decode_fields(id), (2, 170, 3));
    }

    #[test]
    fn overflow_is_unrepresentable() {
        let v1 = Layout::v1();
        assert!(v1.machine_number(1024).is_err());
        assert!(v1.sequence(4096).is_err());
        assert!(v1.region_number(1).is_err());
        let v2 = Layout::v2();
        assert!(v2.machine_number(512).is_err());
        assert!(v2.region_number(8).is_err());
        // A machine number validated for v1 (10 bits) cannot be used with v2 (9 bits).
        let m = v1.machine_number(300).unwrap();
        let err = v2.encode(Timestamp::ZERO, v2.region_number(0).unwrap(), m, v2.sequence(0).unwrap()).unwrap_err();
        assert!(matches!(err, FieldError::WrongLayout { field: "machine", .. }));
    }

    #[test]
    fn layouts_are_validated() {
        assert!(Layout::new("v3", 4, 8, 10).is_ok());
        assert!(matches!(Layout::new("v3", 4, 8, 11), Err(FieldError::BadBitSum { .. })));
        assert!(matches!(Layout::new("V 3", 4, 8, 10), Err(FieldError::BadName(_))));
        assert!(matches!(Layout::new("v3", 12, 0, 10), Err(FieldError::EmptyField)));
    }
}
