//! The subset of Helm (Go text/template) that Tessera's chart uses, so `tessera manifests`
//! renders the chart's own templates and cannot drift from `helm install`.
//!
//! Supported: `{{ expr }}` with `{{-`/`-}}` whitespace trimming, `{{/* comments */}}`,
//! `if`/`else`/`end` (nestable), pipelines `a | f x`, operands `.Values.a.b`,
//! `.Release.Name`, `.Release.Namespace`, `.Chart.Name`, `.Chart.Version`,
//! `.Chart.AppVersion`, "strings" and integers, and the functions `quote`, `toYaml`,
//! `indent`, `nindent`, `default`, `not`, `eq`. Anything else is an error naming the file
//! and line, never a silent difference from Helm.
//!
//! Where this is stricter than Helm: printing a value that is not set, or a map or list
//! without `toYaml`, is an error (Helm prints an empty string or Go's `map[...]`).

use serde_yaml::Value;

/// A template that uses something outside the subset, or a value that cannot be printed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct TemplateError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// What templates can refer to.
#[derive(Debug, Clone)]
pub struct Context {
    pub values: Value,
    pub release_name: String,
    pub release_namespace: String,
    pub chart_name: String,
    pub chart_version: String,
    pub app_version: String,
}

/// One frame of `if` nesting.
struct Frame {
    /// The enclosing output is on.
    outer: bool,
    /// This branch's condition held.
    cond: bool,
    in_else: bool,
}

/// Renders `text` (the template `file`) with `ctx`.
pub fn render(file: &str, text: &str, ctx: &Context) -> Result<String, TemplateError> {
    let mut out = String::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut rest = text;
    let mut line = 1usize;
    let err = |line: usize, message: String| TemplateError {
        file: file.to_string(),
        line,
        message,
    };
    let mut trim_next = false;
    while !rest.is_empty() {
        let (literal, action) = match rest.find("{{") {
            Some(i) => (&rest[..i], true),
            None => (rest, false),
        };
        let on = stack
            .last()
            .is_none_or(|f| f.outer && (f.cond != f.in_else));
        let lit = if trim_next {
            literal.trim_start()
        } else {
            literal
        };
        if on {
            out.push_str(lit);
        }
        line += literal.matches('\n').count();
        rest = &rest[literal.len()..];
        if !action {
            break;
        }
        let close = rest
            .find("}}")
            .ok_or_else(|| err(line, "unclosed {{".into()))?;
        let raw = &rest[2..close];
        let action_line = line;
        line += raw.matches('\n').count();
        rest = &rest[close + 2..];

        let mut body = raw;
        if let Some(b) = body.strip_prefix('-') {
            if !b.starts_with(char::is_whitespace) {
                return Err(err(
                    action_line,
                    "write '{{- ' with a space after the dash".into(),
                ));
            }
            body = b;
            if on {
                let kept = out.trim_end().len();
                out.truncate(kept);
            }
        }
        trim_next = false;
        if let Some(b) = body.strip_suffix('-') {
            if !b.ends_with(char::is_whitespace) {
                return Err(err(
                    action_line,
                    "write ' -}}' with a space before the dash".into(),
                ));
            }
            body = b;
            trim_next = true;
        }
        let body = body.trim();
        if body.starts_with("/*") && body.ends_with("*/") {
            continue;
        }
        let words = tokenize(body).map_err(|m| err(action_line, m))?;
        match words.first().map(String::as_str) {
            Some("if") => {
                let cond = if on {
                    truthy(&eval(&words[1..], ctx).map_err(|m| err(action_line, m))?)
                } else {
                    false
                };
                stack.push(Frame {
                    outer: on,
                    cond,
                    in_else: false,
                });
            }
            Some("else") => {
                if words.len() != 1 {
                    return Err(err(
                        action_line,
                        "only a plain {{ else }} is supported".into(),
                    ));
                }
                match stack.last_mut() {
                    Some(f) if !f.in_else => f.in_else = true,
                    _ => return Err(err(action_line, "{{ else }} without {{ if }}".into())),
                }
            }
            Some("end") => {
                if stack.pop().is_none() {
                    return Err(err(action_line, "{{ end }} without {{ if }}".into()));
                }
            }
            Some(w @ ("range" | "with" | "define" | "template" | "include" | "block")) => {
                return Err(err(
                    action_line,
                    format!("{w:?} is outside the Helm subset this chart may use"),
                ));
            }
            Some(_) => {
                if on {
                    let v = eval(&words, ctx).map_err(|m| err(action_line, m))?;
                    out.push_str(&print(&v).map_err(|m| err(action_line, format!("{body}: {m}")))?);
                }
            }
            None => return Err(err(action_line, "empty action {{ }}".into())),
        }
    }
    if !stack.is_empty() {
        return Err(err(line, "{{ if }} without {{ end }}".into()));
    }
    Ok(out)
}

/// Splits an action into words: `|`, quoted strings (kept with their quotes), the rest.
fn tokenize(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '|' {
            chars.next();
            words.push("|".to_string());
        } else if c == '"' {
            let mut w = String::from('"');
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                w.push(c);
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        w.push(n);
                    }
                } else if c == '"' {
                    closed = true;
                    break;
                }
            }
            if !closed {
                return Err(format!("unterminated string in {s:?}"));
            }
            words.push(w);
        } else if c == '(' || c == ')' || c == '$' || c == '`' || c == ':' || c == '=' {
            return Err(format!(
                "{c:?} in {s:?}: variables, parentheses and raw strings are outside the Helm subset this chart may use"
            ));
        } else {
            let mut w = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() || c == '|' {
                    break;
                }
                w.push(c);
                chars.next();
            }
            words.push(w);
        }
    }
    Ok(words)
}

/// Evaluates a pipeline: commands separated by `|`, each `fn args...` or one operand; the
/// result of a command is the last argument of the next.
fn eval(words: &[String], ctx: &Context) -> Result<Value, String> {
    if words.is_empty() {
        return Err("missing expression".into());
    }
    let mut acc: Option<Value> = None;
    for cmd in words.split(|w| w == "|") {
        let (head, args) = cmd.split_first().ok_or("empty command in a pipeline")?;
        let mut vals = args
            .iter()
            .map(|a| operand(a, ctx))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(prev) = acc.take() {
            vals.push(prev);
        }
        acc = Some(if is_function(head) {
            call(head, vals)?
        } else {
            if !vals.is_empty() {
                return Err(format!("{head} is not a function and takes no arguments"));
            }
            operand(head, ctx)?
        });
    }
    acc.ok_or_else(|| "missing expression".into())
}

/// A bare word is a function name; `call` refuses the ones outside the subset.
fn is_function(w: &str) -> bool {
    w.chars().next().is_some_and(char::is_alphabetic)
}

fn operand(w: &str, ctx: &Context) -> Result<Value, String> {
    if let Some(path) = w.strip_prefix(".Values.") {
        let mut v = &ctx.values;
        for key in path.split('.') {
            match v.get(key) {
                Some(next) => v = next,
                None => return Ok(Value::Null),
            }
        }
        return Ok(v.clone());
    }
    let s = |x: &str| Ok(Value::String(x.to_string()));
    match w {
        ".Values" => Ok(ctx.values.clone()),
        ".Release.Name" => s(&ctx.release_name),
        ".Release.Namespace" => s(&ctx.release_namespace),
        ".Chart.Name" => s(&ctx.chart_name),
        ".Chart.Version" => s(&ctx.chart_version),
        ".Chart.AppVersion" => s(&ctx.app_version),
        _ if w.starts_with('"') => serde_json::from_str::<String>(w)
            .map(Value::String)
            .map_err(|e| format!("bad string {w}: {e}")),
        _ if w.parse::<i64>().is_ok() => Ok(Value::Number(w.parse::<i64>().unwrap_or(0).into())),
        _ => Err(format!(
            "{w:?} is outside the Helm subset this chart may use (.Values.*, .Release.Name, .Release.Namespace, .Chart.*)"
        )),
    }
}

fn call(f: &str, args: Vec<Value>) -> Result<Value, String> {
    let want = |n: usize| -> Result<(), String> {
        if args.len() == n {
            Ok(())
        } else {
            Err(format!("{f} takes {n} argument(s), got {}", args.len()))
        }
    };
    let int = |v: &Value| -> Result<usize, String> {
        v.as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("{f} wants a count, got {v:?}"))
    };
    let pad = |n: usize, s: &str| {
        let p = " ".repeat(n);
        format!("{p}{}", s.replace('\n', &format!("\n{p}")))
    };
    match f {
        "quote" => {
            want(1)?;
            let s = if args[0].is_null() {
                String::new()
            } else {
                print(&args[0])?
            };
            Ok(Value::String(quote_go(&s)))
        }
        "toYaml" => {
            want(1)?;
            let y = serde_yaml::to_string(&args[0]).map_err(|e| e.to_string())?;
            Ok(Value::String(y.trim_end_matches('\n').to_string()))
        }
        "indent" | "nindent" => {
            want(2)?;
            let s = pad(int(&args[0])?, &print(&args[1])?);
            Ok(Value::String(if f == "nindent" {
                format!("\n{s}")
            } else {
                s
            }))
        }
        "default" => {
            want(2)?;
            let mut it = args.into_iter();
            let (d, v) = (it.next(), it.next());
            Ok(match v {
                Some(v) if truthy(&v) => v,
                _ => d.unwrap_or(Value::Null),
            })
        }
        "not" => {
            want(1)?;
            Ok(Value::Bool(!truthy(&args[0])))
        }
        "eq" => {
            want(2)?;
            Ok(Value::Bool(args[0] == args[1]))
        }
        other => Err(format!(
            "function {other:?} is outside the Helm subset this chart may use (quote, toYaml, indent, nindent, default, not, eq)"
        )),
    }
}

/// Go's `%q` for the strings a chart holds: JSON escaping agrees with it for them.
fn quote_go(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// Go template truth: false, 0, nil and empty strings, maps and lists are false.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Sequence(s) => !s.is_empty(),
        Value::Mapping(m) => !m.is_empty(),
        Value::Tagged(t) => truthy(&t.value),
    }
}

/// How `{{ x }}` prints a scalar.
fn print(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Null => Err("the value is not set".into()),
        Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => {
            Err("a list or map must go through toYaml".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Context {
        let values: Value = serde_yaml::from_str(
            "a: {b: hello, n: 9400, t: true, f: false, empty: {}, list: [x, y], m: {k: v}}\n",
        )
        .expect("yaml");
        Context {
            values,
            release_name: "rel".into(),
            release_namespace: "ns".into(),
            chart_name: "tessera".into(),
            chart_version: "0.1.0".into(),
            app_version: "0.1.0".into(),
        }
    }

    fn r(t: &str) -> Result<String, TemplateError> {
        render("t.yaml", t, &ctx())
    }

    #[test]
    fn substitution_and_functions() {
        assert_eq!(r("x: {{ .Values.a.b }}").expect("ok"), "x: hello");
        assert_eq!(
            r("x: {{ .Values.a.n | quote }}").expect("ok"),
            "x: \"9400\""
        );
        assert_eq!(
            r("{{ .Release.Name }}-{{ .Release.Namespace }}").expect("ok"),
            "rel-ns"
        );
        assert_eq!(
            r("m:\n  {{- .Values.a.m | toYaml | nindent 2 }}\n").expect("ok"),
            "m:\n  k: v\n"
        );
        assert_eq!(
            r("l:{{ .Values.a.list | toYaml | indent 1 }}").expect("ok"),
            "l: - x\n - y"
        );
        assert_eq!(r("{{ .Values.a.none | default \"d\" }}").expect("ok"), "d");
        assert_eq!(r("{{ .Values.a.b | default \"d\" }}").expect("ok"), "hello");
        assert_eq!(r("{{ eq .Values.a.b \"hello\" }}").expect("ok"), "true");
    }

    #[test]
    fn trimming_follows_go() {
        assert_eq!(r("a  \n  {{- \"b\" -}}  \n  c").expect("ok"), "abc");
        assert_eq!(r("a\n{{ \"b\" }}\nc").expect("ok"), "a\nb\nc");
        assert_eq!(r("a\n{{/* note */}}\nc").expect("ok"), "a\n\nc");
        assert_eq!(r("a\n{{- /* note */}}\nc").expect("ok"), "a\nc");
    }

    #[test]
    fn conditionals() {
        let t = "x:\n{{- if .Values.a.t }}\n  yes\n{{- else }}\n  no\n{{- end }}\n";
        assert_eq!(r(t).expect("ok"), "x:\n  yes\n");
        let t = "x:\n{{- if .Values.a.empty }}\n  yes\n{{- else }}\n  no\n{{- end }}\n";
        assert_eq!(r(t).expect("ok"), "x:\n  no\n");
        let t = "{{ if not .Values.a.f }}A{{ if .Values.a.f }}B{{ end }}C{{ end }}";
        assert_eq!(r(t).expect("ok"), "AC");
        // A false branch is not evaluated, so what it would print cannot fail.
        assert_eq!(
            r("{{ if .Values.a.f }}{{ .Values.nope }}{{ end }}ok").expect("ok"),
            "ok"
        );
    }

    #[test]
    fn outside_the_subset_is_an_error_with_a_line() {
        let cases = [
            ("a\n{{ range .Values.a.list }}{{ end }}", 2, "\"range\""),
            ("{{ include \"x\" . }}", 1, "\"include\""),
            ("\n\n{{ $x := 1 }}", 3, "variables"),
            ("{{ .Capabilities.KubeVersion }}", 1, ".Capabilities"),
            ("{{ .Values.a.b | upper }}", 1, "\"upper\""),
            ("{{ .Values.a.m }}", 1, "toYaml"),
            ("{{ .Values.missing }}", 1, "not set"),
            ("{{ if .Values.a.t }}", 1, "without {{ end }}"),
            ("{{ end }}", 1, "without {{ if }}"),
            ("{{ .Values.a.b", 1, "unclosed"),
            ("{{-.Values.a.b }}", 1, "space after the dash"),
        ];
        for (t, line, needle) in cases {
            let e = r(t).expect_err(t);
            assert_eq!(e.line, line, "{t}: {e}");
            assert!(e.to_string().contains(needle), "{t}: {e}");
            assert!(e.to_string().starts_with(&format!("t.yaml:{line}:")), "{e}");
        }
    }
}
