//! `kart convert verl`: a verl / Search-R1 command line (`python3 -m verl.trainer.main_ppo
//! data.train_files=… algorithm.adv_estimator=grpo …`) as a kart `TrainConfig` for the Search-R1
//! environment.
//!
//! Search-R1's fork of verl is followed where verl changed since: without
//! `actor.use_kl_loss=true` the KL to the reference is charged in the reward at
//! `algorithm.kl_ctrl.kl_coef`, and `rollout.n_agent` is the group size.
//!
//! Each `key=value` (Hydra's `+` and `++` prefixes allowed) is either mapped onto kart's key,
//! noted as having no effect in kart (placement and logging settings kart decides itself, with
//! the reason), or refused: a key kart does not know, or a value it cannot honour. Refusals are
//! collected, so one run lists them all.

use kart_core::config::overrides;
use kart_core::config::train::TrainConfig;
use serde_json::{Value, json};

/// What a command line became.
#[derive(Debug)]
pub struct Converted {
    /// The kart config (a `TrainConfig`, checked), when nothing was refused.
    pub config: Option<TrainConfig>,
    /// Keys accepted without effect in kart, with why.
    pub notes: Vec<(String, String)>,
    /// Keys kart cannot honour, with why.
    pub refused: Vec<(String, String)>,
}

/// How one verl key is treated.
enum Rule {
    /// Sets this kart key to the value.
    Set(&'static str),
    /// Sets this kart key to the value converted by the function (an error says why not).
    Convert(&'static str, fn(&Value) -> Result<Value, String>),
    /// No effect in kart, for this reason.
    Note(&'static str),
    /// No effect when the value is `expected` (kart's behaviour); refused otherwise, for this
    /// reason.
    Only(Value, &'static str),
}

/// The rule of a verl key (its Hydra prefix removed), or `None` when kart does not know it.
fn rule(key: &str) -> Option<Rule> {
    use Rule::*;
    Some(match key {
        "data.train_files" => Convert("data.train", one_file),
        "data.val_files" => Convert("data.test", one_file),
        "data.train_batch_size" => Set("batch.prompts"),
        "data.max_prompt_length" => Set("rollout.env.max_trajectory_tokens"),
        "data.max_response_length" => Set("rollout.env.max_response_length"),
        "data.max_obs_length" => Set("rollout.env.max_obs_length"),
        "data.train_data_num" => Convert("data.max_prompts", count_or_all),
        "data.val_data_num" => Convert("eval.max_prompts", count_or_all),
        "data.max_start_length" => {
            Note("kart never cuts a prompt (one over the trajectory cap ends truncated)")
        }
        "data.val_batch_size" => Note("evaluation is batched by the engine"),
        "data.shuffle_train_dataloader" => {
            Only(json!(true), "kart always shuffles the training prompts (seeded by `seed`)")
        }
        "algorithm.adv_estimator" => Convert("algorithm.advantage", estimator),
        "algorithm.gamma" => Set("algorithm.gamma"),
        "algorithm.lam" => Set("algorithm.lam"),
        "algorithm.kl_ctrl.kl_coef" => Set("algorithm.kl_ctrl.kl_coef"),
        "algorithm.kl_ctrl.type" => Set("algorithm.kl_ctrl.type"),
        "algorithm.kl_ctrl.target_kl" => Set("algorithm.kl_ctrl.target_kl"),
        "algorithm.kl_ctrl.horizon" => Set("algorithm.kl_ctrl.horizon"),
        "algorithm.use_kl_in_reward" => Set("algorithm.kl_in_reward"),
        "algorithm.kl_penalty" => Set("algorithm.kl_penalty"),
        "algorithm.no_think_rl" => Only(json!(false), "kart trains the whole response"),
        "actor_rollout_ref.model.path" => Set("model"),
        "actor_rollout_ref.model.enable_gradient_checkpointing" => Set("activation_checkpointing"),
        "actor_rollout_ref.model.lora_rank" => Note("read with lora_alpha and target_modules: kart's lora"),
        "actor_rollout_ref.model.lora_alpha" | "actor_rollout_ref.model.target_modules" => {
            Note("read with lora_rank: kart's lora")
        }
        "actor_rollout_ref.model.use_remove_padding" => Only(json!(true), "kart never pads sequences"),
        "actor_rollout_ref.actor.optim.lr" => Set("optim.lr"),
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio" => Set("optim.warmup_ratio"),
        "actor_rollout_ref.actor.optim.weight_decay" => Set("optim.weight_decay"),
        "actor_rollout_ref.actor.grad_clip" => Set("optim.grad_clip"),
        "actor_rollout_ref.actor.use_kl_loss" => Note("read with kl_loss_type: kart's algorithm.kl_loss"),
        "actor_rollout_ref.actor.kl_loss_coef" => Set("algorithm.kl_coef"),
        "actor_rollout_ref.actor.kl_loss_type" => Note("read with use_kl_loss: kart's algorithm.kl_loss"),
        "actor_rollout_ref.actor.entropy_coeff" => Set("algorithm.entropy_coef"),
        "actor_rollout_ref.actor.clip_ratio" => Note("read as clip_ratio_low and clip_ratio_high"),
        "actor_rollout_ref.actor.clip_ratio_low" => Set("algorithm.clip_ratio_low"),
        "actor_rollout_ref.actor.clip_ratio_high" => Set("algorithm.clip_ratio_high"),
        "actor_rollout_ref.actor.clip_ratio_c" => Set("algorithm.clip_ratio_c"),
        "actor_rollout_ref.actor.loss_agg_mode" => Set("algorithm.loss_agg_mode"),
        "actor_rollout_ref.actor.ppo_epochs" => Set("algorithm.ppo_epochs"),
        "actor_rollout_ref.actor.ppo_mini_batch_size" => Set("batch.mini_batch_prompts"),
        "actor_rollout_ref.actor.ppo_micro_batch_size"
        | "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" => Set("batch.micro_batch_size"),
        "actor_rollout_ref.actor.state_masking" => Set("algorithm.mask_observations"),
        "actor_rollout_ref.actor.fsdp_config.param_offload"
        | "actor_rollout_ref.actor.fsdp_config.grad_offload"
        | "actor_rollout_ref.actor.fsdp_config.optimizer_offload"
        | "actor_rollout_ref.ref.fsdp_config.param_offload" => {
            Note("kart keeps weights on the device and shards them across ranks instead (`sharding`)")
        }
        "actor_rollout_ref.rollout.n" | "actor_rollout_ref.rollout.n_agent" => Convert("batch.n", group_size),
        "actor_rollout_ref.rollout.temperature" => Set("rollout.sampling.temperature"),
        "actor_rollout_ref.rollout.top_p" => Set("rollout.sampling.top_p"),
        "actor_rollout_ref.rollout.top_k" => Set("rollout.sampling.top_k"),
        "actor_rollout_ref.rollout.name"
        | "actor_rollout_ref.rollout.gpu_memory_utilization"
        | "actor_rollout_ref.rollout.tensor_model_parallel_size" => {
            Note("the inference engine is the rollout pool's (`engine` of its config)")
        }
        "actor_rollout_ref.rollout.log_prob_micro_batch_size"
        | "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
        | "actor_rollout_ref.ref.log_prob_micro_batch_size"
        | "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu" => {
            Note("log-probabilities are recomputed in the update's micro-batches")
        }
        "critic.optim.lr" => Set("critic.optim.lr"),
        "critic.optim.lr_warmup_steps_ratio" => Set("critic.optim.warmup_ratio"),
        "critic.cliprange_value" => Set("critic.cliprange_value"),
        "critic.model.path" => Note("the critic is the policy's architecture, started from `model`"),
        "critic.model.enable_gradient_checkpointing" => Note("`activation_checkpointing` covers the critic"),
        "critic.ppo_micro_batch_size" | "critic.ppo_micro_batch_size_per_gpu" => {
            Note("the critic shares the policy's micro-batches")
        }
        "critic.model.use_remove_padding" => Only(json!(true), "kart never pads sequences"),
        "critic.model.fsdp_config.param_offload"
        | "critic.model.fsdp_config.grad_offload"
        | "critic.model.fsdp_config.optimizer_offload" => {
            Note("kart keeps weights on the device and shards them across ranks instead (`sharding`)")
        }
        "trainer.critic_warmup" => Set("critic.warmup_steps"),
        "trainer.total_training_steps" => Set("total_steps"),
        "trainer.total_epochs" => Note("kart runs `total_steps` steps (trainer.total_training_steps)"),
        "trainer.save_freq" => Set("checkpoint.every"),
        "trainer.test_freq" => Set("eval.every"),
        "trainer.default_local_dir" => Set("output_dir"),
        "trainer.val_before_train" => Only(json!(true), "kart evaluates at step 0 when data.test is set"),
        "trainer.val_only" => Only(json!(false), "kart evaluates during training only (`eval.every`)"),
        "trainer.logger" | "trainer.project_name" | "trainer.experiment_name" => {
            Note("kart logs to metrics.jsonl and /metrics (Prometheus)")
        }
        "trainer.default_hdfs_dir" => Only(Value::Null, "kart writes to output_dir only"),
        "trainer.n_gpus_per_node" => Note("start ranks with --nproc-per-node (or the TrainingJob's GPUs)"),
        "trainer.nnodes" => Note("nodes come from the launcher (the TrainingJob's replicas)"),
        "max_turns" => Set("rollout.env.max_turns"),
        "retriever.url" => Set("rollout.retriever_url"),
        "retriever.topk" => Set("rollout.env.topk"),
        "reward_model.structure_format_score" => Set("rollout.env.reward.structure_format_score"),
        "reward_model.final_format_score" => Set("rollout.env.reward.final_format_score"),
        "reward_model.retrieval_score" => Set("rollout.env.reward.retrieval_score"),
        _ => return None,
    })
}

/// Converts the verl command line `args` (the command itself and anything after a shell
/// operator are skipped).
pub fn verl(args: &[String]) -> Converted {
    let mut config = json!({
        "model": "",
        "output_dir": "verl_checkpoints",
        "data": {"train": "", "format": "search-r1"},
        "rollout": {"env": {"kind": "search-r1"}},
    });
    let (mut notes, mut refused, mut sets) = (Vec::new(), Vec::new(), Vec::new());
    let pairs: Vec<(String, &str, Value)> = args
        .iter()
        .take_while(|a| !matches!(a.as_str(), "|" | "2>&1" | ">" | "&&" | ";"))
        .filter_map(|a| a.split_once('='))
        .map(|(k, v)| (k.trim_start_matches('+').to_owned(), v, parse(v)))
        .collect();
    let get = |key: &str| pairs.iter().rev().find(|(k, _, _)| k == key).map(|(_, _, v)| v.clone());
    for (key, text, value) in &pairs {
        match rule(key) {
            None => refused.push((key.clone(), "kart has no such setting".to_owned())),
            Some(Rule::Set(to)) => sets.push((to.to_owned(), value.clone())),
            Some(Rule::Convert(to, convert)) => match convert(value) {
                Ok(v) => sets.push((to.to_owned(), v)),
                Err(reason) => refused.push((format!("{key}={text}"), reason)),
            },
            Some(Rule::Note(why)) => notes.push((key.clone(), why.to_owned())),
            Some(Rule::Only(expected, why)) if *value == expected => {
                notes.push((key.clone(), why.to_owned()))
            }
            Some(Rule::Only(_, why)) => refused.push((format!("{key}={text}"), why.to_owned())),
        }
    }
    // Keys read together.
    let kl_loss = get("actor_rollout_ref.actor.use_kl_loss") == Some(json!(true));
    let kind = get("actor_rollout_ref.actor.kl_loss_type").unwrap_or(json!("low_var_kl"));
    sets.push(("algorithm.kl_loss".into(), if kl_loss { kind } else { Value::Null }));
    // Search-R1's verl puts the KL in the reward (at `kl_ctrl.kl_coef`) when it is not a loss.
    if !kl_loss && get("algorithm.use_kl_in_reward").is_none() && get("algorithm.kl_ctrl.kl_coef").is_some() {
        sets.push(("algorithm.kl_in_reward".into(), json!(true)));
    }
    // verl trains LoRA adapters when `lora_rank` > 0 (alpha 16 and all-linear by default).
    if get("actor_rollout_ref.model.lora_rank").and_then(|r| r.as_u64()).is_some_and(|r| r > 0) {
        let model =
            |key: &str, default: Value| get(&format!("actor_rollout_ref.model.{key}")).unwrap_or(default);
        sets.push(("lora.r".into(), model("lora_rank", json!(0))));
        sets.push(("lora.lora_alpha".into(), model("lora_alpha", json!(16))));
        sets.push(("lora.target_modules".into(), model("target_modules", json!("all-linear"))));
    }
    if let Some(ratio) = get("actor_rollout_ref.actor.clip_ratio") {
        for side in ["low", "high"] {
            if get(&format!("actor_rollout_ref.actor.clip_ratio_{side}")).is_none() {
                sets.push((format!("algorithm.clip_ratio_{side}"), ratio.clone()));
            }
        }
    }
    if get("algorithm.reward_fn").is_none()
        && ["structure_format_score", "final_format_score", "retrieval_score"]
            .iter()
            .any(|k| get(&format!("reward_model.{k}")).is_some())
    {
        sets.push(("rollout.env.reward_fn".into(), json!("em_format")));
    }
    if get("trainer.total_training_steps").is_none() && get("trainer.total_epochs").is_some() {
        let reason = "kart counts steps, not epochs: give trainer.total_training_steps";
        refused.push(("trainer.total_epochs".into(), reason.into()));
    }
    let overrides: Vec<String> = sets.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if let Err(e) = overrides::apply(&mut config, &overrides) {
        refused.push((e.field.clone(), e.to_string()));
    }
    let config = match refused.is_empty() {
        false => None,
        true => match serde_json::from_value::<TrainConfig>(config) {
            Ok(c) => match c.validate() {
                Ok(()) => Some(c),
                Err(e) => {
                    refused.push((e.field.clone(), e.to_string()));
                    None
                }
            },
            Err(e) => {
                refused.push(("(config)".into(), e.to_string()));
                None
            }
        },
    };
    Converted { config, notes, refused }
}

/// A command-line value as Hydra reads it: JSON when it parses (numbers, booleans, null, lists),
/// `True`/`False` as booleans, `[a,b]` as a list, quotes removed, else the string.
fn parse(text: &str) -> Value {
    let text = text.trim_matches(|c| c == '"' || c == '\'');
    match text {
        "True" | "true" => json!(true),
        "False" | "false" => json!(false),
        "null" | "None" => Value::Null,
        _ => serde_json::from_str(text).unwrap_or_else(|_| {
            match text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
                Some(items) => Value::Array(items.split(',').map(|i| parse(i.trim())).collect()),
                None => json!(text),
            }
        }),
    }
}

/// One file: a path, or a list of one.
fn one_file(value: &Value) -> Result<Value, String> {
    match value {
        Value::String(_) => Ok(value.clone()),
        Value::Array(files) if files.len() == 1 => Ok(files[0].clone()),
        _ => Err("kart trains on one file: merge them with `kart data merge`".into()),
    }
}

/// A prompt count, null meaning all (kart's 0).
fn count_or_all(value: &Value) -> Result<Value, String> {
    match value {
        Value::Null => Ok(json!(0)),
        Value::Number(n) if n.as_u64().is_some() => Ok(value.clone()),
        _ => Err("expected a count or null".into()),
    }
}

/// verl's estimator names kart has.
fn estimator(value: &Value) -> Result<Value, String> {
    match value.as_str() {
        Some(name @ ("grpo" | "rloo" | "gae")) => Ok(json!(name)),
        _ => Err("kart's estimators are grpo, rloo and gae (and drgrpo)".into()),
    }
}

/// The group size: Search-R1 repeats each prompt `n_agent` times; `n` is verl's name.
fn group_size(value: &Value) -> Result<Value, String> {
    match value.as_u64() {
        Some(n) if n >= 1 => Ok(value.clone()),
        _ => Err("expected a count of at least 1".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn a_search_r1_command_line_becomes_its_config() {
        let c = verl(&args(
            "python3 -m verl.trainer.main_ppo data.train_files=data/nq/train.parquet \
             data.val_files=data/nq/test.parquet data.train_batch_size=512 data.max_prompt_length=4096 \
             data.max_response_length=500 data.max_obs_length=500 algorithm.adv_estimator=grpo \
             actor_rollout_ref.model.path=Qwen/Qwen2.5-3B actor_rollout_ref.actor.optim.lr=1e-6 \
             actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.001 \
             actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.ppo_mini_batch_size=256 \
             actor_rollout_ref.actor.ppo_micro_batch_size=64 actor_rollout_ref.rollout.n_agent=5 \
             actor_rollout_ref.actor.fsdp_config.param_offload=true +trainer.val_before_train=true \
             algorithm.kl_ctrl.type=adaptive algorithm.kl_ctrl.target_kl=0.2 \
             trainer.total_training_steps=1005 trainer.save_freq=100 trainer.test_freq=50 max_turns=2 \
             retriever.url=\"http://127.0.0.1:8000/retrieve\" retriever.topk=3 2>&1 | tee log",
        ));
        assert!(c.refused.is_empty(), "{:?}", c.refused);
        let config = serde_json::to_value(c.config.unwrap()).unwrap();
        assert_eq!(config["model"], "Qwen/Qwen2.5-3B");
        assert_eq!((&config["batch"]["prompts"], &config["batch"]["n"]), (&json!(512), &json!(5)));
        assert_eq!(config["batch"]["mini_batch_prompts"], 256);
        assert_eq!(
            (&config["algorithm"]["kl_loss"], &config["algorithm"]["kl_coef"]),
            (&json!("low_var_kl"), &json!(0.001))
        );
        assert_eq!(config["rollout"]["env"]["max_trajectory_tokens"], 4096);
        assert_eq!(
            (&config["rollout"]["env"]["max_turns"], &config["rollout"]["env"]["topk"]),
            (&json!(2), &json!(3))
        );
        assert_eq!(config["rollout"]["retriever_url"], "http://127.0.0.1:8000/retrieve");
        assert_eq!(
            (&config["total_steps"], &config["checkpoint"]["every"], &config["eval"]["every"]),
            (&json!(1005), &json!(100), &json!(50))
        );
        assert_eq!(
            (&config["algorithm"]["kl_ctrl"]["type"], &config["algorithm"]["kl_ctrl"]["target_kl"]),
            (&json!("adaptive"), &json!(0.2))
        );
        assert!(c.notes.iter().any(|(k, _)| k == "actor_rollout_ref.actor.fsdp_config.param_offload"));
    }

    #[test]
    fn search_r1_ppo_charges_the_kl_in_the_reward() {
        let c = verl(&args(
            "data.train_files=t.parquet algorithm.adv_estimator=gae actor_rollout_ref.model.path=m \
             critic.optim.lr=1e-5 critic.optim.lr_warmup_steps_ratio=0.015 algorithm.kl_ctrl.kl_coef=0.001 \
             trainer.total_training_steps=1005 trainer.critic_warmup=0 retriever.url=http://r:8000/retrieve",
        ));
        assert!(c.refused.is_empty(), "{:?}", c.refused);
        let config = serde_json::to_value(c.config.unwrap()).unwrap();
        let algorithm = &config["algorithm"];
        assert_eq!(
            (&algorithm["advantage"], &algorithm["kl_loss"], &algorithm["kl_in_reward"]),
            (&json!("gae"), &Value::Null, &json!(true))
        );
        assert_eq!(
            (&config["critic"]["optim"]["lr"], &config["critic"]["optim"]["warmup_ratio"]),
            (&json!(1e-5), &json!(0.015))
        );
    }

    #[test]
    fn verls_lora_keys_become_karts_lora() {
        let line = "data.train_files=t.parquet actor_rollout_ref.model.path=m trainer.total_training_steps=5 \
                    retriever.url=http://r:8000/retrieve";
        let lora = |extra: &str| {
            let c = verl(&args(&format!("{line} {extra}")));
            assert!(c.refused.is_empty(), "{:?}", c.refused);
            serde_json::to_value(c.config.unwrap()).unwrap()["lora"].clone()
        };
        assert_eq!(lora(""), Value::Null);
        assert_eq!(lora("actor_rollout_ref.model.lora_rank=0"), Value::Null);
        let l = lora("actor_rollout_ref.model.lora_rank=32");
        assert_eq!(
            (&l["r"], &l["lora_alpha"], &l["target_modules"]),
            (&json!(32), &json!(16.0), &json!("all-linear"))
        );
        let l = lora(
            "actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.model.lora_alpha=32 \
             actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
        );
        assert_eq!(
            (&l["r"], &l["lora_alpha"], &l["target_modules"]),
            (&json!(8), &json!(32.0), &json!(["q_proj", "v_proj"]))
        );
    }

    #[test]
    fn what_kart_cannot_honour_is_listed() {
        let c = verl(&args(
            "data.train_files=[a.parquet,b.parquet] algorithm.adv_estimator=reinforce_plus_plus \
             trainer.val_only=true actor_rollout_ref.actor.use_dynamic_bsz=true trainer.total_epochs=15 \
             actor_rollout_ref.model.path=m",
        ));
        assert!(c.config.is_none());
        let keys: Vec<&str> = c.refused.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "data.train_files=[a.parquet,b.parquet]",
                "algorithm.adv_estimator=reinforce_plus_plus",
                "trainer.val_only=true",
                "actor_rollout_ref.actor.use_dynamic_bsz",
                "trainer.total_epochs",
            ]
        );
    }

    /// Search-R1's `train_grpo.sh` and `train_ppo.sh` command lines.
    const TRAIN_GRPO: &str = concat!(
        r#"python3 -m verl.trainer.main_ppo data.train_files=data/nq_search/train.parquet "#,
        r#"data.val_files=data/nq_search/test.parquet data.train_data_num=null data.val_data_num=null "#,
        r#"data.train_batch_size=512 data.val_batch_size=256 data.max_prompt_length=4096 "#,
        r#"data.max_response_length=500 data.max_start_length=2048 data.max_obs_length=500 "#,
        r#"data.shuffle_train_dataloader=True algorithm.adv_estimator=grpo "#,
        r#"actor_rollout_ref.model.path=Qwen/Qwen2.5-3B "#,
        r#"actor_rollout_ref.model.enable_gradient_checkpointing=true "#,
        r#"actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.optim.lr=1e-6 "#,
        r#"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285 "#,
        r#"actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.ppo_mini_batch_size=256 "#,
        r#"actor_rollout_ref.actor.ppo_micro_batch_size=64 "#,
        r#"actor_rollout_ref.actor.fsdp_config.param_offload=true "#,
        r#"actor_rollout_ref.actor.fsdp_config.grad_offload=true "#,
        r#"actor_rollout_ref.actor.fsdp_config.optimizer_offload=true "#,
        r#"actor_rollout_ref.rollout.log_prob_micro_batch_size=128 "#,
        r#"actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.name=vllm "#,
        r#"actor_rollout_ref.rollout.gpu_memory_utilization=0.6 "#,
        r#"actor_rollout_ref.ref.log_prob_micro_batch_size=128 "#,
        r#"actor_rollout_ref.ref.fsdp_config.param_offload=True "#,
        r#"actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl "#,
        r#"algorithm.no_think_rl=false actor_rollout_ref.rollout.n_agent=5 "#,
        r#"actor_rollout_ref.rollout.temperature=1 actor_rollout_ref.actor.state_masking=true "#,
        r#"trainer.logger=['wandb'] +trainer.val_only=false +trainer.val_before_train=true "#,
        r#"trainer.default_hdfs_dir=null trainer.n_gpus_per_node=8 trainer.nnodes=1 "#,
        r#"trainer.save_freq=100 trainer.test_freq=50 trainer.project_name=Search-R1 "#,
        r#"trainer.experiment_name=nq-search-r1-grpo-qwen2.5-3b-em trainer.total_epochs=15 "#,
        r#"trainer.total_training_steps=1005 trainer.default_hdfs_dir=null "#,
        r#"trainer.default_local_dir=verl_checkpoints/nq-search-r1-grpo-qwen2.5-3b-em max_turns=2 "#,
        r#"retriever.url="http://127.0.0.1:8000/retrieve" retriever.topk=3 "#,
    );
    const TRAIN_PPO: &str = concat!(
        r#"python3 -m verl.trainer.main_ppo data.train_files=data/nq_search/train.parquet "#,
        r#"data.val_files=data/nq_search/test.parquet data.train_data_num=null data.val_data_num=null "#,
        r#"data.train_batch_size=512 data.val_batch_size=256 data.max_prompt_length=4096 "#,
        r#"data.max_response_length=500 data.max_start_length=2048 data.max_obs_length=500 "#,
        r#"data.shuffle_train_dataloader=True algorithm.adv_estimator=gae "#,
        r#"actor_rollout_ref.model.path=Qwen/Qwen2.5-3B actor_rollout_ref.actor.optim.lr=1e-6 "#,
        r#"actor_rollout_ref.model.enable_gradient_checkpointing=true "#,
        r#"actor_rollout_ref.model.use_remove_padding=True "#,
        r#"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285 "#,
        r#"actor_rollout_ref.actor.ppo_mini_batch_size=256 "#,
        r#"actor_rollout_ref.actor.ppo_micro_batch_size=64 "#,
        r#"actor_rollout_ref.actor.fsdp_config.param_offload=true "#,
        r#"actor_rollout_ref.actor.fsdp_config.grad_offload=true "#,
        r#"actor_rollout_ref.actor.fsdp_config.optimizer_offload=true "#,
        r#"actor_rollout_ref.rollout.log_prob_micro_batch_size=128 "#,
        r#"actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.name=vllm "#,
        r#"actor_rollout_ref.rollout.gpu_memory_utilization=0.6 "#,
        r#"actor_rollout_ref.ref.log_prob_micro_batch_size=128 "#,
        r#"actor_rollout_ref.ref.fsdp_config.param_offload=True actor_rollout_ref.rollout.n_agent=1 "#,
        r#"actor_rollout_ref.rollout.temperature=1 actor_rollout_ref.actor.state_masking=true "#,
        r#"critic.optim.lr=1e-5 critic.model.use_remove_padding=True "#,
        r#"critic.optim.lr_warmup_steps_ratio=0.015 critic.model.path=Qwen/Qwen2.5-3B "#,
        r#"critic.model.enable_gradient_checkpointing=true critic.ppo_micro_batch_size=8 "#,
        r#"critic.model.fsdp_config.param_offload=true critic.model.fsdp_config.grad_offload=true "#,
        r#"critic.model.fsdp_config.optimizer_offload=true algorithm.kl_ctrl.kl_coef=0.001 "#,
        r#"algorithm.no_think_rl=false trainer.critic_warmup=0 trainer.logger=['wandb'] "#,
        r#"+trainer.val_only=false +trainer.val_before_train=true trainer.default_hdfs_dir=null "#,
        r#"trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=100 trainer.test_freq=50 "#,
        r#"trainer.project_name=Search-R1 trainer.experiment_name=nq-search-r1-ppo-qwen2.5-3b-em "#,
        r#"trainer.total_epochs=15 trainer.total_training_steps=1005 trainer.default_hdfs_dir=null "#,
        r#"trainer.default_local_dir=verl_checkpoints/nq-search-r1-ppo-qwen2.5-3b-em max_turns=2 "#,
        r#"retriever.url=http://127.0.0.1:8000/retrieve retriever.topk=3 "#,
    );

    /// Every recipe of `deploy/recipes/` loads strictly (an unknown key fails) and validates, and
    /// the README maps its upstream keys.
    #[test]
    fn every_recipe_is_a_train_config_that_validates() {
        let recipes = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/recipes");
        let readme = std::fs::read_to_string(recipes.join("README.md")).unwrap();
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&recipes).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let text = std::fs::read_to_string(&path).unwrap();
                let recipe: TrainConfig =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
                recipe.validate().unwrap_or_else(|e| panic!("{path:?}: {e}"));
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                assert!(readme.contains(&format!("| `{name}` |")), "{name} is not in the README's table");
                names.push(name);
            }
        }
        names.sort();
        assert_eq!(
            names,
            ["asearcher-7b.json", "search-r1-grpo.json", "search-r1-ppo.json", "tir-math.json"]
        );
    }

    /// `deploy/recipes/search-r1-{grpo,ppo}.json` are what `kart convert verl` makes of
    /// Search-R1's scripts, with the model, data, output and retriever at their cluster paths.
    #[test]
    fn the_search_r1_recipes_are_the_conversions_of_its_scripts() {
        let recipes = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/recipes");
        for (name, line) in [("search-r1-grpo", TRAIN_GRPO), ("search-r1-ppo", TRAIN_PPO)] {
            let c = verl(&args(line));
            assert!(c.refused.is_empty(), "{name}: {:?}", c.refused);
            let mut converted = serde_json::to_value(c.config.unwrap()).unwrap();
            let text = std::fs::read_to_string(recipes.join(format!("{name}.json"))).unwrap();
            let recipe: TrainConfig = serde_json::from_str(&text).unwrap();
            recipe.validate().unwrap();
            let recipe = serde_json::to_value(recipe).unwrap();
            for key in ["model", "output_dir"] {
                converted[key] = recipe[key].clone();
            }
            for key in ["train", "test"] {
                converted["data"][key] = recipe["data"][key].clone();
            }
            converted["rollout"]["retriever_url"] = recipe["rollout"]["retriever_url"].clone();
            assert_eq!(converted, recipe, "{name}");
        }
    }
}
