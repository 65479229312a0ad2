//! TensorBoard event files as TensorBoard's own writers (TensorFlow's `tf.summary`, PyTorch's
//! `SummaryWriter`) write them: TFRecord framing (a little-endian length, its masked CRC-32C, the
//! record, its masked CRC-32C) around `tensorflow.Event` protocol buffers, the first naming the
//! file version, then one event per step holding a `simple_value` scalar for each metric.

use prost::Message;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// `tensorflow.Event` (tensorflow/core/util/event.proto), the fields kart writes.
#[derive(Clone, PartialEq, Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    what: Option<What>,
}

/// The `what` of an [`Event`].
#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary` (tensorflow/core/framework/summary.proto).
#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with its `simple_value` (in the proto's `value` oneof, so written
/// even when it is 0).
#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// The version string TensorBoard expects in a file's first event.
const FILE_VERSION: &str = "brain.Event:2";

/// An open event file.
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

impl EventWriter {
    /// A new event file in `dir` (created if missing), named as TensorBoard's writers name them
    /// (`events.out.tfevents.{seconds}.{host}.{pid}.{n}`), its first event written.
    pub fn create(dir: &Path) -> std::io::Result<EventWriter> {
        std::fs::create_dir_all(dir)?;
        let host =
            std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "localhost".into());
        let stem = format!("events.out.tfevents.{}.{host}.{}", now().trunc() as u64, std::process::id());
        // The last part counts the files this process opened in the same second.
        let (path, file) = (0..)
            .map(|n| dir.join(format!("{stem}.{n}")))
            .find_map(|path| match File::create_new(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                opened => Some(opened.map(|file| (path, file))),
            })
            .expect("an unused name")?;
        let mut writer = EventWriter { file: BufWriter::new(file), path };
        let first = Event { wall_time: now(), step: 0, what: Some(What::FileVersion(FILE_VERSION.into())) };
        writer.write(&first)?;
        Ok(writer)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the scalars of `step` (non-finite values are left out, as `metrics.jsonl` leaves
    /// them null) and flushes them to the file.
    pub fn scalars(&mut self, step: u64, scalars: &[(String, f64)]) -> std::io::Result<()> {
        let value: Vec<SummaryValue> = scalars
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(tag, v)| SummaryValue { tag: tag.clone(), simple_value: Some(*v as f32) })
            .collect();
        if value.is_empty() {
            return Ok(());
        }
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.write(&Event { wall_time: now(), step, what: Some(What::Summary(Summary { value })) })
    }

    fn write(&mut self, event: &Event) -> std::io::Result<()> {
        self.file.write_all(&record(&event.encode_to_vec()))?;
        self.file.flush()
    }
}

/// Seconds since the Unix epoch.
fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// `data` framed as one TFRecord.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// TFRecord's masked CRC-32C (Castagnoli): rotated right by 15 bits plus a constant.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records of a file, checked frame by frame.
    fn records(bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(len_crc, masked_crc(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc(data));
            events.push(Event::decode(data).unwrap());
            at += 16 + len;
        }
        events
    }

    #[test]
    fn the_crc_is_castagnoli_s_masked_as_tensorflow_masks_it() {
        // CRC-32C's check value, and TensorFlow's masking of it (crc32c.h: `Mask`, worked by
        // hand: (0xe3069283 >> 15 | 0xe3069283 << 17) + 0xa282ead8).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn a_file_holds_the_version_then_each_step_s_finite_scalars() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = EventWriter::create(&dir.path().join("tb")).unwrap();
        assert!(writer.path().file_name().unwrap().to_str().unwrap().starts_with("events.out.tfevents."));
        writer.scalars(1, &[("reward/mean".into(), 0.0), ("actor/kl".into(), f64::NAN)]).unwrap();
        writer.scalars(2, &[("actor/kl".into(), f64::INFINITY)]).unwrap();
        writer.scalars(3, &[("reward/mean".into(), 0.5)]).unwrap();
        let events = records(&std::fs::read(writer.path()).unwrap());
        assert_eq!(events.len(), 3, "the version and steps 1 and 3: {events:?}");
        assert_eq!(events[0].what, Some(What::FileVersion(FILE_VERSION.into())));
        let Some(What::Summary(first)) = &events[1].what else { panic!("{events:?}") };
        assert_eq!(events[1].step, 1);
        // A zero is written (it is in the proto's oneof), the NaN is not.
        assert_eq!(first.value, vec![SummaryValue { tag: "reward/mean".into(), simple_value: Some(0.0) }]);
        assert_eq!(events[2].step, 3);
        // Two writers in one folder never share a file.
        let other = EventWriter::create(&dir.path().join("tb")).unwrap();
        assert_ne!(other.path(), writer.path());
    }
}
