//! The TIR calculator: upstream's `CalculatorTool` without `eval`.
//!
//! Upstream accepts an expression matching `^[0-9+\-*/().\s]+$` and returns `str(eval(expression))`,
//! or `Error: {exception}`. That alphabet spells a small language — decimal integer and float
//! literals, `+ - * / // **`, unary `+`/`-`, parentheses, and calls such as `2(3)` that fail at run
//! time — and kart tokenises, parses and evaluates it itself with Python's semantics: integer
//! arithmetic stays exact, `/` is correctly rounded true division, `//` floors, `**` binds tighter
//! than a unary minus on its left and associates to the right, floats print as Python's `repr`, and
//! the errors carry Python's messages (`division by zero`, `unmatched ')' (<string>, line 1)`, …).
//!
//! Work is bounded: at most [`MAX_EXPRESSION_CHARS`] characters, Python's limit of 200 nested
//! parentheses, and integers confined to 128 bits, so `9**9**9` is refused at once instead of
//! running for hours. Where kart departs from Python, it says so in the error:
//! - integers outside ±2**127 fail with [`CalculatorError::IntegerOverflow`] (Python has big ints);
//! - a negative number to a fractional power fails with [`CalculatorError::ComplexResult`] (Python
//!   returns a complex number);
//! - `()` and `...`, which Python evaluates to an empty tuple and `Ellipsis`, are syntax errors.

use kart_core::agent::tir::ToolOutcome;
use kart_core::reward::normalize::{is_python_space, python_strip};

/// The longest expression evaluated, in characters.
pub const MAX_EXPRESSION_CHARS: usize = 1000;

/// Python's limit on nested parentheses (the tokenizer's `MAXLEVEL`).
const MAX_NESTED_PARENS: usize = 200;

/// Python's message for a decimal literal such as `012`.
const LEADING_ZEROS: &str =
    "leading zeros in decimal integer literals are not permitted; use an 0o prefix for octal integers";

/// Why an expression has no value; the message is Python's `str(exception)` where Python fails too.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalculatorError {
    /// The expression is empty or white space.
    #[error("No expression provided")]
    Empty,
    /// A character outside upstream's alphabet: digits, `+ - * / ( ) .` and white space.
    #[error("Invalid expression")]
    InvalidCharacters,
    /// Longer than [`MAX_EXPRESSION_CHARS`].
    #[error("expression too long: {chars} characters, at most {MAX_EXPRESSION_CHARS}")]
    TooLong {
        /// The expression's length in characters.
        chars: usize,
    },
    /// Python's `SyntaxError`.
    #[error("{message} (<string>, line {line})")]
    Syntax {
        /// What is wrong, e.g. `invalid syntax` or `'(' was never closed`.
        message: String,
        /// The 1-based line Python reports.
        line: usize,
    },
    /// Python's `ZeroDivisionError`, e.g. `float division by zero`.
    #[error("{0}")]
    ZeroDivision(&'static str),
    /// A number called like a function, e.g. `2(3)`: Python's `TypeError`.
    #[error("'{0}' object is not callable")]
    NotCallable(&'static str),
    /// A float power out of range: Python's `OverflowError` from `errno` `ERANGE`.
    #[error("(34, 'Numerical result out of range')")]
    FloatOverflow,
    /// An integer literal or result outside ±2**127 (kart's limit, not Python's).
    #[error("integer overflow: the calculator's integers stay within ±2**127")]
    IntegerOverflow,
    /// A negative number to a fractional power (Python returns a complex number).
    #[error("complex results are not supported")]
    ComplexResult,
}

/// Evaluates `expression` as upstream's tool does and returns its outcome: the value, or the
/// error that upstream shows as `Error: {message}`.
pub fn calculate(expression: &str) -> ToolOutcome {
    match evaluate(expression) {
        Ok(value) => ToolOutcome::Calculator { value },
        Err(error) => ToolOutcome::Failed { message: error.to_string() },
    }
}

/// The value of `expression` as Python's `str(eval(expression))` prints it, e.g. `7`, `3.5`, `1e-05`.
pub fn evaluate(expression: &str) -> Result<String, CalculatorError> {
    let expression = python_strip(expression);
    if expression.is_empty() {
        return Err(CalculatorError::Empty);
    }
    if !expression.chars().all(|c| c.is_ascii_digit() || "+-*/().".contains(c) || is_python_space(c)) {
        return Err(CalculatorError::InvalidCharacters);
    }
    let chars = expression.chars().count();
    if chars > MAX_EXPRESSION_CHARS {
        return Err(CalculatorError::TooLong { chars });
    }
    let tokens = tokenize(expression)?;
    let ast = Parser::new(tokens).parse()?;
    Ok(eval(&ast)?.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind<'a> {
    Number(&'a str),
    Plus,
    Minus,
    Star,
    DoubleStar,
    Slash,
    DoubleSlash,
    LParen,
    RParen,
    /// A `.` that starts no number: never valid here.
    Dot,
    /// A line break outside parentheses.
    Newline,
    End,
}

#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    kind: Kind<'a>,
    line: usize,
    /// Parenthesis nesting after this token, as Python's tokenizer counts it.
    depth: usize,
}

/// The tokens and, when parentheses are left open at the end, the line of the innermost one.
struct Tokens<'a> {
    tokens: Vec<Token<'a>>,
    unclosed: Option<usize>,
}

fn syntax(message: impl Into<String>, line: usize) -> CalculatorError {
    CalculatorError::Syntax { message: message.into(), line }
}

/// Python's tokenizer on the calculator's alphabet, with its errors (raised whatever the parser
/// would have said, as CPython rescans the source for them).
fn tokenize(src: &str) -> Result<Tokens<'_>, CalculatorError> {
    let bytes = src.as_bytes();
    let mut tokens = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut line = 1;
    let mut chars = src.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let kind = match c {
            ' ' | '\t' | '\x0c' => continue,
            '\r' | '\n' => {
                if c == '\r' {
                    chars.next_if(|&(_, c)| c == '\n');
                }
                if open.is_empty() {
                    tokens.push(Token { kind: Kind::Newline, line, depth: 0 });
                }
                line += 1;
                continue;
            }
            '0'..='9' | '.' => {
                let digit_at = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_digit);
                if c == '.' && !digit_at(start + 1) {
                    Kind::Dot
                } else {
                    let mut end = start;
                    while digit_at(end) {
                        end += 1;
                    }
                    let is_float = bytes.get(end) == Some(&b'.');
                    if is_float {
                        end += 1;
                        while digit_at(end) {
                            end += 1;
                        }
                    }
                    let literal = &src[start..end];
                    if !is_float
                        && literal.len() > 1
                        && literal.starts_with('0')
                        && literal.contains(|c| c != '0')
                    {
                        return Err(syntax(LEADING_ZEROS, line));
                    }
                    while chars.next_if(|&(i, _)| i < end).is_some() {}
                    Kind::Number(literal)
                }
            }
            '+' => Kind::Plus,
            '-' => Kind::Minus,
            '*' if chars.next_if(|&(_, c)| c == '*').is_some() => Kind::DoubleStar,
            '*' => Kind::Star,
            '/' if chars.next_if(|&(_, c)| c == '/').is_some() => Kind::DoubleSlash,
            '/' => Kind::Slash,
            '(' => {
                if open.len() == MAX_NESTED_PARENS {
                    return Err(syntax("too many nested parentheses", line));
                }
                open.push(line);
                Kind::LParen
            }
            ')' => {
                if open.pop().is_none() {
                    return Err(syntax("unmatched ')'", line));
                }
                Kind::RParen
            }
            other => {
                return Err(syntax(
                    format!("invalid non-printable character U+{:04X}", u32::from(other)),
                    line,
                ));
            }
        };
        tokens.push(Token { kind, line, depth: open.len() });
    }
    tokens.push(Token { kind: Kind::End, line, depth: open.len() });
    Ok(Tokens { tokens, unclosed: open.last().copied() })
}

#[derive(Debug)]
enum Expr<'a> {
    Literal(&'a str),
    Neg(Box<Expr<'a>>),
    Pos(Box<Expr<'a>>),
    Binary(BinOp, Box<Expr<'a>>, Box<Expr<'a>>),
    Call(Box<Expr<'a>>, Option<Box<Expr<'a>>>),
}

#[derive(Debug, Clone, Copy)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Pow,
}

/// Why parsing stopped.
enum Stop {
    /// At this token, which fits nowhere.
    At(usize),
    /// A number right after a complete expression inside parentheses; the line of that expression.
    MissingComma(usize),
    /// Read past the end with parentheses open.
    NeverClosed,
}

/// A recursive-descent parser of Python's expression grammar on the calculator's tokens:
/// `sum: term (('+'|'-') term)*`, `term: factor (('*'|'/'|'//') factor)*`,
/// `factor: ('+'|'-') factor | power`, `power: primary ['**' factor]`,
/// `primary: atom ('(' [sum] ')')*`, `atom: NUMBER | '(' sum ')'`.
struct Parser<'a> {
    tokens: Vec<Token<'a>>,
    unclosed: Option<usize>,
    pos: usize,
    /// Parsing the expression after a stray number, where CPython's error rules are off.
    speculative: bool,
}

impl<'a> Parser<'a> {
    fn new(Tokens { tokens, unclosed }: Tokens<'a>) -> Self {
        Parser { tokens, unclosed, pos: 0, speculative: false }
    }

    /// The whole input, or the syntax error CPython reports: `'(' was never closed` when parsing
    /// reads past the end inside parentheses, the missing-comma hint, or `invalid syntax` at the
    /// failing token — unless a parenthesis still open at the end sits on an earlier line.
    fn parse(mut self) -> Result<Expr<'a>, CalculatorError> {
        let never_closed = |line| syntax("'(' was never closed", line);
        match self.input() {
            Ok(expr) => Ok(expr),
            Err(Stop::NeverClosed) => Err(never_closed(self.unclosed.unwrap_or(1))),
            Err(Stop::MissingComma(line)) => Err(syntax("invalid syntax. Perhaps you forgot a comma?", line)),
            Err(Stop::At(index)) => {
                let line = self.tokens[index].line;
                match self.unclosed {
                    Some(open) if open < line => Err(never_closed(open)),
                    _ => Err(syntax("invalid syntax", line)),
                }
            }
        }
    }

    /// The next token. With parentheses open, reading the end is an error, and so is reading a
    /// final `.` (CPython's tokenizer looks past it for `...`).
    fn peek(&self) -> Result<Kind<'a>, Stop> {
        match self.tokens[self.pos].kind {
            Kind::End if self.unclosed.is_some() => Err(Stop::NeverClosed),
            Kind::Dot if self.unclosed.is_some() && self.tokens[self.pos + 1].kind == Kind::End => {
                Err(Stop::NeverClosed)
            }
            kind => Ok(kind),
        }
    }

    /// Python's `eval` input: a sum, then line breaks, then the end.
    fn input(&mut self) -> Result<Expr<'a>, Stop> {
        let expr = self.sum()?;
        if let Kind::Number(_) = self.peek()? {
            return Err(self.stray_number(0));
        }
        while self.peek()? == Kind::Newline {
            self.pos += 1;
        }
        if self.peek()? == Kind::End { Ok(expr) } else { Err(Stop::At(self.pos)) }
    }

    /// The error for a number right after the complete expression that began at token `start`.
    /// CPython's error pass parses the number's expression too (which may run into the end inside
    /// parentheses), and inside parentheses suggests a missing comma.
    fn stray_number(&mut self, start: usize) -> Stop {
        let number = self.pos;
        self.speculative = true;
        let expression = self.sum();
        self.speculative = false;
        if let Err(Stop::NeverClosed) = expression {
            return Stop::NeverClosed;
        }
        if self.tokens[number].depth > 0 {
            Stop::MissingComma(self.tokens[start].line)
        } else {
            Stop::At(number)
        }
    }

    /// The `)` closing a group or call whose contents began at token `start`.
    fn close(&mut self, start: usize) -> Result<(), Stop> {
        match self.peek()? {
            Kind::RParen => {
                self.pos += 1;
                Ok(())
            }
            Kind::Number(_) if !self.speculative => Err(self.stray_number(start)),
            _ => Err(Stop::At(self.pos)),
        }
    }

    fn sum(&mut self) -> Result<Expr<'a>, Stop> {
        let mut left = self.term()?;
        loop {
            let op = match self.peek()? {
                Kind::Plus => BinOp::Add,
                Kind::Minus => BinOp::Sub,
                _ => return Ok(left),
            };
            self.pos += 1;
            left = Expr::Binary(op, Box::new(left), Box::new(self.term()?));
        }
    }

    fn term(&mut self) -> Result<Expr<'a>, Stop> {
        let mut left = self.factor()?;
        loop {
            let op = match self.peek()? {
                Kind::Star => BinOp::Mul,
                Kind::Slash => BinOp::Div,
                Kind::DoubleSlash => BinOp::FloorDiv,
                _ => return Ok(left),
            };
            self.pos += 1;
            left = Expr::Binary(op, Box::new(left), Box::new(self.factor()?));
        }
    }

    fn factor(&mut self) -> Result<Expr<'a>, Stop> {
        match self.peek()? {
            Kind::Plus => {
                self.pos += 1;
                Ok(Expr::Pos(Box::new(self.factor()?)))
            }
            Kind::Minus => {
                self.pos += 1;
                Ok(Expr::Neg(Box::new(self.factor()?)))
            }
            _ => self.power(),
        }
    }

    fn power(&mut self) -> Result<Expr<'a>, Stop> {
        let base = self.primary()?;
        if self.peek()? != Kind::DoubleStar {
            return Ok(base);
        }
        self.pos += 1;
        Ok(Expr::Binary(BinOp::Pow, Box::new(base), Box::new(self.factor()?)))
    }

    fn primary(&mut self) -> Result<Expr<'a>, Stop> {
        let mut expr = self.atom()?;
        while self.peek()? == Kind::LParen {
            self.pos += 1;
            let argument = if self.peek()? == Kind::RParen {
                self.pos += 1;
                None
            } else {
                let start = self.pos;
                let argument = self.sum()?;
                self.close(start)?;
                Some(Box::new(argument))
            };
            expr = Expr::Call(Box::new(expr), argument);
        }
        Ok(expr)
    }

    fn atom(&mut self) -> Result<Expr<'a>, Stop> {
        match self.peek()? {
            Kind::Number(literal) => {
                self.pos += 1;
                Ok(Expr::Literal(literal))
            }
            Kind::LParen => {
                self.pos += 1;
                let start = self.pos;
                let inner = self.sum()?;
                self.close(start)?;
                Ok(inner)
            }
            _ => Err(Stop::At(self.pos)),
        }
    }
}

/// A Python `int` (within 128 bits) or `float`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn type_name(self) -> &'static str {
        match self {
            Num::Int(_) => "int",
            Num::Float(_) => "float",
        }
    }

    /// Python's `float(x)`: an integer rounds to the nearest float, ties to even.
    fn to_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => f.write_str(&float_repr(x)),
        }
    }
}

fn eval(expr: &Expr<'_>) -> Result<Num, CalculatorError> {
    match expr {
        Expr::Literal(literal) if literal.contains('.') => {
            Ok(Num::Float(literal.parse().expect("the tokenizer yields valid float literals")))
        }
        Expr::Literal(literal) => literal.parse().map(Num::Int).map_err(|_| CalculatorError::IntegerOverflow),
        Expr::Pos(operand) => eval(operand),
        Expr::Neg(operand) => match eval(operand)? {
            Num::Int(i) => i.checked_neg().map(Num::Int).ok_or(CalculatorError::IntegerOverflow),
            Num::Float(x) => Ok(Num::Float(-x)),
        },
        Expr::Binary(op, left, right) => {
            let (left, right) = (eval(left)?, eval(right)?);
            match (left, right) {
                (Num::Int(a), Num::Int(b)) => int_op(*op, a, b),
                _ => float_op(*op, left.to_f64(), right.to_f64()),
            }
        }
        Expr::Call(callee, argument) => {
            let callee = eval(callee)?;
            if let Some(argument) = argument {
                eval(argument)?;
            }
            Err(CalculatorError::NotCallable(callee.type_name()))
        }
    }
}

fn int_op(op: BinOp, a: i128, b: i128) -> Result<Num, CalculatorError> {
    let overflow = CalculatorError::IntegerOverflow;
    match op {
        BinOp::Add => a.checked_add(b).map(Num::Int).ok_or(overflow),
        BinOp::Sub => a.checked_sub(b).map(Num::Int).ok_or(overflow),
        BinOp::Mul => a.checked_mul(b).map(Num::Int).ok_or(overflow),
        BinOp::Div if b == 0 => Err(CalculatorError::ZeroDivision("division by zero")),
        BinOp::Div => Ok(Num::Float(int_true_div(a, b))),
        BinOp::FloorDiv if b == 0 => Err(CalculatorError::ZeroDivision("integer division or modulo by zero")),
        BinOp::FloorDiv => {
            let quotient = a.checked_div(b).ok_or(overflow)?;
            let floor = quotient - i128::from(a % b != 0 && (a < 0) != (b < 0));
            Ok(Num::Int(floor))
        }
        // Python computes an integer to a negative power in floats.
        BinOp::Pow if b < 0 => float_pow(a as f64, b as f64).map(Num::Float),
        BinOp::Pow => match a {
            0 | 1 => Ok(Num::Int(if b == 0 { 1 } else { a })),
            -1 => Ok(Num::Int(if b % 2 == 0 { 1 } else { -1 })),
            _ => u32::try_from(b).ok().and_then(|b| a.checked_pow(b)).map(Num::Int).ok_or(overflow),
        },
    }
}

fn float_op(op: BinOp, a: f64, b: f64) -> Result<Num, CalculatorError> {
    let value = match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div if b == 0.0 => return Err(CalculatorError::ZeroDivision("float division by zero")),
        BinOp::Div => a / b,
        BinOp::FloorDiv if b == 0.0 => {
            return Err(CalculatorError::ZeroDivision("float floor division by zero"));
        }
        BinOp::FloorDiv => float_floor_div(a, b),
        BinOp::Pow => float_pow(a, b)?,
    };
    Ok(Num::Float(value))
}

/// `a / b` correctly rounded, as CPython divides integers: the quotient's leading 55 bits by long
/// division, a sticky bit for the rest, then one rounding to 53 bits (half to even).
fn int_true_div(a: i128, b: i128) -> f64 {
    let negative = (a < 0) != (b < 0);
    let (numerator, denominator) = (a.unsigned_abs(), b.unsigned_abs());
    if numerator == 0 {
        return if b < 0 { -0.0 } else { 0.0 };
    }
    let mut quotient = numerator / denominator;
    let mut remainder = numerator % denominator;
    let mut exponent = 0i32;
    while quotient < 1 << 54 {
        // remainder < denominator <= 2**127, so doubling it cannot overflow.
        remainder <<= 1;
        quotient <<= 1;
        if remainder >= denominator {
            remainder -= denominator;
            quotient |= 1;
        }
        exponent -= 1;
    }
    let extra = 128 - quotient.leading_zeros() - 53;
    let mut mantissa = quotient >> extra;
    let dropped = quotient & ((1 << extra) - 1);
    let half = 1 << (extra - 1);
    if dropped > half || (dropped == half && (remainder != 0 || mantissa & 1 == 1)) {
        mantissa += 1;
    }
    let magnitude = mantissa as f64 * 2f64.powi(exponent + extra as i32);
    if negative { -magnitude } else { magnitude }
}

/// CPython's `float.__floordiv__` (through `_float_div_mod`), for a non-zero `b`.
fn float_floor_div(a: f64, b: f64) -> f64 {
    let modulo = a % b;
    let mut div = (a - modulo) / b;
    if modulo != 0.0 && (b < 0.0) != (modulo < 0.0) {
        div -= 1.0;
    }
    if div == 0.0 {
        return 0f64.copysign(a / b);
    }
    let floor = div.floor();
    if div - floor > 0.5 { floor + 1.0 } else { floor }
}

/// CPython's `float.__pow__`: its special cases, then C's `pow` with overflow reported as an
/// error and underflow as zero.
fn float_pow(base: f64, exponent: f64) -> Result<f64, CalculatorError> {
    let is_odd_integer = |x: f64| (x.abs() % 2.0) == 1.0;
    if exponent == 0.0 {
        return Ok(1.0);
    }
    if base.is_nan() {
        return Ok(base);
    }
    if exponent.is_nan() {
        return Ok(if base == 1.0 { 1.0 } else { exponent });
    }
    if exponent.is_infinite() {
        let base = base.abs();
        return Ok(if base == 1.0 {
            1.0
        } else if (exponent > 0.0) == (base > 1.0) {
            exponent.abs()
        } else {
            0.0
        });
    }
    if base.is_infinite() {
        let odd = is_odd_integer(exponent);
        return Ok(match (exponent > 0.0, odd) {
            (true, true) => base,
            (true, false) => base.abs(),
            (false, true) => 0f64.copysign(base),
            (false, false) => 0.0,
        });
    }
    if base == 0.0 {
        if exponent < 0.0 {
            return Err(CalculatorError::ZeroDivision("0.0 cannot be raised to a negative power"));
        }
        return Ok(if is_odd_integer(exponent) { base } else { 0.0 });
    }
    let negate = base < 0.0 && is_odd_integer(exponent);
    if base < 0.0 && exponent != exponent.floor() {
        return Err(CalculatorError::ComplexResult);
    }
    let base = base.abs();
    if base == 1.0 {
        return Ok(if negate { -1.0 } else { 1.0 });
    }
    let value = base.powf(exponent);
    if value.is_infinite() {
        return Err(CalculatorError::FloatOverflow);
    }
    Ok(if negate { -value } else { value })
}

/// Python's `repr` of a float: the shortest digits that round-trip, positional for decimal
/// exponents from -4 to 15 (with `.0` when integral), else scientific with a signed exponent of at
/// least two digits.
fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let shortest = format!("{:e}", x.abs());
    let significant =
        shortest.find('e').expect("`{:e}` writes an exponent") - usize::from(shortest.contains('.'));
    // Python (C's dtoa) takes, among the shortest strings that read back as `x`, the nearest, ties
    // to even: exact formatting to that many digits, when it reads back. Rust breaks ties upwards.
    let nearest = format!("{:.*e}", significant - 1, x.abs());
    let scientific = if nearest.parse() == Ok(x.abs()) { nearest } else { shortest };
    let (mantissa, exponent) = scientific.split_once('e').expect("`{:e}` writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
    let digits = mantissa.replace('.', "");
    let digits = match digits.trim_end_matches('0') {
        "" => "0",
        trimmed => trimmed,
    };
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if !(-4..16).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{first}{fraction}e{exponent_sign}{:02}", exponent.abs());
    }
    // The decimal point goes after `point` digits.
    let point = exponent + 1;
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else {
        let point = point as usize;
        if point >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point - digits.len()))
        } else {
            format!("{}.{}", &digits[..point], &digits[point..])
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(expression: &str) -> String {
        evaluate(expression).unwrap_or_else(|e| panic!("{expression:?}: {e}"))
    }

    fn error(expression: &str) -> String {
        match evaluate(expression) {
            Ok(v) => panic!("{expression:?} evaluated to {v}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn precedence_and_associativity() {
        assert_eq!(value("1 + 2 * 3"), "7");
        assert_eq!(value("(1 + 2) * 3"), "9");
        assert_eq!(value("10 - 4 - 3"), "3");
        assert_eq!(value("2 ** 3 ** 2"), "512");
        assert_eq!(value("-2 ** 2"), "-4");
        assert_eq!(value("2 ** -1"), "0.5");
        assert_eq!(value("-2 ** -2"), "-0.25");
        assert_eq!(value("2 ** 0.5 ** 2"), "1.189207115002721");
        assert_eq!(value("--2"), "2");
        assert_eq!(value("1 +-+- 1"), "2");
        assert_eq!(value("8 / 2 / 2"), "2.0");
        assert_eq!(value("2 * 3 // 4"), "1");
        assert_eq!(value("(1\n+ 2)"), "3");
        assert_eq!(value("1 \x0c+\t2"), "3");
    }

    #[test]
    fn python_number_semantics() {
        assert_eq!(value("7 // 2"), "3");
        assert_eq!(value("-7 // 2"), "-4");
        assert_eq!(value("7 // -2"), "-4");
        assert_eq!(value("7.5 // 2"), "3.0");
        assert_eq!(value("-7.5 // 2"), "-4.0");
        assert_eq!(value("-0.0 // 1"), "-0.0");
        assert_eq!(value("1.5 // 0.5"), "3.0");
        assert_eq!(value("4 / 2"), "2.0");
        assert_eq!(value("1 / 3"), "0.3333333333333333");
        assert_eq!(value("10 / 3"), "3.3333333333333335");
        assert_eq!(value("0.1 + 0.2"), "0.30000000000000004");
        assert_eq!(value("1 / 3 * 3"), "1.0");
        assert_eq!(value("123456789 * 987654321"), "121932631112635269");
        assert_eq!(value("2 ** 64"), "18446744073709551616");
        assert_eq!(value("(-1) ** (2 ** 100)"), "1");
        assert_eq!(value("5 ** -0"), "1");
        assert_eq!(value("0 ** 0.0"), "1.0");
        assert_eq!(value("(-2) ** 2.0"), "4.0");
        assert_eq!(value("(-2.0) ** 3"), "-8.0");
        assert_eq!(value("30.5 ** 7"), "24552678406.414062");
        assert_eq!(value("(-3) ** -3"), "-0.037037037037037035");
        assert_eq!(value("2 ** -1080"), "0.0");
        assert_eq!(value("00"), "0");
        assert_eq!(value("012.5"), "12.5");
        assert_eq!(value("1."), "1.0");
        assert_eq!(value(".5"), "0.5");
    }

    #[test]
    fn correctly_rounded_integer_division() {
        assert_eq!(value("(2 ** 53 + 1) / 1"), "9007199254740992.0");
        assert_eq!(value("(10 ** 20) / 3"), "3.333333333333333e+19");
        assert_eq!(value("123456789012345678901234567890 / 7"), "1.763668414462081e+28");
        assert_eq!(value("1 / 7"), "0.14285714285714285");
        assert_eq!(value("100 / 7"), "14.285714285714286");
        assert_eq!(value("-1 / 4"), "-0.25");
        assert_eq!(value("0 / 3"), "0.0");
        assert_eq!(value("0 / -3"), "-0.0");
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (x, repr) in [
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1e22, "1e+22"),
            (1.1805916207174113e21, "1.1805916207174113e+21"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (5e-324, "5e-324"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (-2.5, "-2.5"),
            (123.456, "123.456"),
            (30.5f64.powi(7), "24552678406.414062"),
            (0.5f64.powi(77), "6.617444900424222e-24"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
        ] {
            assert_eq!(float_repr(x), repr);
        }
        assert_eq!(value("(10.0 ** 300) * (10.0 ** 300)"), "inf");
        assert_eq!(value("(10.0 ** 300) * (10.0 ** 300) - (10.0 ** 300) * (10.0 ** 300)"), "nan");
    }

    #[test]
    fn runtime_errors_carry_python_messages() {
        assert_eq!(error("1 / 0"), "division by zero");
        assert_eq!(error("1 // 0"), "integer division or modulo by zero");
        assert_eq!(error("1.0 / 0"), "float division by zero");
        assert_eq!(error("1 / 0.0"), "float division by zero");
        assert_eq!(error("1.0 // 0"), "float floor division by zero");
        assert_eq!(error("0 ** -1"), "0.0 cannot be raised to a negative power");
        assert_eq!(error("(1 - 1) ** -2.5"), "0.0 cannot be raised to a negative power");
        assert_eq!(error("2.0 ** 10000"), "(34, 'Numerical result out of range')");
        assert_eq!(error("2(3)"), "'int' object is not callable");
        assert_eq!(error("2.5(3)"), "'float' object is not callable");
        assert_eq!(error("2()"), "'int' object is not callable");
        // Python evaluates the callee and its argument before failing on the call.
        assert_eq!(error("(1 / 0)(2)"), "division by zero");
        assert_eq!(error("2(1 / 0)"), "division by zero");
        assert_eq!(calculate("1/0"), ToolOutcome::Failed { message: "division by zero".into() });
        assert_eq!(calculate(" 1 + 2 * 3 "), ToolOutcome::Calculator { value: "7".into() });
    }

    #[test]
    fn syntax_errors_carry_python_messages_and_lines() {
        let cases = [
            ("1 +", "invalid syntax (<string>, line 1)"),
            ("*2", "invalid syntax (<string>, line 1)"),
            ("2 *** 3", "invalid syntax (<string>, line 1)"),
            ("2 * * 3", "invalid syntax (<string>, line 1)"),
            ("1 2", "invalid syntax (<string>, line 1)"),
            ("0.5.3", "invalid syntax (<string>, line 1)"),
            ("1 .5", "invalid syntax (<string>, line 1)"),
            ("(1) 2", "invalid syntax (<string>, line 1)"),
            ("1\n+2", "invalid syntax (<string>, line 2)"),
            ("1 \r\n+2", "invalid syntax (<string>, line 2)"),
            ("1\n\n2", "invalid syntax (<string>, line 3)"),
            ("1+\n2", "invalid syntax (<string>, line 1)"),
            ("(1 +)", "invalid syntax (<string>, line 1)"),
            ("()", "invalid syntax (<string>, line 1)"),
            ("...", "invalid syntax (<string>, line 1)"),
            ("(1", "'(' was never closed (<string>, line 1)"),
            ("1 + (2 3", "'(' was never closed (<string>, line 1)"),
            ("1 2 (", "'(' was never closed (<string>, line 1)"),
            ("(1 2 +", "'(' was never closed (<string>, line 1)"),
            ("(\n1 2 (", "'(' was never closed (<string>, line 2)"),
            ("((1 +\n) 2", "'(' was never closed (<string>, line 1)"),
            ("(1 +) (", "invalid syntax (<string>, line 1)"),
            ("1\n2 (", "invalid syntax (<string>, line 2)"),
            ("1 +\n(\n2", "invalid syntax (<string>, line 1)"),
            ("(1 2)", "invalid syntax. Perhaps you forgot a comma? (<string>, line 1)"),
            ("(1 + 2 3)", "invalid syntax. Perhaps you forgot a comma? (<string>, line 1)"),
            ("(\n1\n2\n)", "invalid syntax. Perhaps you forgot a comma? (<string>, line 2)"),
            ("(\n(1 2)", "invalid syntax. Perhaps you forgot a comma? (<string>, line 2)"),
            ("2(3 4)", "invalid syntax. Perhaps you forgot a comma? (<string>, line 1)"),
            ("(1 2)(", "invalid syntax. Perhaps you forgot a comma? (<string>, line 1)"),
            ("1 (2) 3", "invalid syntax (<string>, line 1)"),
            ("(1.1.", "'(' was never closed (<string>, line 1)"),
            ("(1 2.", "'(' was never closed (<string>, line 1)"),
            ("72 2.5(2.5 .5**3", "invalid syntax (<string>, line 1)"),
            ("1)", "unmatched ')' (<string>, line 1)"),
            ("3 4)", "unmatched ')' (<string>, line 1)"),
            ("1\n+2)", "unmatched ')' (<string>, line 2)"),
            ("012", &format!("{LEADING_ZEROS} (<string>, line 1)")),
            ("2 3 012", &format!("{LEADING_ZEROS} (<string>, line 1)")),
            ("1\u{a0}+2", "invalid non-printable character U+00A0 (<string>, line 1)"),
            ("(1\n\x0b)", "invalid non-printable character U+000B (<string>, line 2)"),
        ];
        for (expression, message) in cases {
            assert_eq!(error(expression), message, "{expression:?}");
        }
        let nested = |n: usize| format!("{}1{}", "(".repeat(n), ")".repeat(n));
        assert_eq!(value(&nested(200)), "1");
        assert_eq!(error(&nested(201)), "too many nested parentheses (<string>, line 1)");
    }

    #[test]
    fn upstream_input_checks() {
        assert_eq!(evaluate("  \n"), Err(CalculatorError::Empty));
        assert_eq!(evaluate("2^3"), Err(CalculatorError::InvalidCharacters));
        assert_eq!(evaluate("sqrt(4)"), Err(CalculatorError::InvalidCharacters));
        assert_eq!(evaluate("1e5"), Err(CalculatorError::InvalidCharacters));
        assert_eq!(evaluate("7 % 2"), Err(CalculatorError::InvalidCharacters));
        assert_eq!(evaluate("__import__('os')"), Err(CalculatorError::InvalidCharacters));
    }

    #[test]
    fn work_is_bounded() {
        assert_eq!(evaluate("9 ** 9 ** 9"), Err(CalculatorError::IntegerOverflow));
        assert_eq!(evaluate("2 ** 127"), Err(CalculatorError::IntegerOverflow));
        assert_eq!(evaluate("2 ** 126 * 2"), Err(CalculatorError::IntegerOverflow));
        assert_eq!(value("2 ** 126 - 1 + 2 ** 126"), i128::MAX.to_string());
        assert_eq!(evaluate(&"9".repeat(40)), Err(CalculatorError::IntegerOverflow));
        assert_eq!(evaluate("(-8) ** (1 / 3)"), Err(CalculatorError::ComplexResult));
        let long = "1+".repeat(500) + "1";
        assert_eq!(evaluate(&long), Err(CalculatorError::TooLong { chars: 1001 }));
        assert_eq!(value(&("-".repeat(999) + "1")), "-1");
        assert_eq!(value(&("1 ** ".repeat(199) + "1")), "1");
    }
}
