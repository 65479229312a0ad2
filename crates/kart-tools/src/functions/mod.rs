//! Named functions a tool-calling model calls (the `tools` environment), each with its OpenAI
//! schema and a back end: a built-in tool ([`builtin`]), an HTTP endpoint ([`http`]) or an MCP
//! server's tool ([`mcp`]). [`Functions`] holds a worker's set, by name.

pub mod builtin;
pub mod http;
pub mod mcp;

use kart_core::tool::Function;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The functions a worker can run, by name.
#[derive(Clone, Default)]
pub struct Functions {
    by_name: BTreeMap<String, Arc<dyn Function>>,
    /// The names in the order configured, which is the order their schemas are offered in.
    order: Vec<String>,
}

/// Two back ends claim one function name.
#[derive(Debug, thiserror::Error)]
#[error("two functions are named `{0}`; names must be unique")]
pub struct DuplicateFunction(pub String);

impl Functions {
    /// Adds `function`; its name must be new.
    pub fn add(&mut self, function: Arc<dyn Function>) -> Result<(), DuplicateFunction> {
        let name = function.name().to_owned();
        if self.by_name.insert(name.clone(), function).is_some() {
            return Err(DuplicateFunction(name));
        }
        self.order.push(name);
        Ok(())
    }

    /// The function named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Function>> {
        self.by_name.get(name)
    }

    /// Every function's schema, in the configured order.
    pub fn schemas(&self) -> Vec<Value> {
        self.order.iter().map(|name| self.by_name[name].schema().clone()).collect()
    }
}

impl std::fmt::Debug for Functions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.order).finish()
    }
}

/// The schema of a function in OpenAI's format.
pub fn schema(name: &str, description: &str, parameters: Value) -> Value {
    serde_json::json!({
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters}
    })
}
