//! Tool-integrated reasoning's outcome reward: 1 when the completion's final answer equals the gold
//! answer, else 0, after math-aware normalisation.
//!
//! Modelled on the grader AReaL's TIR example uses (`areal/reward/math_parser.py`, the
//! `extract_answer`/`strip_string`/`math_equal` of the Qwen2.5-Math evaluation), without sympy:
//! - Extraction ([`extract_answer`]): the first `<answer>…</answer>`; else Minerva's `final answer
//!   is $…$. I hope`; else the argument of the last `boxed` with balanced braces (or, without a
//!   brace, the text up to the next `$`); else the text after the last `he answer is` or `final
//!   answer is`. Line breaks are dropped, and a leading `:` and a trailing `.` and `/`.
//! - Normalisation ([`normalize`]): `strip_string`'s rules — trailing dots, `\!`, `\left`/`\right`,
//!   `\{`/`\}`, `\dfrac`/`\tfrac` to `\frac`, `\neq`/`\leq`/`\geq`, a trailing `\text{unit}`, degree
//!   marks, `$`, `\(`/`\)`, `\text{…}` (also `\textbf`, `\mathrm`, `\mathbf`, `\mbox`) to its
//!   content, `\%`, a short left-hand side (`x = 5`, `k=5`, `x \in`), `\emptyset`, `.5` to `0.5`,
//!   `5.00` to `5`, `\sqrt2` and `\frac12`/`\frac1{2}`/`\frac{1}2` to braced form, `3/4` to
//!   `\frac{3}{4}`, all white space — plus thin spaces (`\,` `\;` `\:`), `\displaystyle`, `π`,
//!   thousands separators (`1,000`, `1{,}000`), `and` in lists, a trailing unit word after a number
//!   (`5 cm`, `12 inches`, `3 square units`), braces around a one-character exponent or subscript
//!   (`x^{2}`), and grouping parentheses or braces around the whole answer.
//! - Comparison ([`is_equivalent`]): equal normalised strings (ignoring case); else, when both read
//!   as numbers — decimals, `\frac`, `\sqrt`/`\sqrt[n]`, `\pi`, `+ - * / ^`, `\cdot`, `\times`,
//!   `\div`, implicit products like `2\sqrt{3}` — equal within a relative tolerance of 1e-4
//!   (`math_equal`'s `isclose`), a percentage also matching its hundredth (`50\%` equals `50` and
//!   `0.5`); else element-wise for tuples and intervals (same brackets, in order), sets and bare
//!   lists (in any order) and `pmatrix` matrices; else a gold letter A–E matches the last standalone
//!   letter A–E of the prediction.
//!
//! Unlike upstream: no symbolic algebra (`x+1` and `1+x` differ), a plain number is not also
//! compared with the gold times or divided by 100, commas separate thousands only in the `1,000`
//! form (upstream drops every comma of a number, so `1,2` equals `12`), and brackets must agree
//! (`[1,2]` is not `(1,2)`). Everything is bounded: answers longer than [`MAX_ANSWER_CHARS`] are
//! compared as strings only.

use regex::Regex;
use std::sync::LazyLock;

/// The longest normalised answer evaluated as a number or split into elements.
pub const MAX_ANSWER_CHARS: usize = 1000;

/// Relative tolerance of numeric equality (`math_equal`'s `rel_tol`).
const RELATIVE_TOLERANCE: f64 = 1e-4;

/// Nesting allowed in a numeric expression or in nested lists.
const MAX_DEPTH: usize = 64;

/// Elements compared in a list, set or matrix.
const MAX_ELEMENTS: usize = 256;

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("valid regex")
}

static LEFT_RIGHT: LazyLock<Regex> = LazyLock::new(|| regex(r"\\(?:left|right)([^a-zA-Z]|$)"));
static ARRAY_BEGIN: LazyLock<Regex> = LazyLock::new(|| regex(r"\\begin\{array\}\{.*?\}"));
static TRAILING_TEXT: LazyLock<Regex> = LazyLock::new(|| regex(r"\\text\{.*?\}$"));
static TEXT: LazyLock<Regex> =
    LazyLock::new(|| regex(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\{(.*?)\}"));
/// A unit word after a number (`5 cm`, `3 square units`, `2 ft^2`).
static UNIT: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?ix) ([\d})]) \s* (?: square\s+ | sq\.?\s* | cubic\s+ )?
        (?: units? | cm | centimet(?:er|re)s? | mm | millimet(?:er|re)s? | met(?:er|re)s? | km
          | kilomet(?:er|re)s? | inch(?:es)? | feet | foot | ft | yards? | yd | miles? | mph | kmh | kph
          | kg | kilograms? | grams? | lbs? | pounds? | ounces? | oz | lit(?:er|re)s? | ml | gallons?
          | seconds? | secs? | minutes? | mins? | hours? | hrs? | days? | weeks? | months? | years?
          | degrees? | dollars? | cents? | rupees? | euros? )
        (?: \^\{?[23]\}? | ² | ³ )? \.? $",
    )
});
static PERCENT_WORD: LazyLock<Regex> = LazyLock::new(|| regex(r"(?i)\s*percent$"));
static LIST_AND: LazyLock<Regex> = LazyLock::new(|| regex(r"\s*,?\s*\band\b\s*"));
static SHORT_LHS: LazyLock<Regex> = LazyLock::new(|| regex(r"^\s*[a-zA-Z]\s*\\in\s*"));
static TRAILING_ZEROS_BEFORE: LazyLock<Regex> = LazyLock::new(|| regex(r"(\d+)\.0*([^\d])"));
static TRAILING_ZEROS_END: LazyLock<Regex> = LazyLock::new(|| regex(r"(\d+)\.0*$"));
static SQRT_BARE: LazyLock<Regex> = LazyLock::new(|| regex(r"\\sqrt(\w+)"));
static THOUSANDS: LazyLock<Regex> = LazyLock::new(|| regex(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$"));
static SLASH_FRACTION: LazyLock<Regex> = LazyLock::new(|| regex(r"^(-?\d+)/(-?\d+)$"));
static BRACED_CHAR: LazyLock<Regex> = LazyLock::new(|| regex(r"([\^_])\{([A-Za-z0-9])\}"));
static NEWLINE_AND_SPACE: LazyLock<Regex> = LazyLock::new(|| regex(r"\n\s*"));
static CHOICE: LazyLock<Regex> = LazyLock::new(|| regex(r"\b([A-E])\b"));

/// The final answer of a completion, or `None` when it gives none (see the module docs for the
/// rules); the result is not normalised.
pub fn extract_answer(text: &str) -> Option<String> {
    let answer = answer_tag(text)
        .or_else(|| minerva(text))
        .or_else(|| last_boxed(text))
        .or_else(|| text.rsplit_once("he answer is").map(|(_, after)| after.trim().to_owned()))
        .or_else(|| text.rsplit_once("final answer is").map(|(_, after)| after.trim().to_owned()))?;
    let mut answer = NEWLINE_AND_SPACE.replace_all(&answer, "").into_owned();
    if answer.starts_with(':') {
        answer.remove(0);
    }
    for suffix in ['.', '/'] {
        if answer.ends_with(suffix) {
            answer.pop();
        }
    }
    let answer = answer.trim();
    (!answer.is_empty() && answer != "None" && answer != "none").then(|| answer.to_owned())
}

fn answer_tag(text: &str) -> Option<String> {
    let start = text.find("<answer>")? + "<answer>".len();
    let end = text.find("</answer>")?;
    (start <= end).then(|| text[start..end].trim().to_owned())
}

fn minerva(text: &str) -> Option<String> {
    let (_, after) = text.split_once("final answer is $")?;
    let (answer, _) = after.split_once("$. I hope")?;
    Some(answer.trim().to_owned())
}

/// The argument of the last `boxed`: up to the brace that balances its opening one (or the end),
/// or, when no brace follows, up to the next `$`.
fn last_boxed(text: &str) -> Option<String> {
    let (_, after) = text.rsplit_once("boxed")?;
    let Some(inner) = after.strip_prefix('{') else {
        return Some(after.split('$').next().unwrap_or_default().trim().to_owned());
    };
    let mut depth = 1;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(inner[..i].to_owned());
                }
            }
            _ => {}
        }
    }
    Some(inner.to_owned())
}

/// Whether `pred` and `gold` are the same answer (see the module docs).
pub fn is_equivalent(pred: &str, gold: &str) -> bool {
    let (pred_text, gold_text) = (normalize(pred), normalize(gold));
    if pred_text.is_empty() || gold_text.is_empty() {
        return false;
    }
    if pred_text.to_lowercase() == gold_text.to_lowercase() {
        return true;
    }
    if let (Some(p), Some(g)) = (value(&pred_text), value(&gold_text)) {
        let readings = |x: f64, percent: bool| if percent { vec![x, x / 100.0] } else { vec![x] };
        let (ps, gs) = (readings(p, is_percentage(pred)), readings(g, is_percentage(gold)));
        return ps.iter().any(|&p| gs.iter().any(|&g| close(p, g)));
    }
    if structures_equivalent(&pred_text, &gold_text, 0) {
        return true;
    }
    matches!(gold_text.as_str(), "A" | "B" | "C" | "D" | "E")
        && CHOICE.captures_iter(&pred.to_uppercase()).last().is_some_and(|c| &c[1] == gold_text.as_str())
}

/// 1.0 when the completion's [`extract_answer`] [`is_equivalent`] to `gold`, else 0.0. A gold
/// answer holding `boxed` or `<answer>` is extracted first.
pub fn score(completion: &str, gold: &str) -> f64 {
    let gold = if gold.contains("boxed") || gold.contains("<answer>") {
        extract_answer(gold).unwrap_or_default()
    } else {
        gold.to_owned()
    };
    match extract_answer(completion) {
        Some(pred) if is_equivalent(&pred, &gold) => 1.0,
        _ => 0.0,
    }
}

/// Whether an answer is written as a percentage (`50\%`, `$50\%$`, `50 percent`).
fn is_percentage(answer: &str) -> bool {
    let answer = answer.trim_end_matches(|c: char| c.is_whitespace() || "$.}".contains(c));
    answer.ends_with('%') || PERCENT_WORD.is_match(answer)
}

/// Python's `math.isclose(a, b, rel_tol=1e-4)`.
fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= RELATIVE_TOLERANCE * a.abs().max(b.abs())
}

/// An answer in canonical form (see the module docs); comparisons also ignore case.
pub fn normalize(answer: &str) -> String {
    let mut s = answer.trim().replace('\n', "");
    s.truncate(s.trim_end_matches('.').len());
    for (from, to) in [
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\displaystyle", ""),
        ("{,}", ","),
        ("π", "\\pi"),
        ("bmatrix", "pmatrix"),
        ("\\end{array}", "\\end{pmatrix}"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\neq", "\\ne"),
        ("\\leq", "\\le"),
        ("\\geq", "\\ge"),
    ] {
        s = s.replace(from, to);
    }
    s = ARRAY_BEGIN.replace_all(&s, "\\begin{pmatrix}").into_owned();
    s = LEFT_RIGHT.replace_all(&s, "$1").into_owned();
    s = s.replace("\\{", "{").replace("\\}", "}");
    let without_unit = TRAILING_TEXT.replace(&s, "");
    if !without_unit.trim().is_empty() {
        s = without_unit.trim().to_owned();
    }
    for (from, to) in
        [("^{\\circ}", ""), ("^\\circ", ""), ("°", ""), ("\\$", ""), ("$", ""), ("\\(", ""), ("\\)", "")]
    {
        s = s.replace(from, to);
    }
    s = TEXT.replace_all(&s, "$1").into_owned();
    s = PERCENT_WORD.replace(&s, "").into_owned();
    s = UNIT.replace(s.trim(), "$1").into_owned();
    s = SHORT_LHS.replace(&s, "").into_owned();
    s = s.replace("\\emptyset", "{}");
    s = s.replace("\\%", "").replace('%', "");
    s = s.replace(" .", " 0.").replace("{.", "{0.");
    s = s.replace("infinity", "\\infty");
    if !s.contains("\\infty") {
        s = s.replace("inf", "\\infty");
    }
    s = s.replace("+\\infty", "\\infty");
    s = LIST_AND.replace_all(&s, ",").into_owned();
    s = TRAILING_ZEROS_BEFORE.replace_all(&s, "$1$2").into_owned();
    s = TRAILING_ZEROS_END.replace(&s, "$1").into_owned();
    if s.starts_with('.') {
        s.insert(0, '0');
    }
    if let Some((lhs, rhs)) = s.split_once('=')
        && !rhs.contains('=')
        && lhs.trim().chars().count() <= 2
    {
        s = rhs.to_owned();
    }
    s = SQRT_BARE.replace_all(&s, "\\sqrt{$1}").into_owned();
    s.retain(|c| !c.is_whitespace());
    s = s.replace("(-\\infty,\\infty)", "\\mathbb{R}");
    s = fix_fracs(&s);
    s = BRACED_CHAR.replace_all(&s, "$1$2").into_owned();
    if THOUSANDS.is_match(&s) {
        s.retain(|c| c != ',');
    }
    s = SLASH_FRACTION.replace(&s, "\\frac{$1}{$2}").into_owned();
    unwrap_grouping(&s).to_owned()
}

/// `\frac` with unbraced arguments (`\frac12`, `\frac1{2}`, `\frac{1}2`) in braced form.
fn fix_fracs(s: &str) -> String {
    let mut parts = s.split("\\frac");
    let mut out = parts.next().unwrap_or_default().to_owned();
    for part in parts {
        out.push_str("\\frac");
        let mut rest = part;
        for _ in 0..2 {
            if rest.starts_with('{') {
                let end = group_end(rest).unwrap_or(rest.len());
                out.push_str(&rest[..end]);
                rest = &rest[end..];
            } else if let Some(c) = rest.chars().next() {
                out.push_str(&format!("{{{c}}}"));
                rest = &rest[c.len_utf8()..];
            }
        }
        out.push_str(rest);
    }
    out
}

/// The byte length of the balanced group `s` starts with (an opening bracket of any kind), if it
/// closes.
fn group_end(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// `s` without parentheses or braces around all of it that hold no top-level comma (grouping,
/// not a tuple or set).
fn unwrap_grouping(mut s: &str) -> &str {
    while s.len() <= MAX_ANSWER_CHARS
        && ((s.starts_with('(') && s.ends_with(')')) || (s.starts_with('{') && s.ends_with('}')))
    {
        let inner = &s[1..s.len() - 1];
        if inner.is_empty() || group_end(s) != Some(s.len()) || split_top_level(inner, ',').len() > 1 {
            break;
        }
        s = inner;
    }
    s
}

/// `s` split at `separator` outside brackets.
fn split_top_level(s: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            c if c == separator && depth == 0 => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A list answer: its brackets (`None` for a bare list) and elements.
struct List<'a> {
    brackets: Option<(char, char)>,
    elements: Vec<&'a str>,
}

impl<'a> List<'a> {
    fn parse(s: &'a str) -> Option<Self> {
        let first = s.chars().next()?;
        let last = s.chars().last()?;
        let bracketed = "([{".contains(first) && ")]}".contains(last) && group_end(s) == Some(s.len());
        let (brackets, inner) = if bracketed { (Some((first, last)), &s[1..s.len() - 1]) } else { (None, s) };
        let elements = split_top_level(inner, ',');
        (elements.len() > 1 && elements.len() <= MAX_ELEMENTS).then_some(List { brackets, elements })
    }

    /// Sets and bare lists (lists of solutions) ignore order; tuples and intervals do not.
    fn ordered(&self) -> bool {
        !matches!(self.brackets, None | Some(('{', '}')))
    }
}

/// Lists, sets, intervals and matrices compared element by element.
fn structures_equivalent(pred: &str, gold: &str, depth: usize) -> bool {
    if depth > MAX_DEPTH || pred.len() > MAX_ANSWER_CHARS || gold.len() > MAX_ANSWER_CHARS {
        return false;
    }
    if let (Some(p), Some(g)) = (matrix(pred), matrix(gold)) {
        return p.len() == g.len()
            && p.iter().zip(&g).all(|(p, g)| {
                p.len() == g.len() && p.iter().zip(g).all(|(p, g)| elements_equivalent(p, g, depth))
            });
    }
    let (Some(p), Some(g)) = (List::parse(pred), List::parse(gold)) else { return false };
    if p.elements.len() != g.elements.len() {
        return false;
    }
    let compatible = p.brackets == g.brackets
        || matches!(
            (p.brackets, g.brackets),
            (None, Some(('(', ')') | ('{', '}'))) | (Some(('(', ')') | ('{', '}')), None)
        );
    if !compatible {
        return false;
    }
    if p.ordered() || g.ordered() {
        return p.elements.iter().zip(&g.elements).all(|(p, g)| elements_equivalent(p, g, depth));
    }
    let mut unused: Vec<&str> = g.elements.clone();
    p.elements.iter().all(|p| match unused.iter().position(|g| elements_equivalent(p, g, depth)) {
        Some(i) => {
            unused.swap_remove(i);
            true
        }
        None => false,
    })
}

/// Two normalised elements: equal strings, equal numbers, or equivalent structures.
fn elements_equivalent(pred: &str, gold: &str, depth: usize) -> bool {
    let (pred, gold) = (unwrap_grouping(pred), unwrap_grouping(gold));
    if pred.to_lowercase() == gold.to_lowercase() {
        return true;
    }
    match (value(pred), value(gold)) {
        (Some(p), Some(g)) => close(p, g),
        _ => structures_equivalent(pred, gold, depth + 1),
    }
}

/// The cells of a `\begin{pmatrix}…\end{pmatrix}`, row by row.
fn matrix(s: &str) -> Option<Vec<Vec<&str>>> {
    let body = s.strip_prefix("\\begin{pmatrix}")?.strip_suffix("\\end{pmatrix}")?;
    let rows: Vec<Vec<&str>> = body
        .split("\\\\")
        .filter(|row| !row.trim().is_empty())
        .map(|row| row.split('&').map(str::trim).collect())
        .collect();
    (rows.iter().map(Vec::len).sum::<usize>() <= MAX_ELEMENTS).then_some(rows)
}

/// The value of a normalised answer that is a closed-form number, if finite.
fn value(s: &str) -> Option<f64> {
    if s.is_empty() || s.len() > MAX_ANSWER_CHARS {
        return None;
    }
    let mut reader = NumberReader { s, pos: 0, depth: 0 };
    let x = reader.sum()?;
    (reader.pos == s.len() && x.is_finite()).then_some(x)
}

/// A recursive-descent evaluator of LaTeX arithmetic: `sum: product (('+'|'-') product)*`,
/// `product: signed ((('*'|'/'|\cdot|\times|\div) signed) | atom)*` (juxtaposition multiplies),
/// `signed: ('+'|'-') signed | power`, `power: atom ['^' (group | digit)]`,
/// `atom: number | '(' sum ')' | '{' sum '}' | \frac group group | \sqrt ['[' sum ']'] group | \pi`.
struct NumberReader<'a> {
    s: &'a str,
    pos: usize,
    depth: usize,
}

impl NumberReader<'_> {
    fn rest(&self) -> &str {
        &self.s[self.pos..]
    }

    fn eat(&mut self, token: &str) -> bool {
        let found = self.rest().starts_with(token);
        if found {
            self.pos += token.len();
        }
        found
    }

    /// Runs `read` one level deeper, refusing past [`MAX_DEPTH`].
    fn nested(&mut self, read: impl FnOnce(&mut Self) -> Option<f64>) -> Option<f64> {
        if self.depth == MAX_DEPTH {
            return None;
        }
        self.depth += 1;
        let x = read(self);
        self.depth -= 1;
        x
    }

    fn sum(&mut self) -> Option<f64> {
        let mut x = self.product()?;
        loop {
            if self.eat("+") {
                x += self.product()?;
            } else if self.eat("-") {
                x -= self.product()?;
            } else {
                return Some(x);
            }
        }
    }

    fn product(&mut self) -> Option<f64> {
        let mut x = self.signed()?;
        loop {
            if self.eat("*") || self.eat("\\cdot") || self.eat("\\times") {
                x *= self.signed()?;
            } else if self.eat("/") || self.eat("\\div") {
                x /= self.signed()?;
            } else if self.starts_atom() {
                x *= self.power()?;
            } else {
                return Some(x);
            }
        }
    }

    fn signed(&mut self) -> Option<f64> {
        if self.eat("-") {
            self.nested(|r| r.signed()).map(|x| -x)
        } else if self.eat("+") {
            self.nested(|r| r.signed())
        } else {
            self.power()
        }
    }

    fn power(&mut self) -> Option<f64> {
        let base = self.atom()?;
        if !self.eat("^") {
            return Some(base);
        }
        let exponent = if self.rest().starts_with('{') {
            self.atom()?
        } else {
            let digit = self.rest().chars().next().filter(char::is_ascii_digit)?;
            self.pos += 1;
            f64::from(digit.to_digit(10)?)
        };
        Some(base.powf(exponent))
    }

    fn starts_atom(&self) -> bool {
        let rest = self.rest();
        rest.starts_with(|c: char| c.is_ascii_digit() || c == '.' || c == '(' || c == '{')
            || ["\\frac", "\\sqrt", "\\pi"].iter().any(|command| rest.starts_with(command))
    }

    fn group(&mut self, open: &str, close: &str) -> Option<f64> {
        if !self.eat(open) {
            return None;
        }
        let x = self.nested(|r| r.sum())?;
        self.eat(close).then_some(x)
    }

    fn atom(&mut self) -> Option<f64> {
        if self.eat("\\frac") {
            let numerator = self.group("{", "}")?;
            return Some(numerator / self.group("{", "}")?);
        }
        if self.eat("\\sqrt") {
            let index = if self.rest().starts_with('[') { self.group("[", "]")? } else { 2.0 };
            let radicand = self.group("{", "}")?;
            return Some(if index == 3.0 { radicand.cbrt() } else { radicand.powf(index.recip()) });
        }
        if self.eat("\\pi") {
            return Some(std::f64::consts::PI);
        }
        match self.rest().chars().next()? {
            '(' => self.group("(", ")"),
            '{' => self.group("{", "}"),
            c if c.is_ascii_digit() || c == '.' => {
                let len = self
                    .rest()
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(self.rest().len());
                let number = self.rest()[..len].parse().ok()?;
                self.pos += len;
                Some(number)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(pred: &str, gold: &str) {
        assert!(is_equivalent(pred, gold), "{pred:?} should equal {gold:?}");
    }

    fn differ(pred: &str, gold: &str) {
        assert!(!is_equivalent(pred, gold), "{pred:?} should differ from {gold:?}");
    }

    #[test]
    fn extraction() {
        let boxed = |s: &str| extract_answer(s);
        assert_eq!(boxed("so \\boxed{42}."), Some("42".into()));
        assert_eq!(boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}"), Some("\\frac{1}{2}".into()));
        assert_eq!(boxed("\\boxed{\\{1, 2\\}}"), Some("\\{1, 2\\}".into()));
        assert_eq!(boxed("$\\boxed 5$."), Some("5".into()));
        assert_eq!(boxed("\\boxed{12"), Some("12".into()));
        assert_eq!(boxed("<answer> 7 </answer> and \\boxed{8}"), Some("7".into()));
        assert_eq!(boxed("The final answer is $3$. I hope it is correct."), Some("3".into()));
        assert_eq!(boxed("So the answer is 12."), Some("12".into()));
        assert_eq!(boxed("the final answer is: 5/"), Some("5".into()));
        assert_eq!(boxed("\\boxed{\n  3\n}"), Some("3".into()));
        assert_eq!(boxed("I computed 42."), None);
        assert_eq!(boxed("\\boxed{}"), None);
        assert_eq!(boxed("\\boxed{None}"), None);
        assert_eq!(boxed("</answer><answer>"), None);
    }

    #[test]
    fn normalisation() {
        for (raw, normal) in [
            ("$\\dfrac{1}{2}$", "\\frac{1}{2}"),
            ("\\tfrac12", "\\frac{1}{2}"),
            ("\\frac1{72}", "\\frac{1}{72}"),
            ("\\frac{3}4", "\\frac{3}{4}"),
            ("3/4", "\\frac{3}{4}"),
            ("\\left( 1, 2 \\right)", "(1,2)"),
            ("\\sqrt2", "\\sqrt{2}"),
            ("10\\text{ cm}", "10"),
            ("5 \\mbox{ inches}", "5"),
            ("12 square units", "12"),
            ("90^\\circ", "90"),
            ("90^{\\circ}", "90"),
            ("\\$1,000", "1000"),
            ("1{,}000{,}000", "1000000"),
            ("x = 5", "5"),
            ("k=\\frac{1}{3}", "\\frac{1}{3}"),
            ("x \\in [1, 2]", "[1,2]"),
            ("\\text{(B)}", "B"),
            ("5.00", "5"),
            (".5", "0.5"),
            ("2\\!\\,000", "2000"),
            ("\\{1, 2\\}", "{1,2}"),
            ("1, 2, and 3", "1,2,3"),
            ("(x+1)", "x+1"),
            ("((7))", "7"),
            ("\\emptyset", "{}"),
            ("inf", "\\infty"),
            ("3.", "3"),
            ("\\begin{bmatrix} 1 & 2 \\end{bmatrix}", "\\begin{pmatrix}1&2\\end{pmatrix}"),
        ] {
            assert_eq!(normalize(raw), normal, "{raw:?}");
        }
    }

    #[test]
    fn numbers_compare_numerically() {
        same("0.5", "\\frac{1}{2}");
        same("1/2", "\\frac12");
        same("\\dfrac{1}{2}", "0.5");
        same("50\\%", "0.5");
        same("50%", "50");
        same("0.5", "50\\%");
        same("50 percent", "\\frac{1}{2}");
        same("$12.5\\%$", "0.125");
        same("2 ft^2", "2");
        differ("5", "500");
        same("1,000", "1000");
        same("1000.0", "1,000");
        same("x = 3", "3");
        same("2\\sqrt{3}", "\\sqrt{12}");
        same("\\sqrt[3]{27}", "3");
        same("3.14159", "\\pi");
        differ("3.14", "\\pi");
        same("\\frac{\\sqrt{2}}{2}", "0.70710678");
        same("2^{10}", "1024");
        same("-\\frac{2}{3}", "\\frac{-2}{3}");
        same("1.99999", "2");
        differ("1.99", "2");
        same("\\$12.50", "12.5");
        same("6 \\cdot 7", "42");
        same("3\\times10^{5}", "300000");
        differ("1", "2");
        differ("0", "0.00001");
        differ("\\sqrt{-1}", "1");
        differ("1/0", "\\infty");
    }

    #[test]
    fn strings_and_structures() {
        same("\\text{Monday}", "monday");
        same("x^2+1", "x^{2}+1");
        differ("x+1", "1+x");
        same("(1, 2)", "(1,2)");
        same("(0.5, \\frac{1}{3})", "\\left(\\frac12, 0.33333\\right)");
        differ("(2, 1)", "(1, 2)");
        same("1, 2", "(1, 2)");
        differ("[1, 2]", "(1, 2)");
        same("[1, 2)", "[1,2)");
        same("(-\\infty, 3]", "(-\\infty,3]");
        same("(-\\infty, \\infty)", "\\mathbb{R}");
        same("\\{3, 1, 2\\}", "\\{1, 2, 3\\}");
        same("3, -1", "-1 and 3");
        differ("1, 2", "1, 2, 3");
        differ("\\{1, 1\\}", "\\{1, 2\\}");
        same("((1, 2), (3, 4))", "((1,2),(3,4))");
        same(
            "\\begin{pmatrix} 1 & 0.5 \\\\ 0 & 1 \\end{pmatrix}",
            "\\begin{bmatrix}1&\\frac12\\\\0&1\\end{bmatrix}",
        );
        differ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}");
        same("The answer is (B)", "B");
        differ("A", "B");
        differ("", "");
        differ("5", "");
    }

    #[test]
    fn scores() {
        assert_eq!(score("Thus the count is \\boxed{120}.", "120"), 1.0);
        assert_eq!(score("\\boxed{\\dfrac{3}{4}}", "0.75"), 1.0);
        assert_eq!(score("<answer>$x = 2$</answer>", "2"), 1.0);
        assert_eq!(score("\\boxed{121}", "120"), 0.0);
        assert_eq!(score("no final answer: 120", "120"), 0.0);
        assert_eq!(score("\\boxed{7}", "The solution... so \\boxed{7}"), 1.0);
    }

    #[test]
    fn work_is_bounded() {
        let deep = format!("{}1{}", "(".repeat(5000), ")".repeat(5000));
        assert!(!is_equivalent(&deep, "2"));
        let wide = vec!["1"; 10_000].join(",");
        assert!(is_equivalent(&wide, &wide));
        assert!(!is_equivalent(&wide, &(wide.clone() + ",1")));
        assert_eq!(value(&"-".repeat(500)), None);
        assert_eq!(value(&("-".repeat(50) + "2")), Some(2.0));
    }
}
