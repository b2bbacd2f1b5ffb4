//! Frame name clean-up, the way the users' awk scripts do it: demangled C++ without argument lists, return
//! types, `const` qualifiers, GCC clone suffixes (`[clone .cold]`, `.isra.0`, `.constprop.0`, `.part.0`) and
//! never a `;` (it separates frames in folded stacks).

/// Phrases that cpp_demangle puts in front of a special name; kept, the rest is cleaned as a function name.
const SPECIAL_PREFIXES: &[&str] = &[
    "non-virtual thunk to ",
    "virtual thunk to ",
    "covariant return thunk to ",
    "transaction clone for ",
    "construction vtable for ",
    "vtable for ",
    "typeinfo name for ",
    "typeinfo for ",
    "VTT for ",
    "guard variable for ",
];

/// Operator spellings after `operator`, longest first so that `<<=` wins over `<<` and `<`.
const OPERATORS: &[&str] = &[
    "->*", "<=>", "<<=", ">>=", "()", "[]", "->", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||",
    "++", "--", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<", ">", "+", "-", "*", "/", "%",
    "&", "|", "^", "!", "~", "=", ",",
];

/// GCC/LLVM suffixes of local clones of a function (`foo.isra.0`, `foo.cold`, `foo.constprop.0.isra.0`).
const CLONE_SUFFIXES: &[&str] = &[
    "isra",
    "constprop",
    "part",
    "cold",
    "lto_priv",
    "llvm",
    "localalias",
    "clone",
];

/// Cleans a (demangled) symbol name. Returns `None` when nothing usable is left.
pub fn clean_name(raw: &str) -> Option<String> {
    let mut s = raw.trim();
    let mut prefix = String::new();
    // cpp_demangle spells thunks `{virtual override thunk({offset(-168)}, X::~X())}`; c++filt (and so gdb,
    // perf and the users' scripts) `non-virtual thunk to X::~X()`.
    if let Some(inner) = s
        .strip_prefix("{virtual override thunk(")
        .and_then(|r| r.strip_suffix(")}"))
    {
        let mut rest = inner;
        let mut offsets = Vec::new();
        while rest.starts_with('{') {
            let Some(close) = rest.find('}') else { break };
            offsets.push(&rest[..=close]);
            rest = rest[close + 1..].trim_start_matches(", ");
        }
        if let Some(first) = offsets.first() {
            prefix.push_str(if offsets.len() > 1 {
                "covariant return thunk to "
            } else if first.starts_with("{virtual offset") {
                "virtual thunk to "
            } else {
                "non-virtual thunk to "
            });
            s = rest;
        }
    }
    'outer: loop {
        for p in SPECIAL_PREFIXES {
            if let Some(rest) = s.strip_prefix(p) {
                prefix.push_str(p);
                s = rest;
                continue 'outer;
            }
        }
        break;
    }
    // glibc's internal aliases (`__GI___poll`, `__GI___libc_malloc`) name the same function as the public one.
    if let Some(rest) = s.strip_prefix("__GI_").or_else(|| s.strip_prefix("__EI_")) {
        if rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            s = rest;
        }
    }
    let body = clean_function(s);
    if body.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(prefix.len() + body.len());
    out.push_str(&prefix);
    out.push_str(&body);
    let out: String = out
        .chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_control() => '?',
            c => c,
        })
        .collect();
    Some(out)
}

fn clean_function(name: &str) -> String {
    let mut s = name.trim();
    // Trailing decorations after the argument list, in any order: `[clone .cold]`, `const`, `&`, ...
    loop {
        let before = s.len();
        if s.ends_with(']') {
            if let Some(i) = s.rfind(" [clone ") {
                s = s[..i].trim_end();
            }
        }
        for q in [" const", " volatile", " &&", " &", " noexcept", " throw()"] {
            if let Some(rest) = s.strip_suffix(q) {
                if rest.ends_with(')')
                    || rest.ends_with(']')
                    || rest.ends_with('&')
                    || rest.ends_with("const")
                {
                    s = rest.trim_end();
                }
            }
        }
        if s.len() == before {
            break;
        }
    }
    // The argument list: the balanced `( ... )` at the very end.
    if s.ends_with(')') {
        if let Some(open) = matching_open_paren(s) {
            if open > 0 && !is_operator_call_parens(s, open) {
                s = s[..open].trim_end();
            }
        }
    }
    // A return type (printed for function templates): everything up to the last space at nesting depth 0.
    if let Some(sp) = last_top_level_space(s) {
        let rest = &s[sp + 1..];
        if !rest.is_empty() {
            s = rest;
        }
    }
    strip_clone_suffixes(s).to_string()
}

/// Index of the `(` matching the `)` that ends `s`, skipping parentheses in quoted strings (gdb's argument
/// values).
pub(crate) fn matching_open_paren(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut depth = 0usize;
    let mut in_string = false;
    for i in (0..bytes.len()).rev() {
        let escaped = i > 0 && bytes[i - 1] == b'\\';
        match bytes[i] {
            b'"' if !escaped => in_string = !in_string,
            _ if in_string => {}
            b')' => depth += 1,
            b'(' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// True when the `()` at `open` is the name of `operator()` itself (and there is no argument list after it).
fn is_operator_call_parens(s: &str, open: usize) -> bool {
    s[..open].ends_with("operator") && &s[open..] == "()"
}

/// Position of the last space that is not nested in `<>`, `()`, `[]`, `{}` nor part of an operator name.
fn last_top_level_space(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut depth: i32 = 0;
    let mut last = None;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(len) = operator_token_len(s, i) {
            i += len;
            continue;
        }
        match bytes[i] {
            b'<' | b'(' | b'[' | b'{' => depth += 1,
            b'>' | b')' | b']' | b'}' => depth -= 1,
            b' ' if depth == 0 => last = Some(i),
            _ => {}
        }
        i += 1;
    }
    last
}

/// If an `operator...` name starts at `i`, its length (so that `<`, `()`, the words of `operator new` or of a
/// conversion operator are not taken for nesting or for the space before a return type).
fn operator_token_len(s: &str, i: usize) -> Option<usize> {
    // `i` walks bytes: inside a character of a non-ASCII name, no operator starts.
    let rest = s.get(i..)?;
    let after = rest.strip_prefix("operator")?;
    // Must be a whole word: not `my_operator` nor `operators`.
    if i > 0 {
        let prev = s.as_bytes()[i - 1];
        if prev.is_ascii_alphanumeric() || prev == b'_' {
            return None;
        }
    }
    let mut len = "operator".len();
    let trimmed = after.trim_start_matches(' ');
    let spaces = after.len() - trimmed.len();
    if let Some(op) = OPERATORS.iter().find(|op| trimmed.starts_with(**op)) {
        len += spaces + op.len();
        // `operator< <int>`: the space that keeps `<` apart from the template arguments belongs to the name.
        if s[i + len..].starts_with(" <") {
            len += 1;
        }
        return Some(len);
    }
    if trimmed.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        // `operator new`, `operator delete[]`, `operator bool`, `operator unsigned long`: up to the argument
        // list or template arguments.
        len += spaces;
        let word_end = trimmed.find(['(', '<']).unwrap_or(trimmed.len());
        return Some(len + word_end);
    }
    if trimmed.starts_with("\"\"") {
        return Some(len + spaces + 2);
    }
    None
}

/// `foo.isra.0` → `foo`, `foo.constprop.0.cold` → `foo`; leaves other dots alone.
fn strip_clone_suffixes(mut s: &str) -> &str {
    loop {
        let Some(dot) = s.rfind('.') else { return s };
        if dot == 0 {
            return s;
        }
        let tail = &s[dot + 1..];
        let head = &s[..dot];
        if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) {
            // A number: only a clone suffix when it follows one of the keywords.
            let Some(dot2) = head.rfind('.') else {
                return s;
            };
            if dot2 == 0 || !CLONE_SUFFIXES.contains(&&head[dot2 + 1..]) {
                return s;
            }
            s = &head[..dot2];
        } else if CLONE_SUFFIXES.contains(&tail) {
            s = head;
        } else {
            return s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::clean_name;

    fn c(s: &str) -> String {
        clean_name(s).unwrap()
    }

    #[test]
    fn argument_lists_and_qualifiers() {
        assert_eq!(
            c("dispatch_command(enum_server_command, THD*, char*, unsigned int, bool)"),
            "dispatch_command"
        );
        assert_eq!(c("do_command(THD*, bool)"), "do_command");
        assert_eq!(c("Item_func_sleep::val_int()"), "Item_func_sleep::val_int");
        assert_eq!(
            c("handler::ha_index_next(unsigned char*) const"),
            "handler::ha_index_next"
        );
        assert_eq!(c("Foo::bar() const &"), "Foo::bar");
        assert_eq!(c("vio_socket_io_wait"), "vio_socket_io_wait");
        assert_eq!(
            c("std::thread::_State_impl<std::thread::_Invoker<std::tuple<void (tpool::thread_pool_generic::*)(tpool::worker_data*), tpool::thread_pool_generic*, tpool::worker_data*> > >::_M_run()"),
            "std::thread::_State_impl<std::thread::_Invoker<std::tuple<void (tpool::thread_pool_generic::*)(tpool::worker_data*), tpool::thread_pool_generic*, tpool::worker_data*> > >::_M_run"
        );
    }

    #[test]
    fn clones() {
        assert_eq!(c("mtr_t::commit() [clone .cold]"), "mtr_t::commit");
        assert_eq!(c("foo(int) [clone .isra.0] [clone .cold]"), "foo");
        assert_eq!(c("my_hash_sort_bin.isra.0"), "my_hash_sort_bin");
        assert_eq!(c("row_search_mvcc.constprop.0"), "row_search_mvcc");
        assert_eq!(c("lf_pinbox_real_free.part.0"), "lf_pinbox_real_free");
        assert_eq!(c("__schedule.cold"), "__schedule");
        assert_eq!(c("x.constprop.0.isra.0"), "x");
        assert_eq!(c("foo.lto_priv.0"), "foo");
        // Not clone suffixes.
        assert_eq!(c("libc.so.6+0x1234"), "libc.so.6+0x1234");
        assert_eq!(c("a.b"), "a.b");
    }

    #[test]
    fn return_types_templates_operators() {
        assert_eq!(c("void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)"),
            "std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>");
        assert_eq!(c("Foo::operator()(int) const"), "Foo::operator()");
        assert_eq!(c("Foo::operator()()"), "Foo::operator()");
        assert_eq!(c("operator new(unsigned long)"), "operator new");
        assert_eq!(c("operator delete[](void*)"), "operator delete[]");
        assert_eq!(
            c("String::operator<(String const&) const"),
            "String::operator<"
        );
        assert_eq!(
            c("bool operator< <int>(A<int> const&, A<int> const&)"),
            "operator< <int>"
        );
        assert_eq!(
            c("Foo::operator unsigned long() const"),
            "Foo::operator unsigned long"
        );
        assert_eq!(
            c("(anonymous namespace)::helper(int)"),
            "(anonymous namespace)::helper"
        );
        assert_eq!(
            c("f()::{lambda(int)#1}::operator()(int) const"),
            "f()::{lambda(int)#1}::operator()"
        );
        assert_eq!(c("std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >::_M_create[abi:cxx11](unsigned long&, unsigned long)"),
            "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >::_M_create[abi:cxx11]");
        assert_eq!(
            c("non-virtual thunk to ha_innobase::info(unsigned int)"),
            "non-virtual thunk to ha_innobase::info"
        );
        assert_eq!(
            c("{virtual override thunk({offset(-168)}, Item_func_history::~Item_func_history())}"),
            "non-virtual thunk to Item_func_history::~Item_func_history"
        );
        assert_eq!(
            c("{virtual override thunk({virtual offset(0, -24)}, std::basic_ostream<char, std::char_traits<char> >::~basic_ostream())}"),
            "virtual thunk to std::basic_ostream<char, std::char_traits<char> >::~basic_ostream"
        );
    }

    #[test]
    fn separators_and_empty() {
        assert_eq!(c("a;b"), "a:b");
        assert_eq!(clean_name("   "), None);
        assert_eq!(clean_name(""), None);
        assert_eq!(c("__GI___poll"), "__poll");
        assert_eq!(c("__GI___libc_malloc"), "__libc_malloc");
    }
}
