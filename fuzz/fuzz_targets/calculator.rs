//! The calculator on any expression: it never panics, a value reads back as a number, and a value
//! written without an exponent evaluates to itself (as Python's `repr` does).
#![no_main]

use kart_tools::calculator::evaluate;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|expression: &str| {
    let Ok(value) = evaluate(expression) else { return };
    assert!(value.parse::<f64>().is_ok(), "{expression:?} gave {value:?}");
    if value.chars().all(|c| c.is_ascii_digit() || c == '.' || c == '-') {
        assert_eq!(evaluate(&value).as_ref(), Ok(&value), "{expression:?}");
    }
});
