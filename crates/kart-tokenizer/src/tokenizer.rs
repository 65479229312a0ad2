//! The tokenizer of a Hugging Face model folder, behaving like transformers' (v5) tokenizer.
//!
//! The folder's `tokenizer.json` is run by the `tokenizers` crate, the library transformers itself
//! delegates to; `tokenizer_config.json` adds what transformers layers on top:
//! - the named special tokens (`bos_token`, `eos_token`, `pad_token`, ...: strings,
//!   `{"content": ...}` objects or null) and `added_tokens_decoder`, registered with the backend
//!   when `tokenizer.json` lacks them, as transformers does on load;
//! - `split_special_tokens`;
//! - `clean_up_tokenization_spaces`, which transformers 5 applies after decoding except for BPE
//!   models (where it would corrupt the text) unless
//!   `clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output` forces it.
//!
//! Generation stops at the tokenizer's end-of-sequence token and at the `eos_token_id`s of
//! `generation_config.json` (or of `config.json` when the folder has no generation config).
//!
//! [`DecodeStream`] turns generated ids into text one token at a time, never splitting a
//! multi-byte character, for stop strings and streaming.
//!
//! A fresh byte-level BPE tokenizer with Qwen2's pipeline can also be trained on a corpus
//! ([`Tokenizer::train_byte_level_bpe`]), given words it keeps whole
//! ([`Tokenizer::with_added_words`]), and written as a folder transformers loads to the same ids
//! ([`Tokenizer::save`]), for models trained from scratch.
//!
//! ```no_run
//! # use kart_tokenizer::Tokenizer;
//! let tokenizer = Tokenizer::load("models/Qwen2.5-0.5B-Instruct")?;
//! let ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n", false)?;
//! assert_eq!(tokenizer.decode(&ids, false)?, "<|im_start|>user\nhi<|im_end|>\n");
//! # Ok::<(), kart_tokenizer::TokenizerError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};
use tokenizers::models::bpe::{BPE, BpeTrainer};
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PostProcessorWrapper, SplitDelimiterBehavior};

use crate::byte_level::{ByteLevelBpe, ByteLevelDecoder, QWEN2_SPLIT};
use crate::chat_template::ConfigTemplate;
use crate::error::TokenizerError;
use crate::file::{FileError, read_json};
use crate::pieces::Pieces;

/// A model's tokenizer: `tokenizer.json` plus the special tokens of `tokenizer_config.json`.
///
/// Cloning is cheap (the state is shared) and the tokenizer can be used from many threads.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    /// The `tokenizer.json` the backend was loaded from, for error messages.
    path: PathBuf,
    backend: tokenizers::Tokenizer,
    clean_up_tokenization_spaces: bool,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
    pad_token_id: Option<u32>,
    stop_token_ids: Vec<u32>,
    fast: FastPaths,
}

/// What spares a call into the backend's pipeline.
struct FastPaths {
    /// The backend's encoding without its alignment bookkeeping, when it is byte-level BPE.
    encoder: Option<ByteLevelBpe>,
    /// The backend's decoding from bytes computed once, when its decoder is byte-level.
    decoder: Option<ByteLevelDecoder>,
    /// Pieces of text remembered with their ids, for `encode_cached`.
    pieces: Pieces,
}

impl FastPaths {
    fn new(backend: &tokenizers::Tokenizer) -> FastPaths {
        let encoder = ByteLevelBpe::new(backend);
        let pieces = Pieces::new(backend, encoder.as_ref());
        FastPaths { encoder, decoder: ByteLevelDecoder::new(backend), pieces }
    }
}

impl Tokenizer {
    /// Loads the tokenizer of the Hugging Face model folder `dir`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let dir = dir.as_ref();
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(FileError::Missing { path }.into());
        }
        let mut backend = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| TokenizerError::Tokenizer { path: path.clone(), reason: e.to_string() })?;
        let config = TokenizerConfig::read(dir)?;
        config
            .register_tokens(&mut backend)
            .map_err(|e| TokenizerError::Tokenizer { path: path.clone(), reason: e.to_string() })?;

        let clean_up_tokenization_spaces = config.clean_up_tokenization_spaces
            && (!matches!(backend.get_model(), ModelWrapper::BPE(_))
                || config.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output);
        let id_of = |token: &Option<TokenSpec>| token.as_ref().and_then(|t| backend.token_to_id(t.content()));
        let bos_token_id = id_of(&config.bos_token);
        let eos_token_id = id_of(&config.eos_token);
        let pad_token_id = id_of(&config.pad_token).or(eos_token_id);
        let mut stop_token_ids: Vec<u32> = eos_token_id.into_iter().collect();
        for id in generation_eos_ids(dir)? {
            if !stop_token_ids.contains(&id) {
                stop_token_ids.push(id);
            }
        }

        let fast = FastPaths::new(&backend);
        let inner = Inner {
            path,
            backend,
            clean_up_tokenization_spaces,
            bos_token_id,
            eos_token_id,
            pad_token_id,
            stop_token_ids,
            fast,
        };
        Ok(Tokenizer { inner: Arc::new(inner) })
    }

    /// Trains a byte-level BPE tokenizer of at most `vocab_size` tokens on `texts`, laid out like
    /// the Qwen2 tokenizers: the `special_tokens` first (ids 0, 1, ...), then the 256 bytes, then
    /// the merges learnt, with Qwen2's normalizer and pre-tokenizer (every digit a piece of its
    /// own), so that transformers' `AutoTokenizer`, which loads any `qwen2` folder as
    /// `Qwen2Tokenizer`, gives the same ids. `eos` and `pad` name two of the special tokens.
    pub fn train_byte_level_bpe<'a>(
        texts: impl Iterator<Item = &'a str> + Send,
        vocab_size: usize,
        special_tokens: &[&str],
        eos: &str,
        pad: &str,
    ) -> Result<Self, TokenizerError> {
        let path = PathBuf::from("(trained tokenizer)");
        let error = |reason: String| TokenizerError::Tokenizer { path: path.clone(), reason };
        if let Some(token) = [eos, pad].into_iter().find(|token| !special_tokens.contains(token)) {
            return Err(error(format!("{token:?} is not one of the special tokens {special_tokens:?}")));
        }
        let alphabet = ByteLevel::alphabet();
        let smallest = alphabet.len() + special_tokens.len();
        if vocab_size < smallest {
            return Err(error(format!(
                "vocab_size {vocab_size} is below the {} bytes plus {} special tokens",
                alphabet.len(),
                special_tokens.len()
            )));
        }
        let trainer = BpeTrainer::builder()
            .vocab_size(vocab_size)
            .special_tokens(special_tokens.iter().map(|&token| AddedToken::from(token, true)).collect())
            .initial_alphabet(alphabet.into_iter().collect())
            .show_progress(false)
            .build();
        // Qwen2's own pipeline (transformers' `Qwen2Tokenizer` rebuilds it for any `qwen2`
        // folder): NFC, its split regex (each digit alone), then bytes without a regex of their own.
        let split =
            Split::new(SplitPattern::Regex(QWEN2_SPLIT.into()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| error(format!("the split pattern: {e}")))?;
        let pre_tokenizer = Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ]);
        let mut backend = tokenizers::Tokenizer::new(ModelWrapper::BPE(BPE::default()));
        backend
            .with_normalizer(Some(NormalizerWrapper::NFC(NFC)))
            .map_err(|e| error(format!("the normalizer: {e}")))?
            .with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(pre_tokenizer)));
        backend
            .with_post_processor(Some(PostProcessorWrapper::ByteLevel(ByteLevel::new(false, false, false))))
            .with_decoder(Some(ByteLevel::default()));
        backend
            .train(&mut TrainerWrapper::BpeTrainer(trainer), texts)
            .map_err(|e| error(format!("training failed: {e}")))?;
        let (eos_token_id, pad_token_id) = (backend.token_to_id(eos), backend.token_to_id(pad));
        let fast = FastPaths::new(&backend);
        let inner = Inner {
            path,
            backend,
            clean_up_tokenization_spaces: false,
            bos_token_id: None,
            eos_token_id,
            pad_token_id,
            stop_token_ids: eos_token_id.into_iter().collect(),
            fast,
        };
        Ok(Tokenizer { inner: Arc::new(inner) })
    }

    /// This tokenizer with each of `words` one token wherever it occurs in a text (an added
    /// token: the raw text is split at it before the pre-tokenizer runs, so " 1952" is one token
    /// even where Qwen2's pre-tokenizer would split a space and four digits, also inside " 19520"),
    /// appended after the vocabulary; words it already has are skipped. transformers splits at
    /// added tokens the same way, so the saved folder still loads to the same ids.
    pub fn with_added_words(&self, words: &[&str]) -> Result<Tokenizer, TokenizerError> {
        let mut backend = self.inner.backend.clone();
        let added: Vec<AddedToken> = words
            .iter()
            .filter(|word| backend.token_to_id(word).is_none())
            .map(|&word| AddedToken::from(word, false).normalized(false))
            .collect();
        backend.add_tokens(added).map_err(|e| self.error(e))?;
        let fast = FastPaths::new(&backend);
        let inner = Inner {
            path: self.inner.path.clone(),
            backend,
            clean_up_tokenization_spaces: self.inner.clean_up_tokenization_spaces,
            bos_token_id: self.inner.bos_token_id,
            eos_token_id: self.inner.eos_token_id,
            pad_token_id: self.inner.pad_token_id,
            stop_token_ids: self.inner.stop_token_ids.clone(),
            fast,
        };
        Ok(Tokenizer { inner: Arc::new(inner) })
    }

    /// Writes the tokenizer into the folder `dir` (created if needed) as transformers'
    /// `save_pretrained` does: `tokenizer.json`, `tokenizer_config.json` naming the special
    /// tokens, and `chat_template.jinja` when a template is given (such as
    /// [`CHATML`](crate::CHATML)).
    pub fn save(&self, dir: impl AsRef<Path>, chat_template: Option<&str>) -> Result<(), TokenizerError> {
        let dir = dir.as_ref();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TokenizerError::from(FileError::Io { path, source })
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join("tokenizer.json");
        self.inner
            .backend
            .save(&path, true)
            .map_err(|e| TokenizerError::Tokenizer { path: path.clone(), reason: e.to_string() })?;
        let token = |id: Option<u32>| id.and_then(|id| self.id_to_token(id)).map_or(Value::Null, Value::from);
        let config = json!({
            "backend": "tokenizers",
            "bos_token": token(self.inner.bos_token_id),
            "clean_up_tokenization_spaces": self.inner.clean_up_tokenization_spaces,
            "eos_token": token(self.inner.eos_token_id),
            "pad_token": token(self.inner.pad_token_id),
            "tokenizer_class": "PreTrainedTokenizerFast",
        });
        let path = dir.join("tokenizer_config.json");
        let mut text = serde_json::to_string_pretty(&config).map_err(FileError::json(&path))?;
        text.push('\n');
        std::fs::write(&path, text).map_err(io(&path))?;
        if let Some(template) = chat_template {
            let path = dir.join("chat_template.jinja");
            std::fs::write(&path, template).map_err(io(&path))?;
        }
        Ok(())
    }

    /// Token ids of `text`; `add_special_tokens` applies the post-processor of `tokenizer.json`
    /// (for instance a leading BOS), as `tokenizer(text, add_special_tokens=...)` does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let plain = (!add_special_tokens).then_some(self.inner.fast.encoder.as_ref()).flatten();
        if let Some(ids) = plain.and_then(|encoder| encoder.encode(&self.inner.backend, text)) {
            return ids.map_err(|e| self.error(e));
        }
        let encoding = self.inner.backend.encode(text, add_special_tokens).map_err(|e| self.error(e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The ids `encode(text, false)` gives, from memory where parts of `text` were encoded before:
    /// the text is cut into pieces where this tokenizer provably never makes a token across the
    /// cut (before a line that starts with an ASCII letter, in byte-level BPE pipelines like
    /// GPT-2's, Qwen2's and Llama 3's; elsewhere the whole text is one piece), and the ids of the
    /// last 4096 pieces of at most 4 KiB are kept. For text that recurs: prompts, retrieved
    /// passages.
    pub fn encode_cached(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner.fast.pieces.encode(text, |piece| self.encode(piece, false))
    }

    /// The `tokenizers` pipeline (for tests).
    #[cfg(test)]
    pub(crate) fn backend(&self) -> &tokenizers::Tokenizer {
        &self.inner.backend
    }

    /// The pieces `encode_cached` remembers (for tests).
    #[cfg(test)]
    pub(crate) fn pieces(&self) -> &Pieces {
        &self.inner.fast.pieces
    }

    /// The text of `ids`, equal to transformers' `tokenizer.decode(ids, skip_special_tokens=...)`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        let text = match &self.inner.fast.decoder {
            Some(decoder) => decoder.decode(ids, skip_special_tokens),
            None => self.inner.backend.decode(ids, skip_special_tokens).map_err(|e| self.error(e))?,
        };
        Ok(if self.inner.clean_up_tokenization_spaces { clean_up_tokenization(&text) } else { text })
    }

    /// A decoder that turns ids into text one token at a time.
    pub fn decode_stream(&self, skip_special_tokens: bool) -> DecodeStream {
        DecodeStream {
            tokenizer: self.clone(),
            skip_special_tokens,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// The id of a token (a vocabulary entry or an added token), if it exists.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.backend.token_to_id(token)
    }

    /// The token with id `id`, if it exists.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.backend.id_to_token(id)
    }

    /// The number of tokens including the added ones (transformers' `len(tokenizer)`).
    pub fn vocab_size(&self) -> usize {
        self.inner.backend.get_vocab_size(true)
    }

    /// The id of `bos_token`, if the model has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.inner.bos_token_id
    }

    /// The id of `eos_token`, if the model has one.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.inner.eos_token_id
    }

    /// The id of `pad_token`, falling back to the end-of-sequence token as verl does.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.inner.pad_token_id
    }

    /// The ids generation stops at: `eos_token` and the generation config's `eos_token_id`s, in
    /// that order and without duplicates.
    pub fn stop_token_ids(&self) -> Vec<u32> {
        self.inner.stop_token_ids.clone()
    }

    fn error(&self, e: tokenizers::Error) -> TokenizerError {
        TokenizerError::Tokenizer { path: self.inner.path.clone(), reason: e.to_string() }
    }
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.inner.path)
            .field("vocab_size", &self.vocab_size())
            .field("eos_token_id", &self.inner.eos_token_id)
            .field("stop_token_ids", &self.inner.stop_token_ids)
            .finish_non_exhaustive()
    }
}

/// Incremental decoding: fed generated ids one at a time, returns the text they complete.
///
/// Byte-level BPE tokens may hold part of a UTF-8 character; such text is held back until a
/// later token completes it. For tokenizers whose decoding does not clean up spaces, the pieces
/// returned by [`step`](Self::step) followed by [`finish`](Self::finish) concatenate to
/// [`Tokenizer::decode`] of all the ids.
#[derive(Debug)]
pub struct DecodeStream {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// The ids still needed to decode what comes next: those of the text already returned that
    /// give context to the decoder, then those not returned yet.
    ids: Vec<u32>,
    /// The decoding of the first `prefix_index` entries of `ids`, already returned.
    prefix: String,
    prefix_index: usize,
}

impl DecodeStream {
    /// Feeds one id; returns the newly completed text, empty while a character is incomplete.
    pub fn step(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = tokenizers::step_decode_stream(
            &self.tokenizer.inner.backend,
            vec![id],
            self.skip_special_tokens,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        )
        .map_err(|e| self.tokenizer.error(e))?;
        Ok(piece.unwrap_or_default())
    }

    /// Ends the stream, returning the text held back (incomplete characters decode to U+FFFD,
    /// as in [`Tokenizer::decode`]).
    pub fn finish(self) -> Result<String, TokenizerError> {
        let text = self
            .tokenizer
            .inner
            .backend
            .decode(&self.ids, self.skip_special_tokens)
            .map_err(|e| self.tokenizer.error(e))?;
        match text.strip_prefix(self.prefix.as_str()) {
            Some(rest) => Ok(rest.to_string()),
            None => Err(TokenizerError::Tokenizer {
                path: self.tokenizer.inner.path.clone(),
                reason: format!(
                    "stream decoding {:?} no longer starts with the text returned, {:?}",
                    text, self.prefix
                ),
            }),
        }
    }
}

/// transformers' `clean_up_tokenization`: removes the spaces a WordPiece decoder leaves before
/// punctuation and English contractions.
fn clean_up_tokenization(text: &str) -> String {
    const REPLACEMENTS: [(&str, &str); 10] = [
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ];
    REPLACEMENTS.iter().fold(text.to_string(), |text, (from, to)| text.replace(from, to))
}

/// The `eos_token_id`s of `generation_config.json`, or of `config.json` when there is no
/// generation config (as transformers' `GenerationConfig` falls back to the model config).
fn generation_eos_ids(dir: &Path) -> Result<Vec<u32>, TokenizerError> {
    #[derive(Deserialize)]
    struct EosIds {
        #[serde(default)]
        eos_token_id: Option<OneOrMany>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
    }

    let config = match read_json::<EosIds>(&dir.join("generation_config.json"))? {
        Some(config) => Some(config),
        None => read_json::<EosIds>(&dir.join("config.json"))?,
    };
    Ok(match config.and_then(|c| c.eos_token_id) {
        Some(OneOrMany::One(id)) => vec![id],
        Some(OneOrMany::Many(ids)) => ids,
        None => Vec::new(),
    })
}

/// The parts of `tokenizer_config.json` that tokenization and chat templating read.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct TokenizerConfig {
    #[serde(default)]
    bos_token: Option<TokenSpec>,
    #[serde(default)]
    eos_token: Option<TokenSpec>,
    #[serde(default)]
    unk_token: Option<TokenSpec>,
    #[serde(default)]
    sep_token: Option<TokenSpec>,
    #[serde(default)]
    pad_token: Option<TokenSpec>,
    #[serde(default)]
    cls_token: Option<TokenSpec>,
    #[serde(default)]
    mask_token: Option<TokenSpec>,
    /// Added tokens by id.
    #[serde(default)]
    added_tokens_decoder: BTreeMap<u32, AddedTokenSpec>,
    #[serde(default)]
    clean_up_tokenization_spaces: bool,
    #[serde(default)]
    clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output: bool,
    #[serde(default)]
    split_special_tokens: bool,
    /// The chat template, for folders without `chat_template.jinja`.
    #[serde(default)]
    pub(crate) chat_template: Option<ConfigTemplate>,
}

impl TokenizerConfig {
    /// Reads `dir/tokenizer_config.json`; a folder without one has no special tokens.
    pub(crate) fn read(dir: &Path) -> Result<Self, TokenizerError> {
        Ok(read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_default())
    }

    /// The named special tokens that are set, as `(attribute, content)` in transformers'
    /// `SPECIAL_TOKENS_ATTRIBUTES` order: the variables a chat template sees.
    pub(crate) fn special_tokens(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.named_tokens().map(|(name, token)| (name, token.content()))
    }

    fn named_tokens(&self) -> impl Iterator<Item = (&'static str, &TokenSpec)> {
        [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("sep_token", &self.sep_token),
            ("pad_token", &self.pad_token),
            ("cls_token", &self.cls_token),
            ("mask_token", &self.mask_token),
        ]
        .into_iter()
        .filter_map(|(name, token)| Some((name, token.as_ref()?)))
        .filter(|(_, token)| !token.content().is_empty())
    }

    /// Registers `added_tokens_decoder` and the named special tokens with the backend, as
    /// transformers' `TokenizersBackend` does on load. Tokens `tokenizer.json` already has with
    /// the same flags are left alone.
    fn register_tokens(&self, backend: &mut tokenizers::Tokenizer) -> tokenizers::Result<()> {
        let decoder = self.added_tokens_decoder.values();
        backend.add_tokens(decoder.map(|token| token.to_added_token(token.special)))?;
        let added = backend.get_added_vocabulary().get_vocab();
        let missing: Vec<AddedToken> = self
            .named_tokens()
            .filter(|(_, token)| !added.contains_key(token.content()))
            .map(|(_, token)| token.to_added_token())
            .collect();
        backend.add_special_tokens(missing)?;
        backend.set_encode_special_tokens(self.split_special_tokens);
        Ok(())
    }
}

/// A named special token: a string or a serialised `AddedToken`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TokenSpec {
    Content(String),
    Added(AddedTokenSpec),
}

impl TokenSpec {
    fn content(&self) -> &str {
        match self {
            TokenSpec::Content(content) => content,
            TokenSpec::Added(token) => &token.content,
        }
    }

    /// Named special tokens are always special, whatever their serialised flags say.
    fn to_added_token(&self) -> AddedToken {
        match self {
            TokenSpec::Content(content) => AddedToken::from(content.as_str(), true).normalized(false),
            TokenSpec::Added(token) => token.to_added_token(true),
        }
    }
}

/// A serialised `AddedToken`, with transformers' defaults for absent flags.
#[derive(Debug, Deserialize)]
struct AddedTokenSpec {
    content: String,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    /// Defaults to `!special`.
    #[serde(default)]
    normalized: Option<bool>,
    #[serde(default)]
    special: bool,
}

impl AddedTokenSpec {
    fn to_added_token(&self, special: bool) -> AddedToken {
        AddedToken::from(self.content.as_str(), special)
            .single_word(self.single_word)
            .lstrip(self.lstrip)
            .rstrip(self.rstrip)
            .normalized(self.normalized.unwrap_or(!special))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAMILIES: [&str; 3] = ["tiny-qwen2", "tiny-qwen3", "tiny-llama"];

    /// `(prompt, input_ids, greedy_continuation)` of every case of a fixture's `expected.json`.
    fn cases(name: &str) -> Vec<(String, Vec<u32>, Vec<u32>)> {
        let expected: serde_json::Value =
            read_json(&kart_testing::model(name).join("expected.json")).unwrap().unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
        expected["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|case| {
                let prompt = case["prompt"].as_str().unwrap().to_string();
                (prompt, ids(&case["input_ids"]), ids(&case["greedy_continuation"]))
            })
            .collect()
    }

    /// A scratch model folder with the fixture's `tokenizer.json` and the given extra files.
    fn folder_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            kart_testing::model("tiny-qwen2").join("tokenizer.json"),
            dir.path().join("tokenizer.json"),
        )
        .unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    /// The stream's pieces for `ids`, the last being what `finish` returns.
    fn stream(tokenizer: &Tokenizer, ids: &[u32]) -> Vec<String> {
        let mut stream = tokenizer.decode_stream(false);
        let mut pieces: Vec<String> = ids.iter().map(|&id| stream.step(id).unwrap()).collect();
        pieces.push(stream.finish().unwrap());
        pieces
    }

    const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

    /// A byte-level BPE trained on a few repeated sentences.
    fn trained() -> Tokenizer {
        let corpus =
            ["the quick brown fox jumps over the lazy dog", "a search agent reads the page", "Zürich 北京"];
        let texts = corpus.iter().cycle().take(300).copied();
        Tokenizer::train_byte_level_bpe(texts, 300, &SPECIAL, "<|im_end|>", "<|endoftext|>").unwrap()
    }

    #[test]
    fn trained_bpe_round_trips_any_text() {
        let tokenizer = trained();
        assert_eq!(tokenizer.vocab_size(), 300);
        let ids: Vec<u32> = SPECIAL.iter().map(|t| tokenizer.token_to_id(t).unwrap()).collect();
        assert_eq!(ids, [0, 1, 2]);
        assert_eq!(
            (tokenizer.eos_token_id(), tokenizer.pad_token_id(), tokenizer.bos_token_id()),
            (Some(2), Some(0), None)
        );
        assert_eq!(tokenizer.stop_token_ids(), [2]);
        // Merges were learnt: a sentence of the corpus takes fewer than half as many tokens as bytes.
        let sentence = "the quick brown fox jumps over the lazy dog";
        assert!(tokenizer.encode(sentence, false).unwrap().len() < sentence.len() / 2);
        // Unseen bytes still encode, through the byte alphabet.
        let text = "<|im_start|>user\nnever seen: ẞ 😀<|im_end|>\n";
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
        assert_eq!(tokenizer.decode(&ids, true).unwrap(), "user\nnever seen: ẞ 😀\n");
    }

    #[test]
    fn trained_bpe_saves_a_folder_that_loads_back() {
        let tokenizer = trained();
        let dir = tempfile::tempdir().unwrap();
        tokenizer.save(dir.path(), Some(crate::CHATML)).unwrap();
        let loaded = Tokenizer::load(dir.path()).unwrap();
        let text = "the lazy agent <|im_end|> reads";
        assert_eq!(loaded.encode(text, false).unwrap(), tokenizer.encode(text, false).unwrap());
        assert_eq!(
            (loaded.eos_token_id(), loaded.pad_token_id(), loaded.vocab_size()),
            (Some(2), Some(0), 300)
        );
        let config: serde_json::Value =
            read_json(&dir.path().join("tokenizer_config.json")).unwrap().unwrap();
        assert_eq!(config["eos_token"], "<|im_end|>");
        assert!(config.get("chat_template").is_none());
        let template = crate::ChatTemplate::load(dir.path()).unwrap().unwrap();
        let messages = [kart_core::chat::ChatMessage::new("user", "hi")];
        let prompt = template.render(&messages, true, serde_json::Value::Null).unwrap();
        assert_eq!(prompt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        // ChatML is the fixtures' template, byte for byte.
        let fixture_template =
            std::fs::read_to_string(kart_testing::model("tiny-qwen2").join("chat_template.jinja")).unwrap();
        assert_eq!(crate::CHATML, fixture_template);
    }

    #[test]
    fn added_words_are_one_token_wherever_they_occur_and_survive_a_save() {
        let base = trained();
        // Qwen2's pre-tokenizer: every digit a piece of its own.
        assert_eq!(base.encode(" 1952", false).unwrap().len(), 5);
        let tokenizer = base.with_added_words(&[" 1952", " 1999", "<|im_end|>"]).unwrap();
        // `<|im_end|>` is a token already and keeps its id; the others follow the vocabulary.
        assert_eq!(tokenizer.eos_token_id(), Some(2));
        assert_eq!(tokenizer.token_to_id(" 1952"), Some(300));
        assert_eq!(tokenizer.token_to_id(" 1999"), Some(301));
        assert_eq!(tokenizer.vocab_size(), 302);
        let text = "born in 1952, not 1999x or 1953";
        let ids = tokenizer.encode(text, false).unwrap();
        assert!(ids.contains(&300) && ids.contains(&301), "{ids:?}");
        assert_eq!(ids.len(), base.encode(text, false).unwrap().len() - 8);
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
        let dir = tempfile::tempdir().unwrap();
        tokenizer.save(dir.path(), None).unwrap();
        assert_eq!(Tokenizer::load(dir.path()).unwrap().encode(text, false).unwrap(), ids);
    }

    #[test]
    fn training_refuses_bad_arguments() {
        let text = std::iter::once("abc");
        let err = Tokenizer::train_byte_level_bpe(text.clone(), 400, &SPECIAL, "</s>", "<|endoftext|>")
            .unwrap_err();
        assert!(err.to_string().contains("\"</s>\" is not one of the special tokens"), "{err}");
        let err =
            Tokenizer::train_byte_level_bpe(text, 200, &SPECIAL, "<|im_end|>", "<|endoftext|>").unwrap_err();
        assert!(
            err.to_string().contains("vocab_size 200 is below the 256 bytes plus 3 special tokens"),
            "{err}"
        );
    }

    #[test]
    fn encodes_and_decodes_like_transformers() {
        for name in FAMILIES {
            let tokenizer = Tokenizer::load(kart_testing::model(name)).unwrap();
            for (prompt, input_ids, _) in cases(name) {
                assert_eq!(tokenizer.encode(&prompt, false).unwrap(), input_ids, "{name}: {prompt:?}");
                assert_eq!(tokenizer.decode(&input_ids, false).unwrap(), prompt, "{name}");
            }
        }
    }

    #[test]
    fn special_tokens_of_the_fixtures() {
        for name in FAMILIES {
            let tokenizer = Tokenizer::load(kart_testing::model(name)).unwrap();
            let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
            let endoftext = tokenizer.token_to_id("<|endoftext|>").unwrap();
            assert_eq!(tokenizer.eos_token_id(), Some(im_end), "{name}");
            assert_eq!(tokenizer.stop_token_ids(), vec![im_end], "{name}");
            assert_eq!(tokenizer.pad_token_id(), Some(endoftext), "{name}");
            assert_eq!(tokenizer.bos_token_id(), None, "{name}");
            assert_eq!(tokenizer.id_to_token(im_end).as_deref(), Some("<|im_end|>"));
            assert_eq!(tokenizer.vocab_size(), 366, "{name}");
            let ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
            assert_eq!(tokenizer.decode(&ids, true).unwrap(), "user\nhi", "{name}");
        }
    }

    #[test]
    fn special_tokens_come_from_the_configs() {
        let dir = folder_with(&[
            (
                "tokenizer_config.json",
                r#"{"eos_token": {"content": "<|endoftext|>"}, "unk_token": "<unk>", "added_tokens_decoder":
                    {"366": {"content": "<search>", "lstrip": false, "normalized": false, "rstrip": false,
                             "single_word": false, "special": false}}}"#,
            ),
            ("generation_config.json", r#"{"eos_token_id": [2, 0]}"#),
            ("config.json", r#"{"eos_token_id": 1}"#),
        ]);
        let tokenizer = Tokenizer::load(dir.path()).unwrap();
        assert_eq!(tokenizer.eos_token_id(), Some(0));
        assert_eq!(tokenizer.stop_token_ids(), vec![0, 2]);
        // No pad token: padding uses the end-of-sequence token.
        assert_eq!(tokenizer.pad_token_id(), Some(0));
        // Tokens tokenizer.json lacks are added to it, as transformers does.
        assert_eq!(tokenizer.vocab_size(), 368);
        let search = tokenizer.token_to_id("<search>").unwrap();
        let unk = tokenizer.token_to_id("<unk>").unwrap();
        assert_eq!((search, unk), (366, 367));
        let b = tokenizer.token_to_id("b").unwrap();
        assert_eq!(tokenizer.encode("a<search>b<unk>", false).unwrap()[1..], [search, b, unk]);
        assert_eq!(tokenizer.decode(&[search, unk], true).unwrap(), "<search>");

        // Without a generation config, config.json's ids.
        let dir = folder_with(&[("config.json", r#"{"eos_token_id": 1}"#)]);
        let tokenizer = Tokenizer::load(dir.path()).unwrap();
        assert_eq!(tokenizer.eos_token_id(), None);
        assert_eq!(tokenizer.pad_token_id(), None);
        assert_eq!(tokenizer.stop_token_ids(), vec![1]);
    }

    #[test]
    fn clean_up_tokenization_spaces_is_ignored_for_bpe_unless_forced() {
        let text = "yes . no ?";
        let dir = folder_with(&[("tokenizer_config.json", r#"{"clean_up_tokenization_spaces": true}"#)]);
        let tokenizer = Tokenizer::load(dir.path()).unwrap();
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);

        let forced = r#"{"clean_up_tokenization_spaces": true,
            "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": true}"#;
        let dir = folder_with(&[("tokenizer_config.json", forced)]);
        let tokenizer = Tokenizer::load(dir.path()).unwrap();
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), "yes. no?");
    }

    #[test]
    fn stream_decoding_concatenates_to_full_decoding() {
        for name in FAMILIES {
            let tokenizer = Tokenizer::load(kart_testing::model(name)).unwrap();
            for (_, input_ids, continuation) in cases(name) {
                // The random models' continuations include bytes that never form a character.
                for ids in [input_ids, continuation] {
                    let full = tokenizer.decode(&ids, false).unwrap();
                    assert_eq!(stream(&tokenizer, &ids).concat(), full, "{name}: {ids:?}");
                }
            }
        }
    }

    #[test]
    fn stream_decoding_never_splits_a_character() {
        let tokenizer = Tokenizer::load(kart_testing::model("tiny-qwen3")).unwrap();
        let text = "北京 Zürich — 😀 ok";
        let ids = tokenizer.encode(text, false).unwrap();
        let pieces = stream(&tokenizer, &ids);
        assert!(pieces.iter().all(|piece| !piece.contains('\u{FFFD}')), "{pieces:?}");
        assert!(pieces.iter().any(String::is_empty), "a partial character is held back");
        assert_eq!(pieces.last().map(String::as_str), Some(""));
        assert_eq!(pieces.concat(), text);
    }

    #[test]
    fn a_missing_tokenizer_json_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = Tokenizer::load(dir.path()).unwrap_err();
        assert!(matches!(err, TokenizerError::File(FileError::Missing { .. })), "{err}");
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
    }

    #[test]
    fn a_broken_tokenizer_json_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
        let err = Tokenizer::load(dir.path()).unwrap_err();
        assert!(matches!(err, TokenizerError::Tokenizer { .. }), "{err}");
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
    }

    #[test]
    fn is_cheap_to_share_between_threads() {
        fn assert_send_sync<T: Send + Sync + Clone>() {}
        assert_send_sync::<Tokenizer>();
    }
}
