//! Static checks of the udev rules shipped in `udev/`.
//!
//! udev logs a line it cannot parse and skips it, so a typo in a rules file fails quietly on the
//! machine it is installed on: the device node simply stays root-only. These tests read every
//! `udev/*.rules` file and
//!
//! - parse each rule with a small strict tokenizer (stricter than udev: exactly one comma between
//!   items, and only the operators udev accepts for a key without a warning);
//! - check the permission policy: no `MODE` is world-writable, every `MODE` comes with a `GROUP`,
//!   the group name is written in one place, no `chmod` in a `RUN` grants write to others;
//! - replay udev events for the four node kinds (and for nodes that must stay untouched) through
//!   the rules, following `GOTO`/`LABEL` and `$env{}` substitution, and check the resulting group
//!   and mode;
//! - uncomment the `driver_override` template and check that it parses and is well formed.
//!
//! Template convention: a commented rule is written as `#` immediately followed by the key
//! (`#ACTION=="add", ...`); prose comments have a space after `#`.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// The group the shipped rules use unless edited.
const DEFAULT_GROUP: &str = "userdma";
/// The mode the shipped rules give the device nodes.
const NODE_MODE: &str = "0660";

// ---------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------

/// A udev operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `==`
    Match,
    /// `!=`
    NoMatch,
    /// `=`
    Assign,
    /// `+=`
    Add,
    /// `-=`
    Remove,
    /// `:=`
    AssignFinal,
}

impl Op {
    fn parse(text: &str) -> Option<Op> {
        match text {
            "==" => Some(Op::Match),
            "!=" => Some(Op::NoMatch),
            "=" => Some(Op::Assign),
            "+=" => Some(Op::Add),
            "-=" => Some(Op::Remove),
            ":=" => Some(Op::AssignFinal),
            _ => None,
        }
    }

    fn text(self) -> &'static str {
        match self {
            Op::Match => "==",
            Op::NoMatch => "!=",
            Op::Assign => "=",
            Op::Add => "+=",
            Op::Remove => "-=",
            Op::AssignFinal => ":=",
        }
    }

    fn is_match(self) -> bool {
        matches!(self, Op::Match | Op::NoMatch)
    }
}

/// Whether a key takes an `{attribute}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttrRule {
    Forbidden,
    Required,
    Optional,
}

/// What udev accepts for one key (udev(7); operators udev only accepts with a warning are left out).
#[derive(Debug)]
struct KeySpec {
    name: &'static str,
    attr: AttrRule,
    ops: &'static [Op],
}

const MATCH_ONLY: &[Op] = &[Op::Match, Op::NoMatch];
const ALL_OPS: &[Op] = &[
    Op::Match,
    Op::NoMatch,
    Op::Assign,
    Op::Add,
    Op::Remove,
    Op::AssignFinal,
];
/// `PROGRAM` and `IMPORT` are matches; udev(7) says `=`, `:=` and `+=` act as `==` for them.
const MATCH_LIKE: &[Op] = &[Op::Match, Op::NoMatch, Op::Assign, Op::Add, Op::AssignFinal];

const fn key(name: &'static str, attr: AttrRule, ops: &'static [Op]) -> KeySpec {
    KeySpec { name, attr, ops }
}

const NO: AttrRule = AttrRule::Forbidden;
const REQ: AttrRule = AttrRule::Required;
const OPT: AttrRule = AttrRule::Optional;
const MATCH_OR_SET: &[Op] = &[Op::Match, Op::NoMatch, Op::Assign];
const SET: &[Op] = &[Op::Assign, Op::AssignFinal];

const KEYS: &[KeySpec] = &[
    key("ACTION", NO, MATCH_ONLY),
    key("DEVPATH", NO, MATCH_ONLY),
    key("KERNEL", NO, MATCH_ONLY),
    key("KERNELS", NO, MATCH_ONLY),
    key("SUBSYSTEM", NO, MATCH_ONLY),
    key("SUBSYSTEMS", NO, MATCH_ONLY),
    key("DRIVER", NO, MATCH_ONLY),
    key("DRIVERS", NO, MATCH_ONLY),
    key("ATTRS", REQ, MATCH_ONLY),
    key("CONST", REQ, MATCH_ONLY),
    key("TAGS", NO, MATCH_ONLY),
    key("TEST", OPT, MATCH_ONLY),
    key("RESULT", NO, MATCH_ONLY),
    key("PROGRAM", NO, MATCH_LIKE),
    key("IMPORT", REQ, MATCH_LIKE),
    key(
        "NAME",
        NO,
        &[Op::Match, Op::NoMatch, Op::Assign, Op::AssignFinal],
    ),
    key("SYMLINK", NO, ALL_OPS),
    key("ATTR", REQ, MATCH_OR_SET),
    key("SYSCTL", REQ, MATCH_OR_SET),
    key("ENV", REQ, &[Op::Match, Op::NoMatch, Op::Assign, Op::Add]),
    key(
        "TAG",
        NO,
        &[Op::Match, Op::NoMatch, Op::Assign, Op::Add, Op::Remove],
    ),
    key("OWNER", NO, SET),
    key("GROUP", NO, SET),
    key("MODE", NO, SET),
    key("SECLABEL", REQ, &[Op::Assign, Op::Add]),
    key("RUN", OPT, &[Op::Assign, Op::Add, Op::AssignFinal]),
    key("LABEL", NO, &[Op::Assign]),
    key("GOTO", NO, &[Op::Assign]),
    key("OPTIONS", NO, &[Op::Assign, Op::Add, Op::AssignFinal]),
];

/// Built-in commands of systemd-udevd usable in `IMPORT{builtin}` and `RUN{builtin}`.
const BUILTINS: &[&str] = &[
    "blkid",
    "btrfs",
    "hwdb",
    "input_id",
    "keyboard",
    "kmod",
    "net_id",
    "net_setup_link",
    "path_id",
    "uaccess",
    "usb_id",
];

/// One `KEY{attr} OP "value"` item of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    key: String,
    attr: Option<String>,
    op: Op,
    /// The value between the quotes, with `\"` turned into `"` (raw for `e"..."` strings).
    value: String,
}

impl Item {
    fn is(&self, key: &str, attr: Option<&str>) -> bool {
        self.key == key && self.attr.as_deref() == attr
    }
}

/// Parses one logical rule line into its items, or says what is wrong and at which column.
fn parse_rule(text: &str) -> Result<Vec<Item>, String> {
    let mut pos = skip_ws(text, 0);
    if pos == text.len() {
        return Err("empty rule".to_string());
    }
    let mut items = Vec::new();
    loop {
        if text[pos..].starts_with(',') {
            let what = if items.is_empty() {
                "stray leading comma"
            } else {
                "two commas in a row"
            };
            return Err(format!("column {}: {what}", pos + 1));
        }
        let (item, end) = parse_item(text, pos)?;
        items.push(item);
        pos = skip_ws(text, end);
        if pos == text.len() {
            return Ok(items);
        }
        if !text[pos..].starts_with(',') {
            return Err(format!(
                "column {}: expected ',' between items, found `{}`",
                pos + 1,
                preview(&text[pos..])
            ));
        }
        pos = skip_ws(text, pos + 1);
        if pos == text.len() {
            return Err(format!("column {pos}: trailing comma"));
        }
    }
}

fn skip_ws(text: &str, from: usize) -> usize {
    text[from..]
        .find(|c: char| !c.is_whitespace())
        .map_or(text.len(), |offset| from + offset)
}

fn preview(text: &str) -> String {
    text.chars().take(16).collect()
}

/// Parses the item starting at byte `start`; returns it and the byte just past its value.
fn parse_item(text: &str, start: usize) -> Result<(Item, usize), String> {
    let column = |at: usize| at + 1;
    let key_len = text[start..]
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(text.len() - start);
    if key_len == 0 {
        return Err(format!(
            "column {}: expected a key, found `{}`",
            column(start),
            preview(&text[start..])
        ));
    }
    let key = &text[start..start + key_len];
    let spec = KEYS
        .iter()
        .find(|spec| spec.name == key)
        .ok_or_else(|| format!("column {}: unknown key `{key}`", column(start)))?;
    let mut pos = start + key_len;

    let mut attr = None;
    if text[pos..].starts_with('{') {
        let close = text[pos..]
            .find('}')
            .ok_or_else(|| format!("column {}: `{{` of {key} is never closed", column(pos)))?;
        let inner = &text[pos + 1..pos + close];
        if inner.is_empty() || inner.contains(|c: char| c.is_whitespace() || "{\",".contains(c)) {
            return Err(format!(
                "column {}: bad attribute `{{{inner}}}` for {key}",
                column(pos)
            ));
        }
        attr = Some(inner.to_string());
        pos += close + 1;
    }
    match (spec.attr, &attr) {
        (AttrRule::Forbidden, Some(a)) => {
            return Err(format!(
                "column {}: {key} takes no attribute, found `{{{a}}}`",
                column(start)
            ));
        }
        (AttrRule::Required, None) => {
            return Err(format!(
                "column {}: {key} needs an attribute, `{key}{{...}}`",
                column(start)
            ));
        }
        _ => {}
    }

    pos = skip_ws(text, pos);
    let op_len = text[pos..]
        .find(|c: char| !"=!+-:<>~".contains(c))
        .unwrap_or(text.len() - pos);
    let op_text = &text[pos..pos + op_len];
    let op = Op::parse(op_text).ok_or_else(|| {
        format!(
            "column {}: unknown operator `{op_text}` after {key}",
            column(pos)
        )
    })?;
    if !spec.ops.contains(&op) {
        let allowed: Vec<&str> = spec.ops.iter().map(|op| op.text()).collect();
        return Err(format!(
            "column {}: {key} does not take `{}`; it takes {}",
            column(pos),
            op.text(),
            allowed.join(" ")
        ));
    }
    pos = skip_ws(text, pos + op_len);

    let (value, end) = parse_value(text, pos)?;
    let item = Item {
        key: key.to_string(),
        attr,
        op,
        value,
    };
    check_item(&item).map_err(|message| format!("column {}: {message}", column(start)))?;
    Ok((item, end))
}

/// Parses `"..."` or `e"..."` at byte `start`; returns the value and the byte past the closing quote.
fn parse_value(text: &str, start: usize) -> Result<(String, usize), String> {
    let rest = &text[start..];
    let (escaped, body_start) = if rest.starts_with("e\"") {
        (true, start + 2)
    } else if rest.starts_with('"') {
        (false, start + 1)
    } else {
        return Err(format!(
            "column {}: value must be a double-quoted string, found `{}`",
            start + 1,
            preview(rest)
        ));
    };
    // Plain strings: only `\"` is an escape; any other backslash is kept and does not hide the
    // character after it. `e"..."` strings: a backslash always takes the next character with it.
    let mut value = String::new();
    let mut chars = text[body_start..].char_indices().peekable();
    while let Some((offset, c)) = chars.next() {
        match c {
            '"' => return Ok((value, body_start + offset + 1)),
            '\0' => return Err(format!("column {}: NUL in value", body_start + offset + 1)),
            '\\' if escaped => match chars.next() {
                Some((_, next)) => {
                    value.push('\\');
                    value.push(next);
                }
                None => break,
            },
            '\\' if chars.peek().is_some_and(|&(_, next)| next == '"') => {
                chars.next();
                value.push('"');
            }
            _ => value.push(c),
        }
    }
    Err(format!(
        "column {}: value is missing its closing quote",
        start + 1
    ))
}

/// Checks of attribute and value that udev makes for particular keys.
fn check_item(item: &Item) -> Result<(), String> {
    let attr = item.attr.as_deref();
    let first_word = item.value.split_whitespace().next().unwrap_or("");
    match item.key.as_str() {
        "CONST" if !matches!(attr, Some("arch" | "virt")) => {
            Err("CONST{} takes `arch` or `virt`".to_string())
        }
        "TEST" if attr.is_some_and(|mode| !mode.chars().all(|c| c.is_digit(8))) => {
            Err("TEST{} takes an octal mode".to_string())
        }
        "IMPORT" => match attr {
            Some("builtin") if !BUILTINS.contains(&first_word) => {
                Err(format!("unknown udev builtin `{first_word}`"))
            }
            Some("builtin" | "program" | "file" | "db" | "cmdline" | "parent") => Ok(()),
            _ => Err("IMPORT{} takes program, builtin, file, db, cmdline or parent".to_string()),
        },
        "RUN" => match attr {
            Some("builtin") if !BUILTINS.contains(&first_word) => {
                Err(format!("unknown udev builtin `{first_word}`"))
            }
            None | Some("builtin" | "program") => Ok(()),
            Some(_) => Err("RUN{} takes program or builtin".to_string()),
        },
        "OPTIONS" => check_option(&item.value),
        "MODE" | "GROUP" | "OWNER" | "LABEL" | "GOTO" if item.value.is_empty() => {
            Err(format!("{} needs a value", item.key))
        }
        _ => Ok(()),
    }
}

fn check_option(value: &str) -> Result<(), String> {
    const LOG_LEVELS: &[&str] = &[
        "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug", "reset",
    ];
    let ok = match value.split_once('=') {
        None => matches!(value, "watch" | "nowatch" | "db_persist"),
        Some(("link_priority", n)) => n.parse::<i32>().is_ok(),
        Some(("string_escape", mode)) => matches!(mode, "none" | "replace"),
        Some(("static_node", node)) => !node.is_empty(),
        Some(("log_level", level)) => LOG_LEVELS.contains(&level),
        Some(_) => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("unknown OPTIONS value `{value}`"))
    }
}

// ---------------------------------------------------------------------------------------------
// Files, lines and templates
// ---------------------------------------------------------------------------------------------

/// A problem in a rules file, shown as `file:line: message` and the offending text.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Problem {
    file: String,
    line: usize,
    message: String,
    text: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}\n    {}",
            self.file, self.line, self.message, self.text
        )
    }
}

/// A logical line: physical lines joined at trailing backslashes, numbered by its first line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    number: usize,
    text: String,
}

/// A parsed rule.
#[derive(Debug, Clone)]
struct Rule {
    number: usize,
    text: String,
    items: Vec<Item>,
}

impl Rule {
    fn find(&self, key: &str, attr: Option<&str>) -> Option<&Item> {
        self.items.iter().find(|item| item.is(key, attr))
    }

    fn has(&self, key: &str) -> bool {
        self.items.iter().any(|item| item.key == key)
    }

    fn matches_value(&self, key: &str, attr: Option<&str>, value: &str) -> bool {
        self.items
            .iter()
            .any(|item| item.is(key, attr) && item.op == Op::Match && item.value == value)
    }
}

/// A rules file: its active rules and its commented templates.
#[derive(Debug, Clone)]
struct RulesFile {
    name: String,
    rules: Vec<Rule>,
    templates: Vec<Rule>,
}

impl RulesFile {
    fn problem(&self, rule: &Rule, message: impl Into<String>) -> Problem {
        Problem {
            file: self.name.clone(),
            line: rule.number,
            message: message.into(),
            text: rule.text.clone(),
        }
    }
}

/// Physical lines numbered from 1; a final newline does not start another line.
fn physical_lines(src: &str) -> impl Iterator<Item = (usize, &str)> {
    let body = src.strip_suffix('\n').unwrap_or(src);
    body.split('\n')
        .enumerate()
        .map(|(index, raw)| (index + 1, raw))
}

/// Splits a rules file into logical lines the way udev does: leading whitespace is dropped, lines
/// starting with `#` are skipped (also inside a continuation), a trailing `\` joins the next line.
fn logical_lines(src: &str) -> Result<Vec<Line>, (usize, String, String)> {
    let mut lines = Vec::new();
    let mut pending: Option<Line> = None;
    for (number, raw) in physical_lines(src) {
        if raw.contains('\r') {
            return Err((
                number,
                "carriage return in line; udev rules files use LF line ends".into(),
                raw.into(),
            ));
        }
        let trimmed = raw.trim_start();
        if trimmed.starts_with('#') {
            continue;
        }
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (trimmed, false),
        };
        if !continues && trimmed.trim_end().ends_with('\\') {
            return Err((
                number,
                "whitespace after the line-continuation backslash; udev will not join the next line".into(),
                raw.into(),
            ));
        }
        let line = pending.get_or_insert_with(|| Line {
            number,
            text: String::new(),
        });
        line.text.push_str(body);
        if !continues {
            if let Some(done) = pending.take() {
                if !done.text.trim().is_empty() {
                    lines.push(done);
                }
            }
        }
    }
    match pending {
        Some(open) => Err((
            open.number,
            "file ends inside a line continuation".into(),
            open.text,
        )),
        None => Ok(lines),
    }
}

/// True if the text after `#` is a commented-out rule: `KEY`, optional `{attr}`, an operator.
fn looks_like_rule(text: &str) -> bool {
    let key_len = text
        .find(|c: char| !c.is_ascii_uppercase())
        .unwrap_or(text.len());
    if key_len == 0 || !KEYS.iter().any(|spec| spec.name == &text[..key_len]) {
        return false;
    }
    let mut rest = &text[key_len..];
    if rest.starts_with('{') {
        match rest.find('}') {
            Some(close) => rest = &rest[close + 1..],
            None => return false,
        }
    }
    ["==", "!=", "+=", "-=", ":=", "="]
        .iter()
        .any(|op| rest.trim_start().starts_with(op))
}

/// Commented rules (`#KEY...`), uncommented and joined at trailing backslashes.
fn template_lines(src: &str) -> Result<Vec<Line>, (usize, String, String)> {
    let mut lines = Vec::new();
    let mut pending: Option<Line> = None;
    for (number, raw) in physical_lines(src) {
        let uncommented = raw.trim_start().strip_prefix('#');
        let body = match (&pending, uncommented) {
            (Some(_), Some(rest)) => rest.trim_start(),
            (Some(_), None) => {
                return Err((
                    number,
                    "template rule continues on a line that is not commented".into(),
                    raw.into(),
                ));
            }
            (None, Some(rest)) if looks_like_rule(rest) => rest,
            (None, _) => continue,
        };
        let (body, continues) = match body.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (body, false),
        };
        let line = pending.get_or_insert_with(|| Line {
            number,
            text: String::new(),
        });
        line.text.push_str(body);
        if !continues {
            lines.extend(pending.take());
        }
    }
    match pending {
        Some(open) => Err((
            open.number,
            "file ends inside a template line continuation".into(),
            open.text,
        )),
        None => Ok(lines),
    }
}

/// Parses each line into a rule, adding a problem for each line that does not parse.
fn parse_lines(
    name: &str,
    lines: Result<Vec<Line>, (usize, String, String)>,
    what: &str,
    problems: &mut Vec<Problem>,
) -> Vec<Rule> {
    let file = name.to_string();
    let lines = match lines {
        Ok(lines) => lines,
        Err((line, message, text)) => {
            problems.push(Problem {
                file,
                line,
                message,
                text,
            });
            return Vec::new();
        }
    };
    let mut rules = Vec::new();
    for line in lines {
        match parse_rule(&line.text) {
            Ok(items) => rules.push(Rule {
                number: line.number,
                text: line.text,
                items,
            }),
            Err(message) => problems.push(Problem {
                file: file.clone(),
                line: line.number,
                message: format!("{what}: {message}"),
                text: line.text,
            }),
        }
    }
    rules
}

/// Parses a whole rules file; every syntax error is reported, not just the first.
fn parse_file(name: &str, src: &str) -> Result<RulesFile, Vec<Problem>> {
    let mut problems = Vec::new();
    let rules = parse_lines(name, logical_lines(src), "rule", &mut problems);
    let templates = parse_lines(
        name,
        template_lines(src),
        "commented template rule (as if uncommented)",
        &mut problems,
    );
    if problems.is_empty() {
        Ok(RulesFile {
            name: name.to_string(),
            rules,
            templates,
        })
    } else {
        Err(problems)
    }
}

fn udev_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("udev")
}

/// Reads and parses every `udev/*.rules` file, in the lexical order udev uses.
fn load_shipped_rules() -> Vec<RulesFile> {
    let dir = udev_dir();
    let entries =
        fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries
        .map(|entry| {
            entry
                .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
                .path()
        })
        .filter(|path| path.extension().is_some_and(|ext| ext == "rules"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no *.rules files in {}", dir.display());

    let mut files = Vec::new();
    let mut problems = Vec::new();
    for path in paths {
        let name = format!(
            "udev/{}",
            path.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        );
        let src = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        match parse_file(&name, &src) {
            Ok(file) => files.push(file),
            Err(found) => problems.extend(found),
        }
    }
    assert_no_problems("udev rules syntax", &problems);
    files
}

fn assert_no_problems(what: &str, problems: &[Problem]) {
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(Problem::to_string).collect();
        panic!("{what}: {} problem(s)\n{}", problems.len(), list.join("\n"));
    }
}

// ---------------------------------------------------------------------------------------------
// Policy
// ---------------------------------------------------------------------------------------------

/// `MODE` values: literal octal, no special bits, not writable by others; and a `GROUP` alongside.
fn mode_problems(file: &RulesFile) -> Vec<Problem> {
    let mut problems = Vec::new();
    for rule in file.rules.iter().chain(&file.templates) {
        for item in rule.items.iter().filter(|item| item.key == "MODE") {
            let mode = item.value.as_str();
            let octal = (3..=4).contains(&mode.len()) && mode.chars().all(|c| c.is_digit(8));
            if !octal {
                problems.push(
                    file.problem(rule, format!("MODE=\"{mode}\" is not a literal octal mode")),
                );
            } else if mode.len() == 4 && !mode.starts_with('0') {
                problems.push(file.problem(
                    rule,
                    format!("MODE=\"{mode}\" sets setuid/setgid/sticky bits"),
                ));
            } else if mode
                .chars()
                .last()
                .and_then(|c| c.to_digit(8))
                .is_some_and(|other| other & 0o2 != 0)
            {
                problems.push(file.problem(rule, format!("MODE=\"{mode}\" is world-writable")));
            }
            if !rule.has("GROUP") {
                problems.push(file.problem(rule, "MODE without GROUP in the same rule"));
            }
        }
    }
    problems
}

/// The words following each `chmod`/`chgrp` in the `RUN` values of a rule (options skipped).
fn command_args<'a>(rule: &'a Rule, command: &str) -> Vec<&'a str> {
    let mut args = Vec::new();
    for item in rule.items.iter().filter(|item| item.key == "RUN") {
        let words: Vec<&str> = item
            .value
            .split(|c: char| c.is_whitespace() || c == '\'')
            .collect();
        for (i, word) in words.iter().enumerate() {
            if word.rsplit('/').next() == Some(command) {
                if let Some(arg) = words[i + 1..]
                    .iter()
                    .find(|w| !w.is_empty() && !w.starts_with('-'))
                {
                    args.push(*arg);
                }
            }
        }
    }
    args
}

/// True if a chmod mode argument (octal or symbolic) gives write permission to others.
fn chmod_grants_world_write(mode: &str) -> bool {
    if !mode.is_empty() && mode.chars().all(|c| c.is_digit(8)) {
        return mode
            .chars()
            .last()
            .and_then(|c| c.to_digit(8))
            .is_some_and(|other| other & 0o2 != 0);
    }
    mode.split(',').any(|clause| {
        let who_len = clause
            .find(|c: char| !"ugoa".contains(c))
            .unwrap_or(clause.len());
        let who = &clause[..who_len];
        let for_others = who.is_empty() || who.contains('o') || who.contains('a');
        let mut granting = false;
        let mut grants_write = false;
        for c in clause[who_len..].chars() {
            match c {
                '+' | '=' => granting = true,
                '-' => granting = false,
                'w' if granting => grants_write = true,
                _ => {}
            }
        }
        for_others && grants_write
    })
}

fn chmod_problems(file: &RulesFile) -> Vec<Problem> {
    let mut problems = Vec::new();
    for rule in file.rules.iter().chain(&file.templates) {
        for mode in command_args(rule, "chmod") {
            if chmod_grants_world_write(mode) {
                problems
                    .push(file.problem(rule, format!("`chmod {mode}` makes files world-writable")));
            }
        }
    }
    problems
}

/// `$env{NAME}` or `%E{NAME}` as the whole value: the property name.
fn env_reference(value: &str) -> Option<&str> {
    value
        .strip_prefix("$env{")
        .or_else(|| value.strip_prefix("%E{"))
        .and_then(|rest| rest.strip_suffix('}'))
        .filter(|name| !name.is_empty() && !name.contains(['{', '}', '$', '%']))
}

fn is_group_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The group is named in exactly one place per file: one literal `GROUP=`, or every `GROUP=` and
/// `chgrp` refers to one `ENV{NAME}` that is assigned exactly once. `chgrp root` (undoing) is allowed.
fn group_problems(file: &RulesFile) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut references: Vec<(&Rule, &str)> = Vec::new();
    for rule in &file.rules {
        references.extend(
            rule.items
                .iter()
                .filter(|item| item.key == "GROUP")
                .map(|item| (rule, item.value.as_str())),
        );
        references.extend(
            command_args(rule, "chgrp")
                .into_iter()
                .filter(|g| !matches!(*g, "root" | "0"))
                .map(|g| (rule, g)),
        );
    }
    let Some(&(first_rule, first)) = references.first() else {
        return problems;
    };
    for &(rule, value) in &references[1..] {
        if value != first {
            problems.push(file.problem(
                rule,
                format!(
                    "group given as `{value}` here but `{first}` on line {}; name it in one place",
                    first_rule.number
                ),
            ));
        }
    }
    match env_reference(first) {
        Some(name) => {
            let definitions: Vec<(&Rule, &Item)> = file
                .rules
                .iter()
                .flat_map(|rule| rule.items.iter().map(move |item| (rule, item)))
                .filter(|(_, item)| item.is("ENV", Some(name)) && !item.op.is_match())
                .collect();
            match definitions.as_slice() {
                [(rule, item)] => {
                    if item.op != Op::Assign || !is_group_name(&item.value) {
                        problems.push(file.problem(
                            rule,
                            format!("ENV{{{name}}} must be set with `=` to a group name"),
                        ));
                    }
                }
                [] => problems.push(file.problem(
                    first_rule,
                    format!("`{first}` refers to ENV{{{name}}}, which no rule sets"),
                )),
                [_, (rule, _), ..] => {
                    problems.push(file.problem(
                        rule,
                        format!("ENV{{{name}}} (the group) is set more than once"),
                    ));
                }
            }
        }
        None => {
            if !is_group_name(first) {
                problems.push(file.problem(first_rule, format!("`{first}` is not a group name")));
            }
            if let Some(&(rule, _)) = references.get(1) {
                problems.push(file.problem(
                    rule,
                    format!("group `{first}` written more than once; set it once in ENV{{...}} and use $env{{...}}"),
                ));
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// Event replay
// ---------------------------------------------------------------------------------------------

/// fnmatch(3)-style glob, as udev uses for match values: `*`, `?`, `[...]` (with `!`/`^`), `\`.
fn glob_match(pattern: &[char], text: &[char]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some(('*', rest)) => (0..=text.len()).any(|skip| glob_match(rest, &text[skip..])),
        Some(('?', rest)) => !text.is_empty() && glob_match(rest, &text[1..]),
        Some(('[', rest)) => match class_match(rest, text.first().copied()) {
            Some((matched, after)) => matched && glob_match(after, &text[1..]),
            None => text.first() == Some(&'[') && glob_match(rest, &text[1..]),
        },
        Some(('\\', rest)) if !rest.is_empty() => {
            text.first() == Some(&rest[0]) && glob_match(&rest[1..], &text[1..])
        }
        Some((c, rest)) => text.first() == Some(c) && glob_match(rest, &text[1..]),
    }
}

/// Matches `c` against a bracket class whose body starts at `body` (just after `[`). Returns
/// whether it matched and the pattern after `]`, or `None` if the class is not closed.
fn class_match(body: &[char], c: Option<char>) -> Option<(bool, &[char])> {
    let (negated, mut i) = match body.first() {
        Some('!' | '^') => (true, 1),
        _ => (false, 0),
    };
    let mut matched = false;
    let mut first = true;
    loop {
        let &start = body.get(i)?;
        if start == ']' && !first {
            let hit = c.is_some() && matched != negated;
            return Some((hit, &body[i + 1..]));
        }
        first = false;
        if body.get(i + 1) == Some(&'-') && body.get(i + 2).is_some_and(|&end| end != ']') {
            let end = body[i + 2];
            matched |= c.is_some_and(|c| (start..=end).contains(&c));
            i += 3;
        } else {
            matched |= c == Some(start);
            i += 1;
        }
    }
}

/// udev match: `|`-separated alternatives, each a glob.
fn udev_match(pattern: &str, value: &str) -> bool {
    let value: Vec<char> = value.chars().collect();
    pattern
        .split('|')
        .any(|alternative| glob_match(&alternative.chars().collect::<Vec<_>>(), &value))
}

/// Expands `$env{X}`, `%E{X}`, `$$` and `%%`; other substitutions are not modelled.
fn substitute(value: &str, env: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find(['$', '%']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if tail.starts_with("$$") || tail.starts_with("%%") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        let open = if tail.starts_with("$env{") {
            5
        } else if tail.starts_with("%E{") {
            3
        } else {
            return Err(format!(
                "substitution `{}` is not modelled by this test",
                preview(tail)
            ));
        };
        let close = tail
            .find('}')
            .ok_or_else(|| format!("unclosed substitution in `{value}`"))?;
        out.push_str(env.get(&tail[open..close]).map_or("", String::as_str));
        rest = &tail[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A device event to replay.
#[derive(Debug, Clone, Copy)]
struct Event {
    action: &'static str,
    subsystem: &'static str,
    kernel: &'static str,
}

/// What the rules assigned for an event.
#[derive(Debug, Default, PartialEq, Eq)]
struct Outcome {
    group: Option<String>,
    mode: Option<String>,
}

/// Replays `event` through `files` in order. Match keys other than ACTION, SUBSYSTEM, KERNEL and
/// ENV cannot be decided here; a rule using one is skipped if it only runs programs, and is an
/// error if it would change the group, mode, owner, properties or control flow.
fn replay(files: &[RulesFile], event: Event) -> Result<Outcome, String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let mut outcome = Outcome::default();
    let (mut group_final, mut mode_final) = (false, false);
    for file in files {
        let mut index = 0;
        while let Some(rule) = file.rules.get(index) {
            index += 1;
            let at = || format!("{}:{}", file.name, rule.number);
            let mut applies = Some(true);
            for item in rule.items.iter().filter(|item| {
                item.op.is_match() || matches!(item.key.as_str(), "PROGRAM" | "IMPORT")
            }) {
                let actual = match (item.key.as_str(), item.attr.as_deref()) {
                    ("ACTION", None) => Some(event.action),
                    ("SUBSYSTEM", None) => Some(event.subsystem),
                    ("KERNEL", None) => Some(event.kernel),
                    ("ENV", Some(name)) => Some(env.get(name).map_or("", String::as_str)),
                    _ => None,
                };
                let result =
                    actual.map(|actual| udev_match(&item.value, actual) == (item.op == Op::Match));
                applies = match (applies, result) {
                    (Some(false), _) | (_, Some(false)) => Some(false),
                    (Some(true), Some(true)) => Some(true),
                    _ => None,
                };
            }
            match applies {
                Some(false) => continue,
                Some(true) => {}
                None if ["GROUP", "MODE", "OWNER", "ENV", "GOTO"].iter().any(|key| {
                    rule.items
                        .iter()
                        .any(|item| item.key == *key && !item.op.is_match())
                }) =>
                {
                    return Err(format!(
                        "{}: rule depends on a match this test cannot decide",
                        at()
                    ));
                }
                None => continue,
            }
            for item in rule.items.iter().filter(|item| !item.op.is_match()) {
                match (item.key.as_str(), item.attr.as_deref()) {
                    ("ENV", Some(name)) if item.op == Op::Assign => {
                        env.insert(
                            name.to_string(),
                            substitute(&item.value, &env).map_err(|e| format!("{}: {e}", at()))?,
                        );
                    }
                    ("GROUP", None) if !group_final => {
                        outcome.group = Some(
                            substitute(&item.value, &env).map_err(|e| format!("{}: {e}", at()))?,
                        );
                        group_final = item.op == Op::AssignFinal;
                    }
                    ("MODE", None) if !mode_final => {
                        outcome.mode = Some(
                            substitute(&item.value, &env).map_err(|e| format!("{}: {e}", at()))?,
                        );
                        mode_final = item.op == Op::AssignFinal;
                    }
                    ("ENV", _) => {
                        return Err(format!(
                            "{}: ENV `{}` is not modelled",
                            at(),
                            item.op.text()
                        ))
                    }
                    _ => {}
                }
            }
            if let Some(goto) = rule.find("GOTO", None) {
                let target = file.rules[index..]
                    .iter()
                    .position(|later| {
                        later
                            .find("LABEL", None)
                            .is_some_and(|label| label.value == goto.value)
                    })
                    .ok_or_else(|| {
                        format!("{}: GOTO=\"{}\" has no LABEL after it", at(), goto.value)
                    })?;
                index += target;
            }
        }
    }
    Ok(outcome)
}

/// The device nodes that must end up `root:<group> 0660`, as (subsystem, kernel name).
const COVERED: &[(&str, &str)] = &[
    ("vfio", "12"),
    ("vfio", "noiommu-0"),
    ("vfio-dev", "vfio0"),
    ("vfio-dev", "noiommu-vfio1"),
    ("misc", "iommu"),
    ("uio", "uio0"),
];

/// Nodes the rules must leave as they are: the VFIO container, unrelated devices.
const UNTOUCHED: &[(&str, &str)] = &[
    ("misc", "vfio"),
    ("misc", "kvm"),
    ("misc", "fuse"),
    ("block", "sda"),
    ("pci", "0000:01:00.0"),
    ("iommu", "dmar0"),
];

/// Replays add/change events for the covered and untouched nodes and a remove event.
fn coverage_problems(files: &[RulesFile], group: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut check = |event: Event, want: Outcome| match replay(files, event) {
        Ok(got) if got == want => {}
        Ok(got) => problems.push(format!("{event:?}: rules give {got:?}, expected {want:?}")),
        Err(e) => problems.push(format!("{event:?}: {e}")),
    };
    for action in ["add", "change"] {
        for &(subsystem, kernel) in COVERED {
            let want = Outcome {
                group: Some(group.to_string()),
                mode: Some(NODE_MODE.to_string()),
            };
            check(
                Event {
                    action,
                    subsystem,
                    kernel,
                },
                want,
            );
        }
        for &(subsystem, kernel) in UNTOUCHED {
            check(
                Event {
                    action,
                    subsystem,
                    kernel,
                },
                Outcome::default(),
            );
        }
    }
    for &(subsystem, kernel) in COVERED {
        check(
            Event {
                action: "remove",
                subsystem,
                kernel,
            },
            Outcome::default(),
        );
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// The driver_override template
// ---------------------------------------------------------------------------------------------

fn is_hex_id(value: &str) -> bool {
    value.strip_prefix("0x").is_some_and(|hex| {
        hex.len() == 4 && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
    })
}

fn is_bdf(value: &str) -> bool {
    let hex =
        |s: &str, n: usize| s.len() == n && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
    let parts: Vec<&str> = value.split([':', '.']).collect();
    matches!(parts.as_slice(), [domain, bus, dev, func]
        if hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && matches!(*func, "0" | "1" | "2" | "3" | "4" | "5" | "6" | "7"))
}

/// A `driver_override` template rule: add event, PCI, a device selected by lowercase IDs or by
/// address, override to vfio-pci, and vfio-pci loaded.
fn override_template_problems(file: &RulesFile, rule: &Rule) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut need = |ok: bool, message: &str| {
        if !ok {
            problems.push(file.problem(rule, message));
        }
    };
    need(
        rule.matches_value("ACTION", None, "add"),
        "driver_override template must match ACTION==\"add\"",
    );
    need(
        rule.matches_value("SUBSYSTEM", None, "pci"),
        "driver_override template must match SUBSYSTEM==\"pci\"",
    );
    need(
        rule.find("ATTR", Some("driver_override"))
            .is_some_and(|item| item.op == Op::Assign && item.value == "vfio-pci"),
        "driver_override template must set ATTR{driver_override}=\"vfio-pci\"",
    );
    let id = |attr: &str| {
        rule.find("ATTR", Some(attr))
            .filter(|item| item.op == Op::Match)
    };
    match (id("vendor"), id("device"), rule.find("KERNEL", None)) {
        (Some(vendor), Some(device), _) => need(
            is_hex_id(&vendor.value) && is_hex_id(&device.value),
            "vendor/device IDs must be written as sysfs shows them: 0x and four lowercase hex digits",
        ),
        (None, None, Some(kernel)) => need(
            kernel.op == Op::Match && is_bdf(&kernel.value),
            "KERNEL must be a full lowercase PCI address, e.g. 0000:01:00.0",
        ),
        _ => need(false, "template must select a device by ATTR{vendor} and ATTR{device}, or by KERNEL"),
    }
    need(
        rule.items
            .iter()
            .any(|item| item.is("RUN", Some("builtin")) && item.value == "kmod load vfio-pci"),
        "driver_override template must load vfio-pci (RUN{builtin}+=\"kmod load vfio-pci\")",
    );
    need(
        rule.items
            .iter()
            .any(|item| item.key == "RUN" && item.value.contains("/sys/bus/pci/drivers_probe")),
        "driver_override template must ask for a probe through /sys/bus/pci/drivers_probe",
    );
    problems
}

// ---------------------------------------------------------------------------------------------
// Tests of the shipped files
// ---------------------------------------------------------------------------------------------

#[test]
fn shipped_rules_parse() {
    let files = load_shipped_rules();
    let active: usize = files.iter().map(|file| file.rules.len()).sum();
    assert!(active > 0, "the udev/*.rules files contain no active rule");
}

#[test]
fn shipped_modes_are_not_world_writable_and_have_a_group() {
    let problems: Vec<Problem> = load_shipped_rules()
        .iter()
        .flat_map(mode_problems)
        .collect();
    assert_no_problems("MODE policy", &problems);
}

#[test]
fn shipped_chmods_are_not_world_writable() {
    let problems: Vec<Problem> = load_shipped_rules()
        .iter()
        .flat_map(chmod_problems)
        .collect();
    assert_no_problems("chmod policy", &problems);
}

#[test]
fn shipped_group_is_named_once_per_file() {
    let problems: Vec<Problem> = load_shipped_rules()
        .iter()
        .flat_map(group_problems)
        .collect();
    assert_no_problems("group policy", &problems);
}

#[test]
fn shipped_rules_cover_every_node_kind_and_nothing_else() {
    let problems = coverage_problems(&load_shipped_rules(), DEFAULT_GROUP);
    assert!(
        problems.is_empty(),
        "event replay:\n{}",
        problems.join("\n")
    );
}

#[test]
fn shipped_driver_override_template_parses_and_is_well_formed() {
    let files = load_shipped_rules();
    let mut problems = Vec::new();
    let mut overrides = 0;
    for file in &files {
        for rule in &file.templates {
            if rule.find("ATTR", Some("driver_override")).is_some() {
                overrides += 1;
                problems.extend(override_template_problems(file, rule));
            }
        }
        if file.name.contains("driver-override") {
            problems.extend(
                file.rules
                    .iter()
                    .map(|rule| file.problem(rule, "template file has an active rule")),
            );
        }
    }
    assert_no_problems("driver_override template", &problems);
    assert!(
        overrides > 0,
        "no commented rule sets ATTR{{driver_override}} in udev/*.rules"
    );
}

// ---------------------------------------------------------------------------------------------
// Tests of the checker itself: each must reject what it exists to reject
// ---------------------------------------------------------------------------------------------

fn parse_ok(line: &str) -> Vec<Item> {
    parse_rule(line).unwrap_or_else(|e| panic!("`{line}` should parse: {e}"))
}

fn sample(src: &str) -> RulesFile {
    parse_file("sample.rules", src).unwrap_or_else(|problems| {
        let list: Vec<String> = problems.iter().map(Problem::to_string).collect();
        panic!("sample should parse:\n{}", list.join("\n"))
    })
}

#[test]
fn tokenizer_splits_items() {
    let items = parse_ok(r#"SUBSYSTEM=="misc", KERNEL=="iommu", GROUP="$env{.G}", MODE="0660""#);
    let expected = [
        ("SUBSYSTEM", None, Op::Match, "misc"),
        ("KERNEL", None, Op::Match, "iommu"),
        ("GROUP", None, Op::Assign, "$env{.G}"),
        ("MODE", None, Op::Assign, "0660"),
    ];
    assert_eq!(items.len(), expected.len());
    for (item, (key, attr, op, value)) in items.iter().zip(expected) {
        assert_eq!(
            (
                item.key.as_str(),
                item.attr.as_deref(),
                item.op,
                item.value.as_str()
            ),
            (key, attr, op, value)
        );
    }
    let items = parse_ok(r#"ATTR{driver_override}="vfio-pci",RUN{builtin}+="kmod load vfio-pci""#);
    assert_eq!(items[0].attr.as_deref(), Some("driver_override"));
    assert_eq!(items[1].op, Op::Add);
}

#[test]
fn tokenizer_accepts_valid_lines() {
    for line in [
        r#"ACTION=="add""#,
        r#"  ACTION!="remove" ,  SUBSYSTEM=="vfio|vfio-dev"  "#,
        r#"KERNEL=="uio[0-9]*", GROUP:="g", MODE:="0640""#,
        r#"ENV{.X}="1", ENV{Y}+="2", TAG+="uaccess", TAG-="seat""#,
        r#"SYMLINK+="a b", SYMLINK-="c", NAME:="eth9""#,
        r#"IMPORT{builtin}="path_id", IMPORT{program}=="/bin/true", PROGRAM=="/bin/true", RESULT!="x""#,
        r#"TEST{0644}=="/sys/x", CONST{virt}=="kvm", ATTRS{vendor}=="0x8086""#,
        r#"OPTIONS+="link_priority=-10", OPTIONS="string_escape=replace", OPTIONS:="nowatch""#,
        r#"RUN+="/bin/sh -c 'echo \"hi\"'", LABEL="x", GOTO="x""#,
        r#"ENV{X}=e"tab\there", SECLABEL{selinux}="s0""#,
        r#"DEVPATH=="/devices/*", DRIVER=="vfio-pci", DRIVERS=="x", KERNELS=="0000:*", SUBSYSTEMS=="pci", TAGS=="t""#,
        r#"SYSCTL{kernel.x}=="1", ATTR{power/control}="auto", OWNER="root""#,
        r#"KERNEL  ==  "spaced""#,
    ] {
        parse_ok(line);
    }
    assert_eq!(parse_ok(r#"ENV{X}="say \"hi\"""#)[0].value, r#"say "hi""#);
    assert_eq!(parse_ok(r#"ENV{X}="a\tb""#)[0].value, r"a\tb");
    assert_eq!(parse_ok(r#"ENV{X}=e"a\"b""#)[0].value, r#"a\"b"#);
}

#[test]
fn tokenizer_rejects_bad_lines() {
    let cases = [
        (r"KERNEL==iommu", "double-quoted"),
        (r#"KERNEL=="iommu"#, "closing quote"),
        (r#"KERNEL=="iommu\""#, "closing quote"),
        (r#"KERNEL=="iommu\\""#, "closing quote"),
        (r#"KERNEL=~"iommu""#, "unknown operator `=~`"),
        (r#"KERNEL<="iommu""#, "unknown operator `<=`"),
        (r#"KERNEL==="iommu""#, "unknown operator `===`"),
        (r#"KERNEL "iommu""#, "unknown operator ``"),
        (r#"KERNAL=="iommu""#, "unknown key `KERNAL`"),
        (r#"kernel=="iommu""#, "unknown key `kernel`"),
        (r#"devpath=="/x""#, "unknown key `devpath`"),
        (r#"KERNEL=="iommu","#, "trailing comma"),
        (r#"KERNEL=="iommu", "#, "trailing comma"),
        (r#", KERNEL=="iommu""#, "stray leading comma"),
        (r#"KERNEL=="a",, MODE="0660""#, "two commas"),
        (r#"KERNEL=="a" MODE="0660""#, "expected ','"),
        (r#"KERNEL=="a"MODE="0660""#, "expected ','"),
        (r#"KERNEL=="a"x"#, "expected ','"),
        (r#"SUBSYSTEM="vfio""#, "SUBSYSTEM does not take `=`"),
        (r#"ACTION+="add""#, "ACTION does not take `+=`"),
        (r#"MODE=="0660""#, "MODE does not take `==`"),
        (r#"GROUP!="g""#, "GROUP does not take `!=`"),
        (r#"GROUP+="g""#, "GROUP does not take `+=`"),
        (r#"RUN-="/bin/true""#, "RUN does not take `-=`"),
        (r#"GOTO+="end""#, "GOTO does not take `+=`"),
        (r#"ATTR{x}+="1""#, "ATTR does not take `+=`"),
        (r#"ENV{X}-="1""#, "ENV does not take `-=`"),
        (r#"IMPORT{builtin}-="kmod""#, "IMPORT does not take `-=`"),
        (r#"ATTR=="x""#, "needs an attribute"),
        (r#"ATTR{}=="x""#, "bad attribute"),
        (r#"ATTR{a b}=="x""#, "bad attribute"),
        (r#"ATTR{vendor=="x""#, "never closed"),
        (r#"KERNEL{x}=="y""#, "takes no attribute"),
        (r#"ATTR {vendor}=="x""#, "needs an attribute"),
        (r#"CONST{os}=="linux""#, "arch"),
        (r#"TEST{rw}=="/x""#, "octal"),
        (r#"IMPORT{net}=="x""#, "IMPORT{} takes"),
        (r#"IMPORT{builtin}=="frobnicate""#, "unknown udev builtin"),
        (r#"RUN{builtin}+="modprobe x""#, "unknown udev builtin"),
        (r#"RUN{shell}+="x""#, "RUN{} takes"),
        (r#"OPTIONS+="fast""#, "unknown OPTIONS value"),
        (r#"OPTIONS+="link_priority=high""#, "unknown OPTIONS value"),
        (r#"MODE="""#, "needs a value"),
        (r#"ENV{X}=E"x""#, "double-quoted"),
        (r"ENV{X}='x'", "double-quoted"),
        ("", "empty rule"),
        ("   ", "empty rule"),
    ];
    for (line, expected) in cases {
        match parse_rule(line) {
            Ok(items) => panic!("`{line}` should be rejected, parsed as {items:?}"),
            Err(message) => assert!(
                message.contains(expected),
                "`{line}`: got `{message}`, expected `{expected}`"
            ),
        }
    }
}

#[test]
fn logical_lines_join_continuations_and_skip_comments() {
    let src =
        "# comment\n\nA==\"1\", \\\n   # comment inside is skipped\n   B==\"2\"\n  C==\"3\"\n";
    let lines = logical_lines(src).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        lines,
        vec![
            Line {
                number: 3,
                text: "A==\"1\", B==\"2\"".to_string()
            },
            Line {
                number: 6,
                text: "C==\"3\"".to_string()
            },
        ]
    );
    let error = |src: &str| {
        logical_lines(src)
            .err()
            .map(|(line, message, _)| (line, message))
    };
    assert!(
        matches!(error("A==\"1\", \\ \nB==\"2\"\n"), Some((1, m)) if m.contains("whitespace after"))
    );
    assert!(matches!(error("A==\"1\"\nB==\"2\", \\\n"), Some((2, m)) if m.contains("ends inside")));
    assert!(matches!(error("A==\"1\"\r\n"), Some((1, m)) if m.contains("carriage return")));
}

#[test]
fn parse_file_reports_file_and_line() {
    let problems = parse_file(
        "x.rules",
        "# ok\nKERNEL==\"a\"\nKERNEL==\"b\" MODE=\"0660\"\n",
    )
    .err()
    .unwrap_or_default();
    assert_eq!(problems.len(), 1, "{problems:?}");
    let shown = problems[0].to_string();
    assert!(
        shown.starts_with("x.rules:3: rule: column 13: expected ','"),
        "{shown}"
    );
    assert!(shown.ends_with("KERNEL==\"b\" MODE=\"0660\""), "{shown}");
}

#[test]
fn templates_are_uncommented_and_checked() {
    let file = sample(
        "# Prose: MODE=\"0666\" in prose is not a rule.\n\
         #ACTION==\"add\", \\\n\
         #  ATTR{driver_override}=\"vfio-pci\"\n\
         KERNEL==\"x\", GROUP=\"g\", MODE=\"0660\"\n",
    );
    assert_eq!(file.rules.len(), 1);
    assert_eq!(file.templates.len(), 1);
    assert_eq!(
        file.templates[0].text,
        "ACTION==\"add\", ATTR{driver_override}=\"vfio-pci\""
    );
    assert_eq!(file.templates[0].number, 2);

    let broken = parse_file(
        "t.rules",
        "#ACTION==\"add\", ATTR{driver_override}=vfio-pci\n",
    )
    .err()
    .unwrap_or_default();
    assert!(
        broken
            .iter()
            .any(|p| p.message.contains("template") && p.message.contains("double-quoted")),
        "{broken:?}"
    );
    let dangling = parse_file("t.rules", "#ACTION==\"add\", \\\nATTR{x}=\"1\"\n")
        .err()
        .unwrap_or_default();
    assert!(
        dangling.iter().any(|p| p.message.contains("not commented")),
        "{dangling:?}"
    );
}

#[test]
fn override_template_checks_catch_mistakes() {
    let good = "#ACTION==\"add\", SUBSYSTEM==\"pci\", ATTR{vendor}==\"0x1234\", ATTR{device}==\"0x11e8\", \
                ATTR{driver_override}=\"vfio-pci\", RUN{builtin}+=\"kmod load vfio-pci\", \
                RUN+=\"/bin/sh -c 'echo %k > /sys/bus/pci/drivers_probe'\"\n";
    let file = sample(good);
    assert!(override_template_problems(&file, &file.templates[0]).is_empty());
    for (from, to, expected) in [
        ("0x11e8", "0x11E8", "lowercase"),
        ("0x1234", "1234", "lowercase"),
        ("ACTION==\"add\"", "ACTION==\"bind\"", "ACTION"),
        (
            "RUN{builtin}+=\"kmod load vfio-pci\", ",
            "",
            "load vfio-pci",
        ),
        ("=\"vfio-pci\"", "=\"uio_pci_generic\"", "vfio-pci"),
        (
            "ATTR{vendor}==\"0x1234\", ATTR{device}==\"0x11e8\", ",
            "",
            "select a device",
        ),
        (
            "ATTR{vendor}==\"0x1234\", ATTR{device}==\"0x11e8\"",
            "KERNEL==\"01:00.0\"",
            "PCI address",
        ),
    ] {
        let file = sample(&good.replace(from, to));
        let problems = override_template_problems(&file, &file.templates[0]);
        assert!(
            problems.iter().any(|p| p.message.contains(expected)),
            "{from} -> {to}: {problems:?}"
        );
    }
    let by_address = sample(&good.replace(
        "ATTR{vendor}==\"0x1234\", ATTR{device}==\"0x11e8\"",
        "KERNEL==\"0000:01:00.0\"",
    ));
    assert!(override_template_problems(&by_address, &by_address.templates[0]).is_empty());
}

#[test]
fn mode_policy_rejects_world_writable_and_groupless_modes() {
    let problems = |src: &str| {
        mode_problems(&sample(src))
            .into_iter()
            .map(|p| p.message)
            .collect::<Vec<_>>()
    };
    assert!(problems(r#"KERNEL=="a", GROUP="g", MODE="0660""#).is_empty());
    assert!(problems(r#"KERNEL=="a", GROUP="g", MODE="644""#).is_empty());
    for (mode, expected) in [
        ("0666", "world-writable"),
        ("0662", "world-writable"),
        ("0603", "world-writable"),
        ("777", "world-writable"),
        ("4660", "setuid"),
        ("06", "literal octal"),
        ("0680", "literal octal"),
        ("$env{M}", "literal octal"),
    ] {
        let found = problems(&format!(r#"KERNEL=="a", GROUP="g", MODE="{mode}""#));
        assert!(
            found.iter().any(|m| m.contains(expected)),
            "MODE={mode}: {found:?}"
        );
    }
    let found = problems(r#"KERNEL=="a", MODE="0600""#);
    assert!(
        found.iter().any(|m| m.contains("without GROUP")),
        "{found:?}"
    );
    let found = problems("#KERNEL==\"a\", GROUP=\"g\", MODE=\"0666\"\n");
    assert!(
        found.iter().any(|m| m.contains("world-writable")),
        "templates are checked too: {found:?}"
    );
}

#[test]
fn chmod_policy_rejects_world_write() {
    for mode in [
        "g+rw",
        "g-w",
        "u=rw,g=r",
        "0660",
        "664",
        "o-w",
        "a-w",
        "g+w,o-rwx",
        "o+r",
    ] {
        assert!(!chmod_grants_world_write(mode), "{mode} should pass");
    }
    for mode in [
        "o+w", "a+w", "+w", "go+w", "o=rw", "0666", "0002", "u+r,o+w", "o-x+w",
    ] {
        assert!(chmod_grants_world_write(mode), "{mode} should be caught");
    }
    let file = sample(r#"SUBSYSTEM=="uio", RUN+="/bin/sh -c 'cd /x && /bin/chmod -R o+w config'""#);
    assert_eq!(chmod_problems(&file).len(), 1);
}

#[test]
fn group_policy_wants_one_place() {
    let problems = |src: &str| {
        group_problems(&sample(src))
            .into_iter()
            .map(|p| p.message)
            .collect::<Vec<_>>()
    };
    let good = "ENV{.G}=\"userdma\"\nKERNEL==\"a\", GROUP=\"$env{.G}\", MODE=\"0660\"\n\
                KERNEL==\"b\", GROUP=\"$env{.G}\", MODE=\"0660\"\n\
                KERNEL==\"c\", RUN+=\"/bin/sh -c '/bin/chgrp $env{.G} f; /bin/chgrp root g'\"\n";
    assert!(problems(good).is_empty(), "{:?}", problems(good));
    assert!(problems("KERNEL==\"a\", GROUP=\"userdma\", MODE=\"0660\"\n").is_empty());

    let cases = [
        ("KERNEL==\"a\", GROUP=\"userdma\"\nKERNEL==\"b\", GROUP=\"userdma\"\n", "more than once"),
        ("ENV{.G}=\"userdma\"\nKERNEL==\"a\", GROUP=\"$env{.G}\"\nKERNEL==\"b\", GROUP=\"userdma\"\n", "one place"),
        ("KERNEL==\"a\", GROUP=\"$env{.G}\"\n", "no rule sets"),
        ("ENV{.G}=\"a\"\nENV{.G}=\"b\"\nKERNEL==\"a\", GROUP=\"$env{.G}\"\n", "more than once"),
        ("ENV{.G}=\"Bad Name\"\nKERNEL==\"a\", GROUP=\"$env{.G}\"\n", "group name"),
        ("ENV{.G}=\"g\"\nKERNEL==\"a\", GROUP=\"$env{.G}\", RUN+=\"/bin/chgrp other f\"\n", "one place"),
    ];
    for (src, expected) in cases {
        let found = problems(src);
        assert!(
            found.iter().any(|m| m.contains(expected)),
            "{src}: {found:?}"
        );
    }
}

#[test]
fn glob_and_alternatives_follow_udev() {
    for (pattern, value, expected) in [
        ("vfio", "vfio", true),
        ("vfio", "vfio-dev", false),
        ("vfio|vfio-dev", "vfio-dev", true),
        ("uio*", "uio12", true),
        ("uio?", "uio12", false),
        ("uio[0-9]", "uio7", true),
        ("uio[!0-9]", "uio7", false),
        ("uio[^a]", "uiob", true),
        ("[]]x", "]x", true),
        ("a\\*", "a*", true),
        ("a\\*", "ab", false),
        ("|x", "", true),
        ("*", "", true),
        ("[ab", "[ab", true),
    ] {
        assert_eq!(
            udev_match(pattern, value),
            expected,
            "{pattern:?} vs {value:?}"
        );
    }
}

#[test]
fn substitution_expands_env_and_escapes() {
    let env = BTreeMap::from([(".G".to_string(), "accel".to_string())]);
    assert_eq!(substitute("$env{.G}", &env), Ok("accel".to_string()));
    assert_eq!(
        substitute("x%E{.G}y$$%%", &env),
        Ok("xaccely$%".to_string())
    );
    assert_eq!(substitute("$env{missing}", &env), Ok(String::new()));
    assert!(substitute("%k", &env).is_err());
}

#[test]
fn replay_catches_missing_coverage_and_overreach() {
    let complete = "ACTION==\"remove\", GOTO=\"end\"\n\
                    SUBSYSTEM!=\"vfio|vfio-dev|misc|uio\", GOTO=\"end\"\n\
                    SUBSYSTEM==\"misc\", KERNEL!=\"iommu\", GOTO=\"end\"\n\
                    ENV{.G}=\"userdma\"\n\
                    SUBSYSTEM==\"vfio|vfio-dev|uio\", GROUP=\"$env{.G}\", MODE=\"0660\"\n\
                    KERNEL==\"iommu\", GROUP=\"$env{.G}\", MODE=\"0660\"\n\
                    LABEL=\"end\"\n";
    let check = |src: &str| coverage_problems(&[sample(src)], DEFAULT_GROUP);
    assert!(check(complete).is_empty(), "{:?}", check(complete));

    let without_uio =
        check(&complete.replace("vfio|vfio-dev|uio\", GROUP", "vfio|vfio-dev\", GROUP"));
    assert!(
        without_uio.iter().any(|m| m.contains("subsystem: \"uio\"")),
        "{without_uio:?}"
    );

    let touches_container = check(
        &complete
            .replace("KERNEL!=\"iommu\", GOTO", "KERNEL!=\"iommu|vfio\", GOTO")
            .replace("KERNEL==\"iommu\", GROUP", "KERNEL==\"iommu|vfio\", GROUP"),
    );
    assert!(
        touches_container
            .iter()
            .any(|m| m.contains("kernel: \"vfio\"")),
        "{touches_container:?}"
    );

    let wrong_mode = check(&complete.replace(
        "KERNEL==\"iommu\", GROUP=\"$env{.G}\", MODE=\"0660\"",
        "KERNEL==\"iommu\", GROUP=\"$env{.G}\", MODE=\"0600\"",
    ));
    assert!(
        wrong_mode.iter().any(|m| m.contains("iommu")),
        "{wrong_mode:?}"
    );

    let wrong_group = coverage_problems(&[sample(complete)], "accel");
    assert_eq!(wrong_group.len(), 2 * COVERED.len(), "{wrong_group:?}");

    let on_remove = check(&complete.replace("ACTION==\"remove\", GOTO=\"end\"\n", ""));
    assert!(
        on_remove.iter().any(|m| m.contains("remove")),
        "{on_remove:?}"
    );

    let undecidable = check(&complete.replace(
        "KERNEL==\"iommu\", GROUP",
        "ATTRS{x}==\"1\", KERNEL==\"iommu\", GROUP",
    ));
    assert!(
        undecidable.iter().any(|m| m.contains("cannot decide")),
        "{undecidable:?}"
    );

    let lost_label = check(&complete.replace("LABEL=\"end\"\n", ""));
    assert!(
        lost_label.iter().any(|m| m.contains("no LABEL")),
        "{lost_label:?}"
    );

    let final_wins = sample(
        "KERNEL==\"a\", GROUP:=\"first\", MODE:=\"0600\"\nKERNEL==\"a\", GROUP=\"second\", MODE=\"0666\"\n",
    );
    let outcome = replay(
        &[final_wins],
        Event {
            action: "add",
            subsystem: "x",
            kernel: "a",
        },
    );
    assert_eq!(
        outcome,
        Ok(Outcome {
            group: Some("first".to_string()),
            mode: Some("0600".to_string())
        })
    );
}
