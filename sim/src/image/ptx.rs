//! PTX text (what NVRTC and `nvcc -ptx` write, and what a fat binary's PTX entries hold),
//! read for its kernels and module-scope variables.
//!
//! A module starts with `.version`; kernels are `.entry <name>` definitions (with or
//! without `.visible`/`.weak`; `.extern .entry` is only a declaration); variables are
//! `.global` and `.const` declarations at module scope, with their size from type and
//! dimensions and their initialiser where it is made of numbers. Comments (`//`, `/* */`)
//! are skipped. Nothing is compiled.

use super::{Format, Global, Image, ImageError, Kernel};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Token<'a> {
    text: &'a str,
    line: usize,
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'%' | b'.')
}

/// Splits PTX into tokens: words (directives, names, numbers), strings and single
/// punctuation characters. Comments are dropped.
fn tokens(text: &str) -> Result<Vec<Token<'_>>, ImageError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let start = line;
            i += 2;
            loop {
                if i + 1 >= b.len() {
                    return Err(ImageError::Ptx {
                        line: start,
                        reason: "unterminated comment".into(),
                    });
                }
                if b[i] == b'*' && b[i + 1] == b'/' {
                    i += 2;
                    break;
                }
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
        } else if c == b'"' {
            let start = i;
            i += 1;
            while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                i += 1;
            }
            if i >= b.len() || b[i] != b'"' {
                return Err(ImageError::Ptx {
                    line,
                    reason: "unterminated string".into(),
                });
            }
            i += 1;
            out.push(Token {
                text: &text[start..i],
                line,
            });
        } else if ident_char(c) {
            let start = i;
            while i < b.len() && ident_char(b[i]) {
                i += 1;
            }
            out.push(Token {
                text: &text[start..i],
                line,
            });
        } else if c.is_ascii_punctuation() {
            out.push(Token {
                text: &text[i..i + 1],
                line,
            });
            i += 1;
        } else {
            return Err(ImageError::Ptx {
                line,
                reason: format!("unexpected byte {c:#04x}"),
            });
        }
    }
    Ok(out)
}

/// The first directive or word of a text (comments and whitespace skipped), if the text
/// is ASCII up to it. Used to tell PTX from other texts.
pub fn first_directive(bytes: &[u8]) -> Option<&str> {
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_whitespace() {
            i += 1;
        } else if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if bytes[i..].starts_with(b"/*") {
            i += 2;
            while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else {
            let end = bytes[i..]
                .iter()
                .position(|&c| !ident_char(c))
                .map_or(bytes.len(), |n| i + n);
            return std::str::from_utf8(&bytes[i..end]).ok();
        }
    }
    None
}

fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    match b.first() {
        Some(c) if c.is_ascii_alphabetic() => {}
        Some(b'_' | b'$' | b'%') if b.len() > 1 => {}
        _ => return false,
    }
    b.iter()
        .all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'$')
}

/// Bytes per element of a PTX fundamental type (`.b32`, `.f64`, `.pred`, ...).
fn type_size(t: &str) -> Option<u64> {
    let t = t.strip_prefix('.')?;
    if t == "pred" {
        return Some(4);
    }
    let bits: u64 = match t {
        "f16x2" | "bf16x2" => 32,
        "bf16" => 16,
        "e4m3x2" | "e5m2x2" => 16,
        _ => {
            let (kind, bits) = t.split_at(1);
            if !matches!(kind, "b" | "u" | "s" | "f") {
                return None;
            }
            bits.parse().ok()?
        }
    };
    matches!(bits, 8 | 16 | 32 | 64 | 128).then_some(bits / 8)
}

/// Encodes one initialiser value of an element `size` bytes wide, float or not.
fn encode(v: &str, negative: bool, size: u64, float: bool) -> Option<Vec<u8>> {
    let le = |bits: u64| bits.to_le_bytes()[..size as usize].to_vec();
    if let Some(hex) = v.strip_prefix("0f").or_else(|| v.strip_prefix("0F")) {
        let bits = u32::from_str_radix(hex, 16).ok()?;
        let f = f32::from_bits(bits);
        let f = if negative { -f } else { f };
        return Some(if size == 8 {
            le(f64::from(f).to_bits())
        } else {
            le(u64::from(f.to_bits()))
        });
    }
    if let Some(hex) = v.strip_prefix("0d").or_else(|| v.strip_prefix("0D")) {
        let f = f64::from_bits(u64::from_str_radix(hex, 16).ok()?);
        let f = if negative { -f } else { f };
        return Some(if size == 4 {
            le(u64::from((f as f32).to_bits()))
        } else {
            le(f.to_bits())
        });
    }
    if float || v.contains('.') {
        let f: f64 = v.parse().ok()?;
        let f = if negative { -f } else { f };
        return match size {
            4 => Some(le(u64::from((f as f32).to_bits()))),
            8 => Some(le(f.to_bits())),
            _ => None,
        };
    }
    let v = v.strip_suffix('U').unwrap_or(v);
    let n = if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()?
    } else if let Some(bn) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        u64::from_str_radix(bn, 2).ok()?
    } else if v.len() > 1 && v.starts_with('0') {
        u64::from_str_radix(&v[1..], 8).ok()?
    } else {
        v.parse().ok()?
    };
    Some(le(if negative { n.wrapping_neg() } else { n }))
}

/// A `.global`/`.const` declaration's name, size and initial bytes.
fn variable(stmt: &[Token<'_>]) -> Result<Global, ImageError> {
    let line = stmt.first().map_or(0, |t| t.line);
    let bad = |reason: &str| ImageError::Ptx {
        line,
        reason: reason.to_string(),
    };
    let mut i = 0;
    let mut elem = None;
    let mut vector = 1;
    let mut float = false;
    // Directives before the name: linkage, state space, alignment, vector and type.
    while let Some(t) = stmt.get(i) {
        if !t.text.starts_with('.') {
            break;
        }
        match t.text {
            ".align" => i += 1,
            ".v2" => vector = 2,
            ".v4" => vector = 4,
            ".v8" => vector = 8,
            ty => {
                if let Some(s) = type_size(ty) {
                    elem = Some(s);
                    float = ty.starts_with(".f") || ty.starts_with(".bf");
                }
            }
        }
        i += 1;
    }
    let elem = elem.ok_or_else(|| bad("variable without a type"))? * vector;
    let name = stmt
        .get(i)
        .ok_or_else(|| bad("variable without a name"))?
        .text;
    if !valid_name(name) {
        return Err(bad(&format!("bad variable name {name:?}")));
    }
    i += 1;
    let mut count: Option<u64> = Some(1);
    let mut open_dim = false;
    while stmt.get(i).map(|t| t.text) == Some("[") {
        match (
            stmt.get(i + 1).map(|t| t.text),
            stmt.get(i + 2).map(|t| t.text),
        ) {
            (Some("]"), _) => {
                open_dim = true;
                i += 2;
            }
            (Some(n), Some("]")) => {
                let n: u64 = n
                    .parse()
                    .map_err(|_| bad(&format!("bad array size {n:?}")))?;
                count = count.and_then(|c| c.checked_mul(n));
                i += 3;
            }
            _ => return Err(bad("unterminated array size")),
        }
    }
    let mut init = Vec::new();
    let mut values = 0u64;
    if stmt.get(i).map(|t| t.text) == Some("=") {
        let mut negative = false;
        let mut ok = true;
        for t in &stmt[i + 1..] {
            match t.text {
                "{" | "}" | "," => {}
                "-" => negative = true,
                v => {
                    values += 1;
                    match encode(v, negative, elem, float) {
                        Some(bytes) if ok => init.extend(bytes),
                        // An address (`generic(x)`, `x+4`) or an unknown literal: the rest
                        // of the variable stays zero.
                        _ => ok = false,
                    }
                    negative = false;
                }
            }
        }
    }
    let mut size = count
        .and_then(|c| c.checked_mul(elem))
        .ok_or_else(|| bad("variable too large"))?;
    if open_dim {
        size = values.max(1).saturating_mul(elem);
    }
    if size > super::MAX_IMAGE {
        return Err(bad("variable too large"));
    }
    init.truncate(size as usize);
    Ok(Global {
        name: name.to_string(),
        size,
        init,
    })
}

/// Offsets and sizes of an entry's parameters, from the tokens after its name:
/// `( .param [.align N] .type name[[N]], ... )`, each aligned to its `.align` or its
/// element size, as the parameter buffer is laid out.
fn params(toks: &[Token<'_>]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    if toks.first().map(|t| t.text) != Some("(") {
        return out;
    }
    let end = toks
        .iter()
        .position(|t| t.text == ")")
        .unwrap_or(toks.len());
    let mut offset = 0u64;
    for decl in toks[1..end].split(|t| t.text == ",") {
        let mut align = None;
        let mut elem = None;
        let mut count = 1u64;
        let mut i = 0;
        while i < decl.len() {
            match decl[i].text {
                ".align" => {
                    align = decl.get(i + 1).and_then(|t| t.text.parse::<u64>().ok());
                    i += 1;
                }
                "[" => {
                    if let Some(n) = decl.get(i + 1).and_then(|t| t.text.parse::<u64>().ok()) {
                        count = count.saturating_mul(n);
                    }
                }
                t => {
                    if let Some(sz) = type_size(t) {
                        elem = Some(sz);
                    }
                }
            }
            i += 1;
        }
        let Some(elem) = elem else { continue };
        let align = align.unwrap_or(elem).max(1);
        offset = offset.div_ceil(align) * align;
        let size = elem.saturating_mul(count);
        out.push((
            offset.min(u64::from(u32::MAX)) as u32,
            size.min(u64::from(u32::MAX)) as u32,
        ));
        offset = offset.saturating_add(size);
    }
    out
}

/// Module directives that end with their line instead of `;`.
const LINE_DIRECTIVES: [&str; 4] = [".version", ".target", ".address_size", ".file"];

fn stmt_is_line(t: &Token<'_>) -> bool {
    LINE_DIRECTIVES.contains(&t.text)
}

/// Parses PTX text (without a trailing NUL).
pub fn parse(bytes: &[u8]) -> Result<Image, ImageError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ImageError::Ptx {
        line: bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&c| c == b'\n')
            .count()
            + 1,
        reason: "not UTF-8".into(),
    })?;
    let toks = tokens(text)?;
    let mut image = Image {
        format: Format::Ptx,
        arch: None,
        kernels: Vec::new(),
        globals: Vec::new(),
    };
    let mut i = 0;
    let mut first = true;
    while i < toks.len() {
        let start = i;
        let line = toks[i].line;
        if toks[i].text == "}" {
            return Err(ImageError::Ptx {
                line,
                reason: "`}` without a block".into(),
            });
        }
        // A statement runs to `;`, or to `{` when that opens a body; braces after `=` are
        // an initialiser. The module directives without `;` end with their line.
        let mut assigned = false;
        let mut nest = 0usize;
        let mut body = false;
        let by_line = stmt_is_line(&toks[start]);
        if by_line {
            // `i` ends on the statement's last token, as it ends on a `;` otherwise.
            while toks.get(i + 1).is_some_and(|t| t.line == line) {
                i += 1;
            }
        } else {
            while i < toks.len() {
                match toks[i].text {
                    "=" => assigned = true,
                    "{" if !assigned => {
                        body = true;
                        break;
                    }
                    "{" => nest += 1,
                    "}" if nest > 0 => nest -= 1,
                    ";" if nest == 0 => break,
                    _ => {}
                }
                i += 1;
            }
            if i == toks.len() {
                return Err(ImageError::Ptx {
                    line,
                    reason: "statement without `;` or body at the end of the text".into(),
                });
            }
        }
        let stmt = if by_line {
            &toks[start..=i]
        } else {
            &toks[start..i]
        };
        if first {
            if stmt.first().map(|t| t.text) != Some(".version") {
                return Err(ImageError::Ptx {
                    line,
                    reason: "PTX must start with .version".into(),
                });
            }
            first = false;
        }
        let has = |d: &str| stmt.iter().any(|t| t.text == d);
        if let Some(p) = stmt.iter().position(|t| t.text == ".entry") {
            let name = stmt.get(p + 1).map(|t| t.text).unwrap_or("");
            if !valid_name(name) {
                return Err(ImageError::Ptx {
                    line,
                    reason: format!(".entry needs a name, found {name:?}"),
                });
            }
            if body && !has(".extern") && image.kernel(name).is_none() {
                let mut k = Kernel::named(name);
                if let Some(m) = stmt
                    .iter()
                    .position(|t| t.text == ".maxntid" || t.text == ".reqntid")
                {
                    let dims: Vec<u32> = stmt[m + 1..]
                        .iter()
                        .take(5)
                        .filter(|t| t.text != ",")
                        .map_while(|t| t.text.parse().ok())
                        .collect();
                    k.max_threads = dims
                        .iter()
                        .try_fold(1u32, |a, d| a.checked_mul(*d))
                        .filter(|_| !dims.is_empty());
                }
                k.params = Some(params(&stmt[p + 2..]));
                image.kernels.push(k);
            }
        } else if stmt.first().map(|t| t.text) == Some(".target") {
            image.arch = stmt.get(1).and_then(|t| {
                let digits: String = t
                    .text
                    .trim_start_matches("sm_")
                    .trim_start_matches("compute_")
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                digits.parse().ok()
            });
        } else if !body && !has(".extern") && (has(".global") || has(".const")) && !has(".func") {
            let g = variable(stmt)?;
            if image.global(&g.name).is_none() {
                image.globals.push(g);
            }
        }
        if body {
            // Skip the body, braces balanced.
            let mut depth = 0usize;
            loop {
                match toks.get(i).map(|t| t.text) {
                    Some("{") => depth += 1,
                    Some("}") => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Some(_) => {}
                    None => {
                        return Err(ImageError::Ptx {
                            line,
                            reason: "unbalanced braces: a body is not closed".into(),
                        });
                    }
                }
                i += 1;
            }
        }
        i += 1;
    }
    if first {
        return Err(ImageError::Ptx {
            line: 1,
            reason: "empty PTX".into(),
        });
    }
    Ok(image)
}
