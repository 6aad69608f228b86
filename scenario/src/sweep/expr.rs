//! The sweep's expression language, for `[derived]` values and `[[filter]]` conditions
//! (docs/sweep.md has the grammar):
//!
//! - numbers (`8`, `0.5`, `1e9`), strings in single or double quotes, `true`, `false`;
//! - names: a dotted scenario key (`cluster.gpus-per-node`), its last part alone when that is
//!   unambiguous (`tensor`), or `gpus` (`cluster.nodes * cluster.gpus-per-node`). A `-` is part
//!   of a name when a letter follows it (`gpus-per-node`); write `a - b` to subtract;
//! - `+ - * / %` on numbers, unary `-`; comparisons `< <= > >= == !=` (`==` and `!=` also on
//!   strings and booleans); `not`, `and`, `or`; parentheses.
//!
//! Integers stay integers: `+ - * %` of integers are integers (an overflow is an error), and
//! `/` of integers is an integer when the division is exact. Where integers must stay exact
//! (derived values) an inexact division is an error; elsewhere (filters) it gives a decimal.

use std::fmt;

/// An expression could not be parsed or evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("\"{expression}\", column {column}: {message}")]
pub struct ExpressionError {
    /// The expression's text.
    pub expression: String,
    /// 1-based column of the token at fault.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// A value an expression computes or reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An integer.
    Integer(i64),
    /// A decimal number.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Text(String),
}

impl Value {
    /// The value of a TOML scalar; `None` for arrays, tables and dates.
    pub fn from_toml(value: &toml::Value) -> Option<Value> {
        match value {
            toml::Value::Integer(n) => Some(Value::Integer(*n)),
            toml::Value::Float(x) => Some(Value::Float(*x)),
            toml::Value::Boolean(b) => Some(Value::Bool(*b)),
            toml::Value::String(s) => Some(Value::Text(s.clone())),
            _ => None,
        }
    }

    /// The value as TOML.
    pub fn to_toml(&self) -> toml::Value {
        match self {
            Value::Integer(n) => toml::Value::Integer(*n),
            Value::Float(x) => toml::Value::Float(*x),
            Value::Bool(b) => toml::Value::Boolean(*b),
            Value::Text(s) => toml::Value::String(s.clone()),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Value::Integer(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Bool(_) => "a boolean",
            Value::Text(_) => "a string",
        }
    }

    fn number(&self) -> Option<f64> {
        match self {
            Value::Integer(n) => Some(*n as f64),
            Value::Float(x) => Some(*x),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Integer(n) => write!(f, "{n}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Text(s) => write!(f, "{s:?}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    Add,
    Subtract,
    Multiply,
    Divide,
    Remainder,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Equal,
    NotEqual,
    And,
    Or,
}

impl Operator {
    fn symbol(self) -> &'static str {
        match self {
            Operator::Add => "+",
            Operator::Subtract => "-",
            Operator::Multiply => "*",
            Operator::Divide => "/",
            Operator::Remainder => "%",
            Operator::Less => "<",
            Operator::LessEqual => "<=",
            Operator::Greater => ">",
            Operator::GreaterEqual => ">=",
            Operator::Equal => "==",
            Operator::NotEqual => "!=",
            Operator::And => "and",
            Operator::Or => "or",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Literal(Value),
    /// A name as written, and the scenario key it stands for once resolved.
    Name {
        written: String,
        key: String,
        column: usize,
    },
    Negate {
        operand: Box<Node>,
        column: usize,
    },
    Not {
        operand: Box<Node>,
        column: usize,
    },
    Binary {
        operator: Operator,
        left: Box<Node>,
        right: Box<Node>,
        column: usize,
    },
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Expression {
    text: String,
    root: Node,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(Value),
    Text(String),
    Name(String),
    Symbol(&'static str),
    End,
}

fn tokenize(text: &str) -> Result<Vec<(Token, usize)>, (usize, String)> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let is_name_start = |c: char| c.is_ascii_alphabetic() || c == '_';
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.' || chars[i] == '_') {
                i += 1;
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let written: String = chars[start..i].iter().filter(|c| **c != '_').collect();
            let value = if written.contains(['.', 'e', 'E']) {
                written.parse::<f64>().ok().filter(|x| x.is_finite()).map(Value::Float)
            } else {
                written.parse::<i64>().ok().map(Value::Integer)
            };
            let value = value.ok_or_else(|| (column, format!("{written:?} is not a number")))?;
            tokens.push((Token::Number(value), column));
        } else if c == '"' || c == '\'' {
            let end = chars[i + 1..]
                .iter()
                .position(|d| *d == c)
                .ok_or_else(|| (column, "the string is not closed".to_string()))?;
            tokens.push((Token::Text(chars[i + 1..i + 1 + end].iter().collect()), column));
            i += end + 2;
        } else if is_name_start(c) {
            let start = i;
            while i < chars.len() {
                let hyphen = chars[i] == '-' && chars.get(i + 1).is_some_and(|d| d.is_ascii_alphabetic());
                if is_name_char(chars[i]) || hyphen {
                    i += 1;
                } else {
                    break;
                }
            }
            let name: String = chars[start..i].iter().collect();
            tokens.push((Token::Name(name), column));
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let symbol = ["<=", ">=", "==", "!="].into_iter().find(|s| *s == two).or_else(|| {
                ["+", "-", "*", "/", "%", "<", ">", "(", ")"].into_iter().find(|s| s.starts_with(c))
            });
            let Some(symbol) = symbol else {
                let hint = match c {
                    '=' => ": compare with ==",
                    '&' | '|' | '!' => ": write and, or, not",
                    _ => "",
                };
                return Err((column, format!("unexpected {c:?}{hint}")));
            };
            tokens.push((Token::Symbol(symbol), column));
            i += symbol.len();
        }
    }
    tokens.push((Token::End, chars.len() + 1));
    Ok(tokens)
}

struct Parser {
    tokens: Vec<(Token, usize)>,
    next: usize,
    /// Parentheses, `not` and `-` open around the current position: parsing, evaluating and
    /// dropping a tree recurse once per level, so the nesting is bounded ([`MAX_NESTING`]).
    depth: usize,
}

/// The deepest nesting of parentheses, `not` and unary `-` an expression may have; deeper is
/// refused rather than overflow the stack (issue 38: 10,000 parentheses aborted the sweep).
const MAX_NESTING: usize = 64;
/// The longest expression, in bytes: a chain of operators nests one level per operator.
const MAX_LENGTH: usize = 4096;

impl Parser {
    /// Enters one level of nesting, or says the expression nests too deep.
    fn enter(&mut self, column: usize) -> Result<(), (usize, String)> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err((
                column,
                format!("nests deeper than {MAX_NESTING} levels of parentheses, `not` and `-`"),
            ));
        }
        Ok(())
    }

    fn peek(&self) -> &Token {
        &self.tokens[self.next.min(self.tokens.len() - 1)].0
    }

    fn column(&self) -> usize {
        self.tokens[self.next.min(self.tokens.len() - 1)].1
    }

    fn advance(&mut self) -> (Token, usize) {
        let token = self.tokens[self.next.min(self.tokens.len() - 1)].clone();
        self.next += 1;
        token
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Token::Name(name) if name == word)
    }

    fn or(&mut self) -> Result<Node, (usize, String)> {
        let mut left = self.and()?;
        while self.is_word("or") {
            let (_, column) = self.advance();
            let right = self.and()?;
            left =
                Node::Binary { operator: Operator::Or, left: Box::new(left), right: Box::new(right), column };
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Node, (usize, String)> {
        let mut left = self.not()?;
        while self.is_word("and") {
            let (_, column) = self.advance();
            let right = self.not()?;
            left = Node::Binary {
                operator: Operator::And,
                left: Box::new(left),
                right: Box::new(right),
                column,
            };
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Node, (usize, String)> {
        if self.is_word("not") {
            let (_, column) = self.advance();
            self.enter(column)?;
            let operand = self.not()?;
            self.depth -= 1;
            return Ok(Node::Not { operand: Box::new(operand), column });
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Node, (usize, String)> {
        let left = self.sum()?;
        let operator = match self.peek() {
            Token::Symbol("<") => Operator::Less,
            Token::Symbol("<=") => Operator::LessEqual,
            Token::Symbol(">") => Operator::Greater,
            Token::Symbol(">=") => Operator::GreaterEqual,
            Token::Symbol("==") => Operator::Equal,
            Token::Symbol("!=") => Operator::NotEqual,
            _ => return Ok(left),
        };
        let (_, column) = self.advance();
        let right = self.sum()?;
        if matches!(self.peek(), Token::Symbol("<" | "<=" | ">" | ">=" | "==" | "!=")) {
            return Err((self.column(), "comparisons do not chain: join them with `and`".into()));
        }
        Ok(Node::Binary { operator, left: Box::new(left), right: Box::new(right), column })
    }

    fn sum(&mut self) -> Result<Node, (usize, String)> {
        let mut left = self.product()?;
        loop {
            let operator = match self.peek() {
                Token::Symbol("+") => Operator::Add,
                Token::Symbol("-") => Operator::Subtract,
                _ => return Ok(left),
            };
            let (_, column) = self.advance();
            let right = self.product()?;
            left = Node::Binary { operator, left: Box::new(left), right: Box::new(right), column };
        }
    }

    fn product(&mut self) -> Result<Node, (usize, String)> {
        let mut left = self.unary()?;
        loop {
            let operator = match self.peek() {
                Token::Symbol("*") => Operator::Multiply,
                Token::Symbol("/") => Operator::Divide,
                Token::Symbol("%") => Operator::Remainder,
                _ => return Ok(left),
            };
            let (_, column) = self.advance();
            let right = self.unary()?;
            left = Node::Binary { operator, left: Box::new(left), right: Box::new(right), column };
        }
    }

    fn unary(&mut self) -> Result<Node, (usize, String)> {
        if self.peek() == &Token::Symbol("-") {
            let (_, column) = self.advance();
            self.enter(column)?;
            let operand = self.unary()?;
            self.depth -= 1;
            return Ok(Node::Negate { operand: Box::new(operand), column });
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Node, (usize, String)> {
        let (token, column) = self.advance();
        match token {
            Token::Number(value) => Ok(Node::Literal(value)),
            Token::Text(text) => Ok(Node::Literal(Value::Text(text))),
            Token::Name(name) if name == "true" || name == "false" => {
                Ok(Node::Literal(Value::Bool(name == "true")))
            }
            Token::Name(name) if ["and", "or", "not"].contains(&name.as_str()) => {
                Err((column, format!("expected a value, found `{name}`")))
            }
            Token::Name(name) => Ok(Node::Name { key: name.clone(), written: name, column }),
            Token::Symbol("(") => {
                self.enter(column)?;
                let inner = self.or()?;
                self.depth -= 1;
                match self.advance() {
                    (Token::Symbol(")"), _) => Ok(inner),
                    (_, column) => Err((column, "expected `)`".into())),
                }
            }
            Token::Symbol(symbol) => Err((column, format!("expected a value, found `{symbol}`"))),
            Token::End => Err((column, "the expression ends where a value is expected".into())),
        }
    }
}

impl Expression {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Expression, ExpressionError> {
        let error = |(column, message): (usize, String)| ExpressionError {
            expression: text.to_string(),
            column,
            message,
        };
        if text.len() > MAX_LENGTH {
            return Err(error((MAX_LENGTH, format!("is {} bytes long; at most {MAX_LENGTH}", text.len()))));
        }
        let tokens = tokenize(text).map_err(error)?;
        let mut parser = Parser { tokens, next: 0, depth: 0 };
        let root = parser.or().map_err(error)?;
        if parser.peek() != &Token::End {
            let found = match parser.peek() {
                Token::Name(name) => format!("`{name}`"),
                Token::Symbol(symbol) => format!("`{symbol}`"),
                _ => "more".to_string(),
            };
            return Err(error((parser.column(), format!("expected an operator or the end, found {found}"))));
        }
        Ok(Expression { text: text.to_string(), root })
    }

    /// Whether the expression can give true or false: a comparison, `and`, `or`, `not`, a
    /// boolean literal or a name (a key may hold a boolean); not a number, a string, a negation
    /// or arithmetic, which give a number or a string whatever the keys hold.
    pub fn may_be_boolean(&self) -> bool {
        match &self.root {
            Node::Literal(value) => matches!(value, Value::Bool(_)),
            Node::Name { .. } | Node::Not { .. } => true,
            Node::Negate { .. } => false,
            Node::Binary { operator, .. } => !matches!(
                operator,
                Operator::Add
                    | Operator::Subtract
                    | Operator::Multiply
                    | Operator::Divide
                    | Operator::Remainder
            ),
        }
    }

    /// The expression as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Every name with its column, in the order written.
    pub fn names(&self) -> Vec<(&str, usize)> {
        let mut out = Vec::new();
        visit(&self.root, &mut |node| {
            if let Node::Name { written, column, .. } = node {
                out.push((written.as_str(), *column));
            }
        });
        out
    }

    /// The scenario keys the names stand for (after [`Expression::resolve`]).
    pub fn keys(&self) -> Vec<&str> {
        let mut out = Vec::new();
        visit(&self.root, &mut |node| {
            if let Node::Name { key, .. } = node {
                out.push(key.as_str());
            }
        });
        out
    }

    /// Replaces each name by the key `resolve` gives it; its error becomes an error at the
    /// name's column.
    pub fn resolve(
        &mut self,
        resolve: &dyn Fn(&str) -> Result<String, String>,
    ) -> Result<(), ExpressionError> {
        let text = self.text.clone();
        let mut failure = None;
        visit_mut(&mut self.root, &mut |node| {
            if let Node::Name { written, key, column } = node
                && failure.is_none()
            {
                match resolve(written) {
                    Ok(resolved) => *key = resolved,
                    Err(message) => {
                        failure = Some(ExpressionError { expression: text.clone(), column: *column, message })
                    }
                }
            }
        });
        failure.map_or(Ok(()), Err)
    }

    /// Evaluates the expression, reading keys with `lookup`. With `exact`, dividing integers
    /// must give an integer.
    pub fn evaluate(
        &self,
        lookup: &dyn Fn(&str) -> Result<Value, String>,
        exact: bool,
    ) -> Result<Value, ExpressionError> {
        evaluate(&self.root, lookup, exact).map_err(|(column, message)| ExpressionError {
            expression: self.text.clone(),
            column,
            message,
        })
    }
}

fn visit<'a>(node: &'a Node, f: &mut dyn FnMut(&'a Node)) {
    f(node);
    match node {
        Node::Negate { operand, .. } | Node::Not { operand, .. } => visit(operand, f),
        Node::Binary { left, right, .. } => {
            visit(left, f);
            visit(right, f);
        }
        Node::Literal(_) | Node::Name { .. } => {}
    }
}

fn visit_mut(node: &mut Node, f: &mut dyn FnMut(&mut Node)) {
    f(node);
    match node {
        Node::Negate { operand, .. } | Node::Not { operand, .. } => visit_mut(operand, f),
        Node::Binary { left, right, .. } => {
            visit_mut(left, f);
            visit_mut(right, f);
        }
        Node::Literal(_) | Node::Name { .. } => {}
    }
}

fn evaluate(
    node: &Node,
    lookup: &dyn Fn(&str) -> Result<Value, String>,
    exact: bool,
) -> Result<Value, (usize, String)> {
    match node {
        Node::Literal(value) => Ok(value.clone()),
        Node::Name { written, key, column } => lookup(key).map_err(|message| {
            let name = if written == key { format!("`{key}`") } else { format!("`{written}` ({key})") };
            (*column, format!("{name} {message}"))
        }),
        Node::Negate { operand, column } => match evaluate(operand, lookup, exact)? {
            Value::Integer(n) => n.checked_neg().map(Value::Integer).ok_or((*column, "overflow".into())),
            Value::Float(x) => Ok(Value::Float(-x)),
            other => Err((*column, format!("cannot negate {} ({other})", other.kind()))),
        },
        Node::Not { operand, column } => match evaluate(operand, lookup, exact)? {
            Value::Bool(b) => Ok(Value::Bool(!b)),
            other => Err((*column, format!("`not` needs a boolean, not {} ({other})", other.kind()))),
        },
        Node::Binary { operator: operator @ (Operator::And | Operator::Or), left, right, column } => {
            let as_bool = |value: Value| match value {
                Value::Bool(b) => Ok(b),
                other => Err((
                    *column,
                    format!("`{}` needs booleans, not {} ({other})", operator.symbol(), other.kind()),
                )),
            };
            let left = as_bool(evaluate(left, lookup, exact)?)?;
            // Short-circuit, so `a != 0 and b / a > 2` never divides by zero.
            match (operator, left) {
                (Operator::And, false) => Ok(Value::Bool(false)),
                (Operator::Or, true) => Ok(Value::Bool(true)),
                _ => Ok(Value::Bool(as_bool(evaluate(right, lookup, exact)?)?)),
            }
        }
        Node::Binary { operator, left, right, column } => {
            let left = evaluate(left, lookup, exact)?;
            let right = evaluate(right, lookup, exact)?;
            binary(*operator, left, right, exact).map_err(|message| (*column, message))
        }
    }
}

fn binary(operator: Operator, left: Value, right: Value, exact: bool) -> Result<Value, String> {
    use Operator::*;
    let symbol = operator.symbol();
    match (operator, &left, &right) {
        (Equal | NotEqual, Value::Text(a), Value::Text(b)) => {
            Ok(Value::Bool((a == b) == (operator == Equal)))
        }
        (Equal | NotEqual, Value::Bool(a), Value::Bool(b)) => {
            Ok(Value::Bool((a == b) == (operator == Equal)))
        }
        (Add | Subtract | Multiply | Divide | Remainder, Value::Integer(a), Value::Integer(b)) => {
            let (a, b) = (*a, *b);
            let overflow = || format!("{a} {symbol} {b} overflows");
            match operator {
                Add => a.checked_add(b).map(Value::Integer).ok_or_else(overflow),
                Subtract => a.checked_sub(b).map(Value::Integer).ok_or_else(overflow),
                Multiply => a.checked_mul(b).map(Value::Integer).ok_or_else(overflow),
                Divide | Remainder if b == 0 => Err(format!("{a} {symbol} 0: division by zero")),
                Remainder => Ok(Value::Integer(a % b)),
                _ if a % b == 0 => a.checked_div(b).map(Value::Integer).ok_or_else(overflow),
                _ if exact => Err(format!(
                    "{a} / {b} = {} is not an integer (a derived value divides integers exactly)",
                    a as f64 / b as f64
                )),
                _ => Ok(Value::Float(a as f64 / b as f64)),
            }
        }
        _ => {
            let (Some(a), Some(b)) = (left.number(), right.number()) else {
                return Err(format!(
                    "`{symbol}` cannot take {} ({left}) and {} ({right})",
                    left.kind(),
                    right.kind()
                ));
            };
            let number = |x: f64| {
                if x.is_finite() {
                    Ok(Value::Float(x))
                } else {
                    Err(format!("{left} {symbol} {right} is not a finite number"))
                }
            };
            match operator {
                Add => number(a + b),
                Subtract => number(a - b),
                Multiply => number(a * b),
                Divide => number(a / b),
                Remainder => number(a % b),
                Less => Ok(Value::Bool(a < b)),
                LessEqual => Ok(Value::Bool(a <= b)),
                Greater => Ok(Value::Bool(a > b)),
                GreaterEqual => Ok(Value::Bool(a >= b)),
                Equal => Ok(Value::Bool(a == b)),
                NotEqual => Ok(Value::Bool(a != b)),
                And | Or => Err(format!("`{symbol}` needs booleans")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, exact: bool) -> Result<Value, ExpressionError> {
        let lookup = |key: &str| match key {
            "cluster.nodes" => Ok(Value::Integer(8)),
            "cluster.gpus-per-node" => Ok(Value::Integer(8)),
            "tensor" => Ok(Value::Integer(2)),
            "pipeline" => Ok(Value::Integer(3)),
            "fidelity" => Ok(Value::Text("flow".into())),
            _ => Err("is unknown".to_string()),
        };
        Expression::parse(text)?.evaluate(&lookup, exact)
    }

    #[test]
    fn arithmetic_keeps_integers_and_precedence() {
        assert_eq!(run("cluster.nodes * cluster.gpus-per-node / (tensor * 4)", true), Ok(Value::Integer(8)));
        assert_eq!(run("1 + 2 * 3 - -4", true), Ok(Value::Integer(11)));
        assert_eq!(run("7 % 4 + 0.5", true), Ok(Value::Float(3.5)));
        assert_eq!(run("1e3 / 8", true), Ok(Value::Float(125.0)));
        assert_eq!(
            run("cluster.nodes-tensor", true).unwrap_err().message,
            "`cluster.nodes-tensor` is unknown"
        );
        assert_eq!(run("cluster.nodes - tensor", true), Ok(Value::Integer(6)));
    }

    /// Deep nesting and endless chains are refused, not a stack overflow (issue 38: 10,000
    /// parentheses aborted the sweep); 64 levels still parse.
    #[test]
    fn nesting_and_length_are_bounded() {
        let deep = format!("{}1{}", "(".repeat(1000), ")".repeat(1000));
        assert!(run(&deep, false).unwrap_err().message.contains("nests deeper than 64"));
        assert!(run(&"-".repeat(2000), false).unwrap_err().message.contains("nests deeper than 64"));
        assert!(run(&"not ".repeat(500), false).unwrap_err().message.contains("nests deeper than 64"));
        let wide = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(run(&wide, false).unwrap_err().message.contains("at most 4096"));
        let long = vec!["1"; 10_000].join("+");
        assert!(run(&long, false).unwrap_err().message.contains("at most 4096"));
        let ok = format!("{}1{}", "(".repeat(64), ")".repeat(64));
        assert_eq!(run(&ok, false), Ok(Value::Integer(1)));
    }

    #[test]
    fn inexact_division_is_an_error_only_where_exactness_is_asked() {
        let error = run("64 / pipeline", true).unwrap_err();
        assert_eq!(error.column, 4);
        assert!(error.message.contains("64 / 3 = 21.3"), "{error}");
        let Ok(Value::Float(x)) = run("64 / pipeline", false) else { panic!() };
        assert!((x - 21.333).abs() < 1e-3);
        assert!(run("1 / 0", false).unwrap_err().message.contains("division by zero"));
    }

    #[test]
    fn conditions_compare_and_combine() {
        assert_eq!(run("tensor > cluster.gpus-per-node or fidelity == 'flow'", false), Ok(Value::Bool(true)));
        assert_eq!(run("not (tensor <= 2) and 1 / 0 > 1", false), Ok(Value::Bool(false)));
        assert_eq!(run("tensor != 2", false), Ok(Value::Bool(false)));
    }

    #[test]
    fn errors_give_the_column() {
        for (text, column, needle) in [
            ("tensor >", 9, "ends where a value"),
            ("tensor = 2", 8, "compare with =="),
            ("(tensor", 8, "expected `)`"),
            ("1 < 2 < 3", 7, "do not chain"),
            ("tensor pipeline", 8, "found `pipeline`"),
            ("'flow' + 1", 8, "cannot take a string"),
            ("tensor and true", 8, "needs booleans"),
            ("'open", 1, "not closed"),
            ("x && y", 3, "write and, or, not"),
        ] {
            let error = run(text, false).unwrap_err();
            assert_eq!((error.column, error.message.contains(needle)), (column, true), "{text}: {error}");
            assert!(error.to_string().contains(text));
        }
    }
}
