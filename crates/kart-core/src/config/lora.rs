//! LoRA: the policy trained as low-rank adapters on a frozen base, with PEFT's names and defaults
//! (`r`, `lora_alpha`, `lora_dropout`, `target_modules`, `use_rslora`), so an adapter kart trains
//! is one `peft`, SGLang and vLLM load.

use super::ConfigError;
use serde::{Deserialize, Serialize};

/// The name a trainer's adapters are loaded under on SGLang and vLLM servers: a request that
/// names it is sampled from the trained policy, one that names the served model from the base.
pub const POLICY_ADAPTER: &str = "kart-policy";

/// Low-rank adapters on the policy's linear projections: each target `W` becomes
/// `W + scaling · B A`, with `A` `(r, in)` and `B` `(out, r)` the only trained parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapters' rank (PEFT's `r`).
    pub r: usize,
    /// The numerator of the scaling (PEFT's `lora_alpha`): `lora_alpha / r`, or
    /// `lora_alpha / sqrt(r)` with `use_rslora`.
    pub lora_alpha: f64,
    /// Dropout on the adapters' input while training (PEFT's `lora_dropout`).
    pub lora_dropout: f64,
    /// The projections that get adapters: a list of their names, or `all-linear` (every linear
    /// projection of the decoder layers; never the output head, as in PEFT).
    pub target_modules: TargetModules,
    /// Rank-stabilised scaling, `lora_alpha / sqrt(r)` (PEFT's `use_rslora`).
    pub use_rslora: bool,
}

impl Default for LoraConfig {
    /// PEFT's defaults, with its default targets for Qwen2 and Llama (`q_proj`, `v_proj`).
    fn default() -> Self {
        LoraConfig {
            r: 8,
            lora_alpha: 8.0,
            lora_dropout: 0.0,
            target_modules: TargetModules::Named(vec![Projection::QProj, Projection::VProj]),
            use_rslora: false,
        }
    }
}

impl LoraConfig {
    /// Rank `r` on every projection (`all-linear`) with `lora_alpha` twice the rank, no dropout:
    /// the usual choice for RL, which the benchmarks and `kart local --lora` train.
    pub fn all_linear(r: usize) -> LoraConfig {
        LoraConfig {
            r,
            lora_alpha: 2.0 * r as f64,
            target_modules: TargetModules::AllLinear(AllLinear::AllLinear),
            ..LoraConfig::default()
        }
    }

    /// The factor of `B A`: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`.
    pub fn scaling(&self) -> f64 {
        let r = self.r as f64;
        if self.use_rslora { self.lora_alpha / r.sqrt() } else { self.lora_alpha / r }
    }

    /// The projections that get adapters, in the decoder layer's order.
    pub fn targets(&self) -> Vec<Projection> {
        match &self.target_modules {
            TargetModules::AllLinear(_) => Projection::ALL.to_vec(),
            TargetModules::Named(names) => {
                Projection::ALL.into_iter().filter(|p| names.contains(p)).collect()
            }
        }
    }

    /// Checks the ranges (field names relative to the LoRA section).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.r == 0 {
            return Err(ConfigError::new("r", self.r, "must be at least 1"));
        }
        if !(self.lora_alpha.is_finite() && self.lora_alpha > 0.0) {
            return Err(ConfigError::new("lora_alpha", self.lora_alpha, "must be positive"));
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return Err(ConfigError::new("lora_dropout", self.lora_dropout, "must be in [0, 1)"));
        }
        if let TargetModules::Named(names) = &self.target_modules
            && names.is_empty()
        {
            return Err(ConfigError::new(
                "target_modules",
                "[]",
                "name at least one projection, or all-linear",
            ));
        }
        Ok(())
    }
}

/// Which projections get adapters.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum TargetModules {
    /// `all-linear`.
    AllLinear(AllLinear),
    /// These projections, in every decoder layer.
    Named(Vec<Projection>),
}

/// `all-linear` or a list of projection names; anything else is an error naming what it got
/// and what it takes.
impl<'de> Deserialize<'de> for TargetModules {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        let names = Projection::ALL.map(Projection::name).join(", ");
        let projection = |name: &str| {
            Projection::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| {
                D::Error::custom(format!("target_modules: unknown projection {name:?} (one of {names})"))
            })
        };
        match Raw::deserialize(d).map_err(|_| {
            D::Error::custom("target_modules: expected \"all-linear\" or a list of projection names")
        })? {
            Raw::One(s) if s == "all-linear" => Ok(TargetModules::AllLinear(AllLinear::AllLinear)),
            Raw::One(s) => Err(D::Error::custom(format!(
                "target_modules: {s:?} is not \"all-linear\"; name projections in a list (of {names})"
            ))),
            Raw::Many(list) => {
                list.iter().map(|n| projection(n)).collect::<Result<_, _>>().map(TargetModules::Named)
            }
        }
    }
}

/// PEFT's shorthand for every linear projection but the output head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum AllLinear {
    #[serde(rename = "all-linear")]
    AllLinear,
}

/// A linear projection of a decoder layer, by its Hugging Face module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Projection {
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj,
}

impl Projection {
    /// Every projection of a decoder layer, attention's first.
    pub const ALL: [Projection; 7] = [
        Projection::QProj,
        Projection::KProj,
        Projection::VProj,
        Projection::OProj,
        Projection::GateProj,
        Projection::UpProj,
        Projection::DownProj,
    ];

    /// Its module name (`q_proj`).
    pub fn name(self) -> &'static str {
        match self {
            Projection::QProj => "q_proj",
            Projection::KProj => "k_proj",
            Projection::VProj => "v_proj",
            Projection::OProj => "o_proj",
            Projection::GateProj => "gate_proj",
            Projection::UpProj => "up_proj",
            Projection::DownProj => "down_proj",
        }
    }

    /// Its module path inside a decoder layer (`self_attn.q_proj`).
    pub fn path(self) -> String {
        let block = if self.is_attention() { "self_attn" } else { "mlp" };
        format!("{block}.{}", self.name())
    }

    fn is_attention(self) -> bool {
        matches!(self, Projection::QProj | Projection::KProj | Projection::VProj | Projection::OProj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peft_names_and_defaults_parse_and_scale() {
        let c: LoraConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, LoraConfig::default());
        assert_eq!(c.targets(), [Projection::QProj, Projection::VProj]);
        assert_eq!(c.scaling(), 1.0);
        let c: LoraConfig = serde_json::from_str(
            r#"{"r": 16, "lora_alpha": 32, "target_modules": "all-linear", "use_rslora": true}"#,
        )
        .unwrap();
        assert_eq!(c.targets(), Projection::ALL);
        assert_eq!(c.scaling(), 8.0);
        let c: LoraConfig = serde_json::from_str(r#"{"target_modules": ["down_proj", "q_proj"]}"#).unwrap();
        assert_eq!(c.targets(), [Projection::QProj, Projection::DownProj]);
        assert_eq!(Projection::DownProj.path(), "mlp.down_proj");
        assert_eq!(
            serde_json::to_value(&c.target_modules).unwrap(),
            serde_json::json!(["down_proj", "q_proj"])
        );
    }

    #[test]
    fn bad_values_are_named() {
        for (json, field) in [
            (r#"{"r": 0}"#, "r = 0"),
            (r#"{"lora_alpha": -1}"#, "lora_alpha = -1"),
            (r#"{"lora_dropout": 1.0}"#, "lora_dropout = 1"),
            (r#"{"target_modules": []}"#, "target_modules = []"),
        ] {
            let c: LoraConfig = serde_json::from_str(json).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.starts_with(field), "{json}: {e}");
        }
        for (json, named) in [
            (r#"{"target_modules": ["lm_head"]}"#, "unknown projection \"lm_head\""),
            (r#"{"target_modules": "all"}"#, "\"all\" is not \"all-linear\""),
            (r#"{"target_modules": 3}"#, "expected \"all-linear\" or a list"),
            (r#"{"rank": 8}"#, "unknown field `rank`"),
        ] {
            let e = serde_json::from_str::<LoraConfig>(json).unwrap_err().to_string();
            assert!(e.contains(named), "{json}: {e}");
        }
    }
}
