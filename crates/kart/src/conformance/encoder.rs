//! Sentence embeddings computed by sentence-transformers (a JSON file like
//! `shared/fixtures/embeddings/all-minilm-l6-v2.json`: `sentences[i]` -> `embeddings[i]`) checked
//! against kart's encoder: every sentence's embedding within cosine similarity 0.9999 of the
//! oracle's. The file's optional `max_seq_length`, `pooling` and `normalize` describe how the
//! oracle encoded; they apply where the model folder itself does not say (see
//! [`kart_retriever::encoder`]).

use super::compare::Mismatch;
use super::{ConformanceError, Failure, Report};
use kart_core::config::retriever::{EncoderConfig, Pooling};
use kart_retriever::encoder::{Encoder, TextKind};
use serde::Deserialize;
use std::path::Path;
use tch::Device;

/// Parity criterion of the fixture.
pub const MIN_COSINE: f64 = 0.9999;

#[derive(Deserialize)]
struct EmbeddingsFile {
    sentences: Vec<String>,
    embeddings: Vec<Vec<f64>>,
    max_seq_length: Option<usize>,
    pooling: Option<Pooling>,
    normalize: Option<bool>,
}

/// Checks the embeddings file `file` with the encoder in `model_dir`, on the CPU in f32 as the
/// oracle computed them; one case per sentence, numbered from 1.
pub fn check_embeddings(model_dir: &Path, file: &Path) -> Result<Report, ConformanceError> {
    let text =
        std::fs::read_to_string(file).map_err(|source| ConformanceError::Io { path: file.into(), source })?;
    let expected: EmbeddingsFile = serde_json::from_str(&text).map_err(|source| ConformanceError::Json {
        path: file.into(),
        line: 1,
        source,
    })?;
    let invalid = |reason: String| ConformanceError::Model { path: file.into(), reason };
    if expected.sentences.len() != expected.embeddings.len() {
        let (sentences, embeddings) = (expected.sentences.len(), expected.embeddings.len());
        return Err(invalid(format!("{sentences} sentences but {embeddings} embeddings")));
    }
    if expected.sentences.is_empty() {
        return Err(ConformanceError::Empty { path: file.into() });
    }
    let defaults = EncoderConfig::default();
    let config = EncoderConfig {
        pooling: expected.pooling.unwrap_or(defaults.pooling),
        normalize: expected.normalize.unwrap_or(defaults.normalize),
        max_length: expected.max_seq_length.unwrap_or(defaults.max_length),
        ..defaults
    };
    let model_error = |reason: String| ConformanceError::Model { path: model_dir.into(), reason };
    let encoder = Encoder::load(model_dir, &config, Device::Cpu).map_err(|e| model_error(e.to_string()))?;
    let embeddings =
        encoder.encode(&expected.sentences, TextKind::Passage).map_err(|e| model_error(e.to_string()))?;
    let got = Vec::<f32>::try_from(embeddings.flatten(0, -1)).map_err(|e| model_error(e.to_string()))?;

    let mut report = Report::default();
    for (i, ((sentence, want), got)) in
        expected.sentences.iter().zip(&expected.embeddings).zip(got.chunks(encoder.dim())).enumerate()
    {
        match compare(want, got) {
            Ok(()) => report.passed += 1,
            Err(reason) => report.failures.push(Failure {
                path: file.into(),
                line: i + 1,
                schema: "encoder/embedding",
                mismatch: Mismatch(format!("{sentence:?}: {reason}")),
            }),
        }
    }
    Ok(report)
}

/// Whether `got` is within [`MIN_COSINE`] of `want`; `Err` says by how much it is not.
fn compare(want: &[f64], got: &[f32]) -> Result<(), String> {
    if want.len() != got.len() {
        return Err(format!("expected {} dimensions, the encoder gives {}", want.len(), got.len()));
    }
    let dot: f64 = want.iter().zip(got).map(|(&a, &b)| a * f64::from(b)).sum();
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    let cosine = dot / (norm(&mut want.iter().copied()) * norm(&mut got.iter().map(|&x| f64::from(x))));
    if cosine >= MIN_COSINE { Ok(()) } else { Err(format!("cosine similarity {cosine:.6} < {MIN_COSINE}")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kart_testing::minilm;

    #[test]
    fn fixture_passes_with_the_venv_model() {
        let Some(model) = minilm() else { return };
        let report = check_embeddings(&model, &kart_testing::embeddings("all-minilm-l6-v2.json")).unwrap();
        let failures: Vec<String> = report.failures.iter().map(ToString::to_string).collect();
        assert!(failures.is_empty(), "{failures:#?}");
        assert_eq!(report.passed, 50);
    }

    #[test]
    fn a_wrong_embedding_is_reported_with_its_sentence() {
        let Some(model) = minilm() else { return };
        let mut file: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(kart_testing::embeddings("all-minilm-l6-v2.json")).unwrap(),
        )
        .unwrap();
        file["embeddings"][1][0] = serde_json::json!(1.0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("embeddings.json");
        std::fs::write(&path, file.to_string()).unwrap();
        let report = check_embeddings(&model, &path).unwrap();
        assert_eq!((report.passed, report.failures.len()), (49, 1));
        let failure = report.failures[0].to_string();
        assert!(failure.starts_with(&format!("FAIL {}:2 [encoder/embedding]", path.display())), "{failure}");
        assert!(failure.contains("\"Paris is the capital of France.\": cosine similarity"), "{failure}");
    }

    #[test]
    fn mismatched_lengths_and_dimensions_are_errors() {
        assert!(compare(&[1.0, 0.0], &[1.0, 0.0, 0.0]).unwrap_err().contains("expected 2 dimensions"));
        assert_eq!(compare(&[1.0, 2.0], &[2.0, 4.0]), Ok(()));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.json");
        std::fs::write(&path, r#"{"sentences": ["a", "b"], "embeddings": [[1.0]]}"#).unwrap();
        let err = check_embeddings(dir.path(), &path).unwrap_err().to_string();
        assert_eq!(err, format!("{}: 2 sentences but 1 embeddings", path.display()));
    }
}
