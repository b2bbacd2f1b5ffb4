//! The shape of src/ that ARCHITECTURE.md states, held against the code: each module imports only modules on
//! layers below its own (the table under "## Layers"), the files of one module import each other without a cycle,
//! no module outside `server/` asks which server it is, and no function of src/ or tests/ is longer than
//! `MAX_FUNCTION_LINES`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use syn::visit::Visit;

const MAX_FUNCTION_LINES: usize = 120;

/// The modules of each layer, from ARCHITECTURE.md's table: `| 3 | collect, client |`.
fn layers() -> BTreeMap<String, u32> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .expect("reading ARCHITECTURE.md");
    let section = text
        .split("\n## Layers\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a section `## Layers`");
    let section = section.split("\n## ").next().unwrap();
    let mut layer_of = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, layer, modules, ..] = cells[..] else {
            continue;
        };
        let Ok(layer) = layer.parse::<u32>() else {
            continue;
        };
        for module in modules.split(',') {
            let module = module.trim().trim_matches('`').trim_end_matches('/');
            assert!(
                layer_of.insert(module.to_string(), layer).is_none(),
                "{module} stands on two layers in ARCHITECTURE.md"
            );
        }
    }
    assert!(!layer_of.is_empty(), "no layers read from ARCHITECTURE.md");
    layer_of
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// One file of src/ (or tests/), parsed.
struct Source {
    /// Its module's path in the crate: `src/stacks/text/gdb.rs` → `[stacks, text, gdb]`, `src/collect/mod.rs` →
    /// `[collect]`.
    module: Vec<String>,
    /// From the crate's root: `src/collect/ring.rs`.
    path: PathBuf,
    file: syn::File,
}

impl Source {
    /// The top module: `collect` for `src/collect/ring.rs`.
    fn top(&self) -> &str {
        &self.module[0]
    }
}

fn parse(root: &Path, path: &Path) -> (PathBuf, syn::File) {
    let relative = path.strip_prefix(root).unwrap().to_owned();
    let text = std::fs::read_to_string(path).unwrap();
    let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", relative.display()));
    (relative, file)
}

/// `stacks/text/gdb.rs` → `[stacks, text, gdb]`; `collect/mod.rs` → `[collect]`.
fn module_path(relative_to_src: &Path) -> Vec<String> {
    let mut names: Vec<String> = relative_to_src
        .iter()
        .map(|part| part.to_str().unwrap().trim_end_matches(".rs").to_string())
        .collect();
    if names.last().is_some_and(|last| last == "mod") {
        names.pop();
    }
    names
}

/// Every file of src/ but the crate's roots.
fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|path| {
            let module = module_path(path.strip_prefix(&src).unwrap());
            if module == ["lib"] || module == ["main"] {
                return None;
            }
            let (path, file) = parse(root, &path);
            Some(Source { module, path, file })
        })
        .collect()
}

/// Every Rust file of tests/: the integration tests, their helpers, the property tests, this file.
fn test_files() -> Vec<(PathBuf, syn::File)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("tests"), &mut files);
    files.sort();
    files.iter().map(|path| parse(root, path)).collect()
}

/// The modules that are files or folders of src/, by path: `[collect]`, `[collect, ring]`, …
fn file_modules(sources: &[Source]) -> BTreeSet<Vec<String>> {
    sources.iter().map(|s| s.module.clone()).collect()
}

/// What one file refers to in the crate (`crate::x…`, `super::x…`, `self::x…`, a child module's `x::…`, in code and
/// in macros' tokens), asks of a flavor, and its long functions.
struct Reading<'m> {
    /// The modules that are files, to tell a child module's `x::y` from an outside crate's.
    file_modules: &'m BTreeSet<Vec<String>>,
    /// The module being read: the file's, then each inline `mod` inside it.
    current: Vec<String>,
    /// Paths from the crate's root, as far as they were written: `[collect, ring, poll]`.
    targets: BTreeSet<Vec<String>>,
    /// The same, outside the code compiled for tests only.
    code_targets: BTreeSet<Vec<String>>,
    /// Files declared for tests only (`#[cfg(test)] mod test_support;`), by module path.
    test_modules: BTreeSet<Vec<String>>,
    /// How deep inside items compiled for tests only the reading is.
    in_test: usize,
    /// What the file's `pub use` items pass on (name, path from the crate's root): an arrow only where the file's
    /// own code names it too.
    reexports: Vec<(String, Vec<String>)>,
    /// The names that the file's code (not its `use` items, nor its tests) writes in paths and macros.
    names_used: BTreeSet<String>,
    /// (line, what was asked).
    flavor_checks: BTreeSet<(usize, String)>,
    /// (name, first line, lines).
    long_functions: BTreeSet<(String, usize, usize)>,
}

/// `a::b::{c, d::*, e as f}` → (`c`, `[a, b, c]`), (`*`, `[a, b, d]`), (`f`, `[a, b, e]`): each name a `use` brings in,
/// and the path it stands for.
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    let mut with = |written: &syn::Ident, name: &syn::Ident| {
        let mut path = prefix.clone();
        if written == "self" {
            let name = path.last().cloned().unwrap_or_default();
            out.push((name, path));
        } else {
            path.push(written.to_string());
            out.push((name.to_string(), path));
        }
    };
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => with(&n.ident, &n.ident),
        syn::UseTree::Rename(r) => with(&r.ident, &r.rename),
        syn::UseTree::Glob(_) => out.push(("*".into(), prefix.clone())),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_paths(t, prefix, out)),
    }
}

/// Whether an item is compiled for tests only (`#[cfg(test)]`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string() == "test")
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

impl<'m> Reading<'m> {
    fn new(file_modules: &'m BTreeSet<Vec<String>>, module: &[String]) -> Self {
        Reading {
            file_modules,
            current: module.to_vec(),
            targets: BTreeSet::new(),
            code_targets: BTreeSet::new(),
            test_modules: BTreeSet::new(),
            in_test: 0,
            reexports: Vec::new(),
            names_used: BTreeSet::new(),
            flavor_checks: BTreeSet::new(),
            long_functions: BTreeSet::new(),
        }
    }

    /// The top modules of the crate this file imports.
    fn imports(&self) -> BTreeSet<String> {
        self.targets.iter().map(|t| t[0].clone()).collect()
    }

    /// `path` as written in the current module, from the crate's root; None for another crate's or a local name.
    /// `in_use`: a `use` item's, where one segment can name a module.
    fn resolve(&self, path: &[String], in_use: bool) -> Option<Vec<String>> {
        let (first, rest) = path.split_first()?;
        let mut resolved = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.current.clone(),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                let kept = self.current.len().checked_sub(ups)?;
                let mut resolved = self.current[..kept].to_vec();
                resolved.extend(path[ups..].iter().cloned());
                return (!resolved.is_empty()).then_some(resolved);
            }
            _ => {
                let mut child = self.current.clone();
                child.push(first.clone());
                if !(in_use || path.len() > 1) || !self.file_modules.contains(&child) {
                    return None;
                }
                child
            }
        };
        resolved.extend(rest.iter().cloned());
        (!resolved.is_empty()).then_some(resolved)
    }

    /// A path written in the code or in a macro's tokens: where it leads, and whether it names a flavor.
    fn path(&mut self, names: &[String], line: usize, in_use: bool) {
        if !in_use && self.in_test == 0 {
            self.names_used.extend(names.iter().cloned());
        }
        if let Some(target) = self.resolve(names, in_use) {
            if self.in_test == 0 {
                self.code_targets.insert(target.clone());
            }
            self.targets.insert(target);
        }
        for pair in names.windows(2) {
            if pair[0] == "Flavor" && FLAVORS.contains(&pair[1].as_str()) {
                self.flavor_checks.insert((line, pair.join("::")));
            }
        }
    }

    /// A macro's tokens, which syn leaves unparsed: the paths in them (`crate::x::y`, `Flavor::MariaDb`), and the
    /// functions defined in them (`proptest! { fn … }`).
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "fn" => self.function_in_tokens(&trees[i..]),
                TokenTree::Ident(first) if !follows_path_separator(&trees[..i]) => {
                    let mut names = vec![first.to_string()];
                    while let [TokenTree::Punct(a), TokenTree::Punct(b), TokenTree::Ident(next), ..] =
                        &trees[i + 1..]
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        names.push(next.to_string());
                        i += 3;
                    }
                    self.path(&names, first.span().start().line, false);
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// `fn name(…) … { … }` in a macro's tokens.
    fn function_in_tokens(&mut self, from_fn: &[proc_macro2::TokenTree]) {
        use proc_macro2::{Delimiter, TokenTree};
        let Some(TokenTree::Ident(name)) = from_fn.get(1) else {
            return;
        };
        let body = from_fn[2..].iter().find_map(|tree| match tree {
            TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => Some(g.span()),
            _ => None,
        });
        if let Some(body) = body {
            self.function(name, from_fn[0].span().start().line, body.end().line);
        }
    }

    fn function(&mut self, name: &syn::Ident, start: usize, end: usize) {
        if end + 1 - start > MAX_FUNCTION_LINES {
            self.long_functions
                .insert((name.to_string(), start, end + 1 - start));
        }
    }

    fn spanned_function(&mut self, name: &syn::Ident, item: &dyn syn::spanned::Spanned) {
        let span = item.span();
        self.function(name, span.start().line, span.end().line);
    }

    /// What a macro's arguments compare, where they parse as expressions (`assert_eq!`, `matches!`'s patterns).
    fn macro_arguments(&mut self, m: &syn::Macro) {
        use syn::parse::Parser;
        let is_matches = m.path.segments.last().is_some_and(|s| s.ident == "matches");
        if is_matches {
            if let Ok((expr, pat)) = m.parse_body_with(matches_arguments) {
                self.visit_expr(&expr);
                self.visit_pat(&pat);
            }
        } else if let Ok(args) =
            syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated
                .parse2(m.tokens.clone())
        {
            args.iter().for_each(|arg| self.visit_expr(arg));
        }
    }
}

/// `matches!(expr, pattern if guard)`'s expression and pattern.
fn matches_arguments(input: syn::parse::ParseStream) -> syn::Result<(syn::Expr, syn::Pat)> {
    let expr: syn::Expr = input.parse()?;
    input.parse::<syn::Token![,]>()?;
    let pat = syn::Pat::parse_multi_with_leading_vert(input)?;
    let _guard: proc_macro2::TokenStream = input.parse()?;
    Ok((expr, pat))
}

/// Whether the tokens just before are a path's `::` (so an identifier there continues a path, not starts one).
fn follows_path_separator(before: &[proc_macro2::TokenTree]) -> bool {
    matches!(before, [.., proc_macro2::TokenTree::Punct(a), proc_macro2::TokenTree::Punct(b)]
        if a.as_char() == ':' && b.as_char() == ':')
}

const FLAVORS: [&str; 4] = ["MariaDb", "MySql", "Percona", "Other"];
/// A server's name, as a string compared or matched asks which server it is.
const SERVER_NAMES: [&str; 4] = ["mariadb", "mysql", "percona", "percona server"];

fn names_a_server_lit(lit: &syn::Lit) -> bool {
    let text = match lit {
        syn::Lit::Str(s) => s.value(),
        syn::Lit::ByteStr(b) => String::from_utf8_lossy(&b.value()).into_owned(),
        _ => return false,
    };
    SERVER_NAMES.contains(&text.to_lowercase().as_str())
}

fn names_a_server(expr: &syn::Expr) -> bool {
    matches!(expr, syn::Expr::Lit(syn::ExprLit { lit, .. }) if names_a_server_lit(lit))
}

fn line_of(node: &dyn syn::spanned::Spanned) -> usize {
    node.span().start().line
}

impl<'ast> Visit<'ast> for Reading<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut paths);
        let passes_on = !matches!(u.vis, syn::Visibility::Inherited) && self.in_test == 0;
        for (name, path) in paths {
            match self.resolve(&path, true) {
                Some(target) if passes_on && name != "*" => {
                    self.targets.insert(target.clone());
                    self.reexports.push((name, target));
                }
                _ => self.path(&path, line_of(u), true),
            }
        }
    }

    /// `pub(super)` and `pub(in crate::x)` say who may see an item, not what it needs.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_item(&mut self, item: &'ast syn::Item) {
        let test_only = is_test_only(item_attrs(item));
        self.in_test += usize::from(test_only);
        syn::visit::visit_item(self, item);
        self.in_test -= usize::from(test_only);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.current.push(m.ident.to_string());
        if m.content.is_none() && self.in_test > 0 {
            self.test_modules.insert(self.current.clone());
        }
        syn::visit::visit_item_mod(self, m);
        self.current.pop();
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let names: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.path(&names, line_of(p), false);
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        self.macro_arguments(m);
        syn::visit::visit_macro(self, m);
    }

    fn visit_expr_binary(&mut self, b: &'ast syn::ExprBinary) {
        let compares = matches!(b.op, syn::BinOp::Eq(_) | syn::BinOp::Ne(_));
        if compares && (names_a_server(&b.left) || names_a_server(&b.right)) {
            self.flavor_checks
                .insert((line_of(b), "a comparison with a server's name".into()));
        }
        syn::visit::visit_expr_binary(self, b);
    }

    fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
        let asks =
            ["contains", "starts_with", "ends_with", "eq"].contains(&c.method.to_string().as_str());
        if asks && c.args.iter().any(names_a_server) {
            self.flavor_checks
                .insert((line_of(c), format!("`.{}` of a server's name", c.method)));
        }
        syn::visit::visit_expr_method_call(self, c);
    }

    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        // Tests hand servers' names to their fixtures.
        if self.in_test == 0 && c.args.iter().any(names_a_server) {
            self.flavor_checks
                .insert((line_of(c), "a server's name passed to a call".into()));
        }
        syn::visit::visit_expr_call(self, c);
    }

    fn visit_pat(&mut self, p: &'ast syn::Pat) {
        if let syn::Pat::Lit(syn::ExprLit { lit, .. }) = p {
            if names_a_server_lit(lit) {
                self.flavor_checks
                    .insert((line_of(p), "a server's name matched".into()));
            }
        }
        syn::visit::visit_pat(self, p);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.spanned_function(&f.sig.ident, f);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.spanned_function(&f.sig.ident, f);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        self.spanned_function(&f.sig.ident, f);
        syn::visit::visit_trait_item_fn(self, f);
    }
}

fn read<'m>(
    file_modules: &'m BTreeSet<Vec<String>>,
    module: &[String],
    file: &syn::File,
) -> Reading<'m> {
    let mut reading = Reading::new(file_modules, module);
    reading.visit_file(file);
    // A re-export is the module's surface, not its code's need, unless the code names it as well.
    for (name, target) in std::mem::take(&mut reading.reexports) {
        if reading.names_used.contains(&name) {
            reading.code_targets.insert(target);
        }
    }
    reading
}

/// Which file of a module folder imports which: a file by its name (`ring.rs`), a folder inside by its own
/// (`text/`, all its files one), the folder's own `mod.rs`.
type FileGraph = BTreeMap<String, BTreeSet<String>>;

/// The graph of each module folder (`src/stacks/`, `src/stacks/text/`, …), by the folder's module path. What is
/// compiled for tests only is left out: a file's tests may go through its module's front door.
fn file_graphs(sources: &[Source]) -> BTreeMap<Vec<String>, FileGraph> {
    let modules = file_modules(sources);
    let folders: BTreeSet<&Vec<String>> = sources
        .iter()
        .filter(|s| s.path.ends_with("mod.rs"))
        .map(|s| &s.module)
        .collect();
    let readings: Vec<Reading> = sources
        .iter()
        .map(|s| read(&modules, &s.module, &s.file))
        .collect();
    let test_modules: BTreeSet<&Vec<String>> =
        readings.iter().flat_map(|r| &r.test_modules).collect();
    let aliases = aliases(sources, &modules);
    let mut graphs: BTreeMap<Vec<String>, FileGraph> = BTreeMap::new();
    for (source, reading) in sources.iter().zip(&readings) {
        if test_modules.iter().any(|t| source.module.starts_with(t)) {
            continue;
        }
        for folder in folders.iter().filter(|f| source.module.starts_with(f)) {
            let from = node_in(folder, &source.module, &modules, &folders);
            for target in &reading.code_targets {
                let target = through_aliases(target, &aliases);
                if !target.starts_with(folder) {
                    continue;
                }
                let to = node_in(folder, &target, &modules, &folders);
                if to != from {
                    let graph = graphs.entry(folder.to_vec()).or_default();
                    graph.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    graphs
}

/// What each file's own `use` items name (`pub use clean::clean_name` in `symbolize/mod.rs`: `[symbolize,
/// clean_name]` → `[symbolize, clean, clean_name]`), so that a path through them leads to the file that defines it.
fn aliases(
    sources: &[Source],
    modules: &BTreeSet<Vec<String>>,
) -> BTreeMap<Vec<String>, Vec<String>> {
    let mut aliases = BTreeMap::new();
    for source in sources {
        let reading = Reading::new(modules, &source.module);
        for item in &source.file.items {
            let syn::Item::Use(u) = item else { continue };
            let mut paths = Vec::new();
            use_paths(&u.tree, &mut Vec::new(), &mut paths);
            for (name, path) in paths.into_iter().filter(|(name, _)| name != "*") {
                if let Some(target) = reading.resolve(&path, true) {
                    let mut alias = source.module.clone();
                    alias.push(name);
                    aliases.insert(alias, target);
                }
            }
        }
    }
    aliases
}

/// `path` with each prefix that is an alias replaced by what it stands for.
fn through_aliases(path: &[String], aliases: &BTreeMap<Vec<String>, Vec<String>>) -> Vec<String> {
    let mut path = path.to_vec();
    // A chain of re-exports is short; the bound only stops a cycle of them.
    for _ in 0..8 {
        let Some(end) = (1..=path.len()).find(|&end| aliases.contains_key(&path[..end])) else {
            break;
        };
        let mut replaced = aliases[&path[..end]].clone();
        replaced.extend(path[end..].iter().cloned());
        path = replaced;
    }
    path
}

/// The file of `folder` that `path` (inside it) leads to: `[stacks, core, Thread]` → `core.rs`, `[stacks, text, x]`
/// → `text/`, `[stacks, Item]` → `mod.rs`.
fn node_in(
    folder: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
    folders: &BTreeSet<&Vec<String>>,
) -> String {
    let Some(child) = path.get(folder.len()) else {
        return "mod.rs".into();
    };
    let mut child_path = folder.to_vec();
    child_path.push(child.clone());
    if folders.contains(&child_path) {
        format!("{child}/")
    } else if modules.contains(&child_path) {
        format!("{child}.rs")
    } else {
        "mod.rs".into()
    }
}

/// The cycles of `graph`: each strongly connected set of more than one file (Tarjan's), with its arrows.
fn cycles(graph: &FileGraph) -> Vec<Vec<(String, String)>> {
    struct Search<'g> {
        graph: &'g FileGraph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<BTreeSet<&'g str>>,
    }
    impl<'g> Search<'g> {
        fn visit(&mut self, node: &'g str) {
            let order = self.index.len();
            self.index.insert(node, order);
            self.low.insert(node, order);
            self.stack.push(node);
            for next in self.graph.get(node).into_iter().flatten() {
                if !self.index.contains_key(next.as_str()) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next.as_str()]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next.as_str()) {
                    let low = self.low[node].min(self.index[next.as_str()]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let at = self.stack.iter().rposition(|n| *n == node).unwrap();
                let set: BTreeSet<&str> = self.stack.drain(at..).collect();
                if set.len() > 1 {
                    self.found.push(set);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !search.index.contains_key(node.as_str()) {
            search.visit(node);
        }
    }
    let arrows_within = |set: &BTreeSet<&str>| {
        let mut arrows = Vec::new();
        for from in set {
            for to in graph.get(*from).into_iter().flatten() {
                if set.contains(to.as_str()) {
                    arrows.push((from.to_string(), to.clone()));
                }
            }
        }
        arrows
    };
    search.found.iter().map(arrows_within).collect()
}

#[test]
fn each_module_imports_only_the_layers_below_its_own() {
    let layer_of = layers();
    let sources = sources();
    let modules = file_modules(&sources);
    let mut broken = Vec::new();
    let mut unplaced = BTreeSet::new();
    for source in &sources {
        let module = source.top();
        let Some(&own) = layer_of.get(module) else {
            unplaced.insert(module.to_string());
            continue;
        };
        for import in read(&modules, &source.module, &source.file).imports() {
            if import == module {
                continue;
            }
            match layer_of.get(&import) {
                Some(&layer) if layer < own => {}
                Some(&layer) => broken.push(format!(
                    "{} (layer {own}) imports {import} (layer {layer})",
                    source.path.display()
                )),
                None => {
                    unplaced.insert(import);
                }
            };
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules on no layer of ARCHITECTURE.md's table: {unplaced:?}"
    );
    assert!(
        broken.is_empty(),
        "imports that break the layers of ARCHITECTURE.md:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_files_of_a_module_import_each_other_without_a_cycle() {
    let mut found = Vec::new();
    for (folder, graph) in file_graphs(&sources()) {
        let folder = format!("src/{}/", folder.join("/"));
        for cycle in cycles(&graph) {
            let arrows: Vec<String> = cycle.iter().map(|(a, b)| format!("{a} → {b}")).collect();
            let cycle = format!("{folder}: {}", arrows.join(", "));
            found.push(cycle);
        }
    }
    assert!(
        found.is_empty(),
        "files of one module that import each other in a cycle:\n{}",
        found.join("\n")
    );
}

#[test]
fn only_server_asks_which_server_it_is() {
    let sources = sources();
    let modules = file_modules(&sources);
    let mut found = Vec::new();
    for source in sources.iter().filter(|s| s.top() != "server") {
        for (line, check) in read(&modules, &source.module, &source.file).flavor_checks {
            found.push(format!("{}:{line}: {check}", source.path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "what differs between servers belongs in src/server/:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let sources = sources();
    let modules = file_modules(&sources);
    let tests = test_files();
    let files = sources
        .iter()
        .map(|s| (&s.path, &s.file, s.module.clone()))
        .chain(tests.iter().map(|(path, file)| (path, file, Vec::new())));
    let mut found = Vec::new();
    for (path, file, module) in files {
        for (name, line, lines) in read(&modules, &module, file).long_functions {
            found.push(format!("{}:{line} {name}: {lines} lines", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "functions of more than {MAX_FUNCTION_LINES} lines:\n{}",
        found.join("\n")
    );
}

/// Each check above, shown failing on a small input made to break it.
mod the_checks_fail {
    use super::*;

    fn source(path: &str, text: &str) -> Source {
        let path = PathBuf::from(path);
        Source {
            module: module_path(path.strip_prefix("src").unwrap()),
            file: syn::parse_file(text).unwrap(),
            path,
        }
    }

    fn arrows(cycle: &[(&str, &str)]) -> Vec<(String, String)> {
        cycle
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn on_files_that_import_each_other_in_a_cycle() {
        let sources = [
            source(
                "src/m/mod.rs",
                "mod a; mod b; mod c; mod n; fn f() -> b::B { todo!() }",
            ),
            source("src/m/a.rs", "pub struct A;"),
            source(
                "src/m/b.rs",
                "use super::a::A; pub struct B(A); fn g() { crate::m::c::h() }",
            ),
            source("src/m/c.rs", "pub fn h() { super::f(); }"),
            source(
                "src/m/n/mod.rs",
                "mod x; mod y; use self::x::X; pub struct N;",
            ),
            source(
                "src/m/n/x.rs",
                "pub struct X; fn k() { super::super::a::A; super::y::Y; }",
            ),
            source("src/m/n/y.rs", "pub struct Y(super::N);"),
        ];
        let graphs = file_graphs(&sources);
        let m = cycles(&graphs[&vec!["m".to_string()]]);
        let expected = [("b.rs", "c.rs"), ("c.rs", "mod.rs"), ("mod.rs", "b.rs")];
        assert_eq!(m, [arrows(&expected)]);
        // A folder inside is one file of its parent's graph (n/ → a.rs), and a graph of its own.
        assert!(graphs[&vec!["m".to_string()]]["n/"].contains("a.rs"));
        let n = cycles(&graphs[&vec!["m".to_string(), "n".to_string()]]);
        let expected = [("mod.rs", "x.rs"), ("x.rs", "y.rs"), ("y.rs", "mod.rs")];
        assert_eq!(n, [arrows(&expected)]);
    }

    #[test]
    fn not_on_tests_re_exports_or_a_path_through_them() {
        let sources = [
            source(
                "src/m/mod.rs",
                "mod a; #[cfg(test)] mod support; pub use a::{A, Other}; pub(crate) fn f() {} \
                 #[cfg(test)] mod tests { use super::a::helper; }",
            ),
            // `super::A` is a.rs's, through mod.rs's re-export; `pub(super)` says who sees it, not what it needs.
            source(
                "src/m/a.rs",
                "pub(super) struct A; pub struct Other; fn g() -> super::A { super::f(); A }",
            ),
            source("src/m/support.rs", "use super::a::A; fn s() { super::f() }"),
        ];
        let graphs = file_graphs(&sources);
        let m = &graphs[&vec!["m".to_string()]];
        assert!(cycles(m).is_empty(), "{m:?}");
        assert_eq!(m["a.rs"], BTreeSet::from(["mod.rs".to_string()]));
        // The re-export counts where the file's own code names it.
        let named = source("src/m/mod.rs", "mod a; pub use a::A; fn f() -> A { A }");
        let graphs = file_graphs(&[
            named,
            source("src/m/a.rs", "pub struct A; fn g() { super::f() }"),
        ]);
        assert_eq!(cycles(&graphs[&vec!["m".to_string()]]).len(), 1);
    }

    #[test]
    fn on_a_flavor_asked_in_a_macro_or_a_match() {
        let file = syn::parse_file(
            r#"
            fn f(flavor: Flavor, name: &str) {
                assert!(matches!(flavor, Flavor::MariaDb));
                let _ = matches!(name, "mysql" | "other");
                match name { "MariaDB" => {} _ => {} }
                if let Some(b"Percona Server") = None::<&[u8; 14]> {}
                say!("{}", name == "MySQL");
                let _ = vec![Flavor::MySql; 2];
                let _ = binary_contains(b"Percona Server");
                let _ = matches!(name, "fixture") && name.contains("another");
            }
            "#,
        )
        .unwrap();
        let checks = read(&BTreeSet::new(), &[], &file).flavor_checks;
        let lines: BTreeSet<usize> = checks.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, BTreeSet::from([3, 4, 5, 6, 7, 8, 9]), "{checks:?}");
    }

    #[test]
    fn on_a_long_function_in_a_test_or_a_macro() {
        let body = "let _ = 1;\n".repeat(MAX_FUNCTION_LINES);
        let text = format!(
            "#[test]\nfn long() {{\n{body}}}\n\
             proptest! {{\n#[test]\nfn long_property(x in 0..1u8) {{\n{body}}}\n}}\n\
             fn short() {{}}\n\
             proptest! {{\n#[test]\nfn short_property(x in 0..1u8) {{}}\n}}\n"
        );
        let file = syn::parse_file(&text).unwrap();
        let long = read(&BTreeSet::new(), &[], &file).long_functions;
        let names: Vec<&str> = long.iter().map(|(name, ..)| name.as_str()).collect();
        assert_eq!(names, ["long", "long_property"]);
    }
}
